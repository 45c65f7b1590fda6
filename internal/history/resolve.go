package history

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Store is the part of the backup store the history reads.
type Store interface {
	backup.Store
	changelog.Store
}

// Target is a point of the history to restore to: the newest point
// (Latest), a revision, or the state at a time; one at most. Errors name
// them as etcd-manager-ctl restore-backup's flags do.
type Target struct {
	Latest   bool
	Revision int64
	Time     time.Time
	// Timeline is the history to search, by its cluster token; empty:
	// the named backup's, or the newest backup's.
	Timeline string
	// Keys decrypt captured segments, whose times a Time target reads.
	Keys *crypt.Keyring
}

// Set reports whether the target names a point at all.
func (t Target) Set() bool { return t.Latest || t.Revision != 0 || !t.Time.IsZero() }

// Validate reports a target that names more than one point, or a
// revision before the first.
func (t Target) Validate() error {
	n := 0
	for _, set := range []bool{t.Latest, t.Revision != 0, !t.Time.IsZero()} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return errors.New("history: a target is the newest point, a revision or a time, not more than one")
	case t.Revision < 0:
		return fmt.Errorf("history: revision %d: revisions start at 1", t.Revision)
	case t.Timeline != "" && n == 0:
		return fmt.Errorf("history: timeline %s without a point on it", t.Timeline)
	}
	return nil
}

// Resolve finds the backup to restore and how far to bring it forward
// for target, refusing what the history cannot reach before anything is
// queued: name, when given, is the backup to start from; point carries
// the caller's other settings (bump, mark-compacted) and comes back with
// the revision and timeline to reach, when the backup alone does not.
func Resolve(ctx context.Context, s Store, name string, t Target, point spec.RestorePoint) (string, spec.RestorePoint, error) {
	if err := t.Validate(); err != nil {
		return "", point, err
	}
	if !t.Set() {
		return name, point, point.Validate()
	}
	infos, err := backup.List(ctx, s)
	if err != nil {
		return "", point, err
	}
	timeline := t.Timeline
	switch {
	case timeline != "":
	case name != "":
		// A named backup's own history.
		meta, err := backup.ReadMeta(ctx, s, name)
		if err != nil {
			return "", point, err
		}
		if timeline = meta.ClusterToken; timeline == "" {
			return "", point, fmt.Errorf("backup %s records no cluster token (an older etcd-manager or kops wrote it): it cannot be brought forward", name)
		}
	case len(infos) == 0:
		return "", point, errors.New("the store holds no full backup to start from")
	default:
		// The current cluster's history: the newest backup's.
		timeline = infos[len(infos)-1].Meta.ClusterToken
		if timeline == "" {
			return "", point, fmt.Errorf("the newest backup, %s, records no cluster token (an older etcd-manager or kops wrote it); name the timeline with --timeline (see list-backups)", infos[len(infos)-1].Name)
		}
	}
	if !changelog.ValidTimeline(timeline) {
		return "", point, fmt.Errorf("--timeline %q is not a cluster token", timeline)
	}
	// The newest point is the timeline's own: no history to read.
	history := []changelog.Link{{Timeline: timeline}}
	if !t.Latest {
		if history, err = changelog.History(ctx, s, timeline); err != nil {
			return "", point, err
		}
	}
	// Follow the history back, through the restores that made each
	// timeline, to the one that holds the target. On an older timeline,
	// only its points up to where the newer one branched are history.
	var limit int64
	for _, link := range history {
		br := link.Branch
		if br != nil && !t.Latest {
			switch {
			case t.Revision > br.Revision && t.Revision < br.Start():
				return "", point, fmt.Errorf("%w: revisions %d to %d do not exist: timeline %s starts at revision %d, restored from revision %d of timeline %s with --bump-revision=%d",
					changelog.ErrRange, br.Revision+1, br.Start()-1, br.Timeline, br.Start(), br.Revision, br.Parent, br.BumpRevision)
			case t.Revision > 0 && t.Revision <= br.Revision, !t.Time.IsZero() && t.Time.Before(br.Time):
				limit = br.Revision
				continue
			}
		}
		// A time after the timeline began, before its oldest backup kept,
		// is refused: clients may have written to it by then, and
		// retention may have removed its early backups. Only a time
		// before the branch is the parent's.
		return resolveOn(ctx, s, infos, link.Timeline, name, t, limit, point)
	}
	return "", point, fmt.Errorf("%w: %s is before the oldest backup of timeline %s and of every timeline it was restored from", changelog.ErrRange, t.String(), timeline)
}

// errBeforeBackups means a target lies before a timeline's oldest backup.
var errBeforeBackups = errors.New("before the oldest backup")

// beganNote says when a restored timeline began, for a refusal of a time
// after that but before its oldest backup kept.
func beganNote(ctx context.Context, s Store, timeline string) string {
	b, ok, err := changelog.ReadBranch(ctx, s, timeline)
	if err != nil || !ok {
		return ""
	}
	return fmt.Sprintf("; the timeline began at %s, restored from revision %d of timeline %s: a time before that resolves there, "+
		"and what clients wrote between then and its oldest backup kept cannot be restored", rfcTime(b.Time), b.Revision, b.Parent)
}

// String names the target as restore-backup's flags do.
func (t Target) String() string {
	if !t.Time.IsZero() {
		return "--to-time " + rfcTime(t.Time)
	}
	return fmt.Sprintf("revision %d", t.Revision)
}

// resolveOn resolves the target on one timeline; limit, when set, is the
// last revision of it that belongs to the history (a newer timeline
// branched there).
func resolveOn(ctx context.Context, s Store, infos []backup.Info, timeline, name string, t Target, limit int64, point spec.RestorePoint) (string, spec.RestorePoint, error) {
	at := t.Time
	var own []backup.Info
	for _, in := range infos {
		if in.Meta.ClusterToken == timeline {
			in.Meta.Revision = changelog.SnapshotRevision(in.Meta.Revision)
			own = append(own, in)
		}
	}
	if len(own) == 0 {
		return "", point, fmt.Errorf("%w: timeline %s has no full backup (see list-backups)", errBeforeBackups, timeline)
	}
	runs, err := changelog.Runs(ctx, s, timeline)
	if err != nil {
		return "", point, err
	}
	newest := own[len(own)-1]
	lastRev, lastTime := newest.Meta.Revision, newest.Meta.PointTime()
	if len(runs) > 0 && runs[len(runs)-1].Last > lastRev {
		lastRev, lastTime = runs[len(runs)-1].Last, runs[len(runs)-1].LastTime
	}

	var to int64
	switch {
	case t.Latest:
		to = lastRev
	case t.Revision > 0:
		to = t.Revision
	case limit > 0 && at.After(lastTime):
		// Capture of this timeline ended before the restore that
		// replaced it; the history's state then is this timeline's last.
		to = min(lastRev, limit)
	default:
		if at.After(lastTime) {
			return "", point, fmt.Errorf("%w: --to-time %s is after the last captured point of timeline %s (revision %d at %s); use --latest",
				changelog.ErrRange, at.UTC().Format(time.RFC3339Nano), timeline, lastRev, lastTime.UTC().Format(time.RFC3339Nano))
		}
		// A moment between two runs, while capture was not following,
		// has no known state: the revisions of the gap were committed at
		// times no record says.
		for i := 1; i < len(runs); i++ {
			prev, next := runs[i-1], runs[i]
			if next.First > prev.Last+1 && prev.LastTime.Before(at) && at.Before(next.FirstTime) {
				return "", point, fmt.Errorf("%w: --to-time %s falls in a gap of capture on timeline %s: revisions %d to %d were not captured, and capture was not following between %s and %s; "+
					"give --to-revision, or restore a backup by name (list-backups --ranges)", changelog.ErrRange, rfcTime(at), timeline, prev.Last+1, next.First-1,
					rfcTime(prev.LastTime), rfcTime(next.FirstTime))
			}
		}
		rev, _, err := changelog.RevisionAt(ctx, s, timeline, at, t.Keys)
		var nk *crypt.NoKeyError
		if errors.As(err, &nk) {
			return "", point, fmt.Errorf("--to-time %s: the revision captured at that time is found from the times inside the captured segments, and %v: "+
				"give etcd-manager-ctl --backup-decryption-key-file with key %s, or restore with --to-revision (list-backups --ranges shows what each timeline holds); nothing was queued",
				rfcTime(at), err, nk.KeyID)
		}
		if err != nil {
			return "", point, err
		}
		// A backup's revision counts only by the precise time its
		// snapshot was whole: its Timestamp, in whole seconds before the
		// snapshot, could raise the target past writes made after at.
		for _, in := range own {
			if in.Meta.SnapshotTime > 0 && !in.Meta.PointTime().After(at) {
				rev = max(rev, in.Meta.Revision)
			}
		}
		if rev == 0 {
			for i := len(own) - 1; i >= 0; i-- {
				if in := own[i]; in.Meta.SnapshotTime == 0 && !in.Meta.PointTime().After(at) {
					return "", point, fmt.Errorf("%w: --to-time %s: no change was captured at or before it, and backup %s records only the second it began (an older etcd-manager or kops took it), "+
						"so whether its snapshot held writes made after that time is not known; restore it by name, or give --to-revision", changelog.ErrRange, rfcTime(at), in.Name)
				}
			}
			return "", point, fmt.Errorf("%w: %w: --to-time %s is before the oldest backup kept of timeline %s (%s, at %s)%s", changelog.ErrRange, errBeforeBackups, rfcTime(at), timeline,
				own[0].Name, rfcTime(own[0].Meta.PointTime()), beganNote(ctx, s, timeline))
		}
		to = rev
		if limit > 0 {
			to = min(to, limit)
		}
	}
	if to > lastRev {
		return "", point, fmt.Errorf("%w: revision %d is after the last captured revision of timeline %s, %d (at %s)", changelog.ErrRange, to, timeline, lastRev, lastTime.UTC().Format(time.RFC3339Nano))
	}

	var base *backup.Info
	if name != "" {
		meta, err := backup.ReadMeta(ctx, s, name)
		if err != nil {
			return "", point, err
		}
		meta.Revision = changelog.SnapshotRevision(meta.Revision)
		if meta.ClusterToken != timeline || meta.Revision > to {
			return "", point, fmt.Errorf("backup %s (timeline %s, revision %d) cannot be brought to revision %d of timeline %s", name, meta.ClusterToken, meta.Revision, to, timeline)
		}
		base = &backup.Info{Name: name, Meta: meta}
	} else {
		for i := len(own) - 1; i >= 0; i-- {
			if own[i].Meta.Revision <= to {
				base = &own[i]
				break
			}
		}
		if base == nil {
			return "", point, fmt.Errorf("%w: %w: revision %d is before the oldest backup of timeline %s (%s, revision %d)", changelog.ErrRange, errBeforeBackups, to, timeline, own[0].Name, own[0].Meta.Revision)
		}
	}
	if err := changelog.CheckReach(runs, base.Meta.Revision, to); err != nil {
		return "", point, err
	}
	if to > base.Meta.Revision {
		point.ToRevision, point.Timeline = to, timeline
	}
	return base.Name, point, point.Validate()
}

func rfcTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
