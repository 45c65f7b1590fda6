package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// pointFlags are restore-backup's point-in-time flags.
type pointFlags struct {
	latest        bool
	toRevision    int64
	toTime        string
	timeline      string
	bump          int64
	markCompacted bool
	// requireDigest refuses a point no digest checks.
	requireDigest bool
	// keyFiles hold the keys to read encrypted segments with, which
	// --to-time needs to find its revision.
	keyFiles []string
}

// keyring reads the key files given, nil when there are none.
func (p pointFlags) keyring() (*crypt.Keyring, error) {
	var keys []*crypt.Key
	for _, f := range p.keyFiles {
		k, err := crypt.LoadKeyFile(f)
		if err != nil {
			return nil, fmt.Errorf("--backup-decryption-key-file: %w", err)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return crypt.NewKeyring(nil, keys...), nil
}

// target reports whether a point to restore to is given.
func (p pointFlags) target() bool { return p.latest || p.toRevision != 0 || p.toTime != "" }

// resolvePoint turns the flags into the backup to restore and how far to
// bring it forward, refusing what cannot be reached before anything is
// queued. With no target it returns name as it is.
func resolvePoint(ctx context.Context, s *store.Store, name string, pf pointFlags) (string, spec.RestorePoint, error) {
	point := spec.RestorePoint{BumpRevision: pf.bump, MarkCompacted: pf.markCompacted}
	n := 0
	for _, set := range []bool{pf.latest, pf.toRevision != 0, pf.toTime != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return "", point, errors.New("give only one of --latest, --to-revision and --to-time")
	}
	if pf.toRevision < 0 {
		return "", point, fmt.Errorf("--to-revision %d: revisions start at 1", pf.toRevision)
	}
	if len(pf.keyFiles) > 0 && pf.toTime == "" {
		return "", point, errors.New("--backup-decryption-key-file is only for --to-time, which reads the times inside captured segments; the agents decrypt the rest with their own keys")
	}
	keys, err := pf.keyring()
	if err != nil {
		return "", point, err
	}
	if n == 0 {
		if pf.timeline != "" {
			return "", point, errors.New("--timeline needs --latest, --to-revision or --to-time")
		}
		return name, point, point.Validate()
	}
	infos, err := backup.List(ctx, s)
	if err != nil {
		return "", point, err
	}
	timeline := pf.timeline
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
	var at time.Time
	if pf.toTime != "" {
		if at, err = time.Parse(time.RFC3339Nano, pf.toTime); err != nil {
			return "", point, fmt.Errorf("--to-time %q: want RFC3339, as 2026-11-22T05:07:30Z: %w", pf.toTime, err)
		}
	}
	// The newest point is the timeline's own: no history to read.
	history := []changelog.Link{{Timeline: timeline}}
	if !pf.latest {
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
		if br != nil && !pf.latest {
			switch {
			case pf.toRevision > br.Revision && pf.toRevision < br.Start():
				return "", point, fmt.Errorf("%w: revisions %d to %d do not exist: timeline %s starts at revision %d, restored from revision %d of timeline %s with --bump-revision=%d",
					changelog.ErrRange, br.Revision+1, br.Start()-1, br.Timeline, br.Start(), br.Revision, br.Parent, br.BumpRevision)
			case pf.toRevision > 0 && pf.toRevision <= br.Revision, pf.toTime != "" && at.Before(br.Time):
				limit = br.Revision
				continue
			}
		}
		// A time after the timeline began, before its oldest backup kept,
		// is refused: clients may have written to it by then, and
		// retention may have removed its early backups. Only a time
		// before the branch is the parent's.
		return resolveOn(ctx, s, infos, link.Timeline, name, pf, at, limit, point, keys)
	}
	return "", point, fmt.Errorf("%w: %s is before the oldest backup of timeline %s and of every timeline it was restored from", changelog.ErrRange, targetString(pf), timeline)
}

// errBeforeBackups means a target lies before a timeline's oldest backup.
var errBeforeBackups = errors.New("before the oldest backup")

// beganNote says when a restored timeline began, for a refusal of a time
// after that but before its oldest backup kept.
func beganNote(ctx context.Context, s *store.Store, timeline string) string {
	b, ok, err := changelog.ReadBranch(ctx, s, timeline)
	if err != nil || !ok {
		return ""
	}
	return fmt.Sprintf("; the timeline began at %s, restored from revision %d of timeline %s: a time before that resolves there, "+
		"and what clients wrote between then and its oldest backup kept cannot be restored", rfcTime(b.Time), b.Revision, b.Parent)
}

func targetString(pf pointFlags) string {
	if pf.toTime != "" {
		return "--to-time " + pf.toTime
	}
	return fmt.Sprintf("revision %d", pf.toRevision)
}

// resolveOn resolves the target on one timeline; limit, when set, is the
// last revision of it that belongs to the history (a newer timeline
// branched there).
func resolveOn(ctx context.Context, s *store.Store, infos []backup.Info, timeline, name string, pf pointFlags, at time.Time, limit int64, point spec.RestorePoint, keys *crypt.Keyring) (string, spec.RestorePoint, error) {
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
	case pf.latest:
		to = lastRev
	case pf.toRevision > 0:
		to = pf.toRevision
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
					"give --to-revision, or restore a backup by name (list-backups --ranges)", changelog.ErrRange, pf.toTime, timeline, prev.Last+1, next.First-1,
					rfcTime(prev.LastTime), rfcTime(next.FirstTime))
			}
		}
		rev, _, err := changelog.RevisionAt(ctx, s, timeline, at, keys)
		var nk *crypt.NoKeyError
		if errors.As(err, &nk) {
			return "", point, fmt.Errorf("--to-time %s: the revision captured at that time is found from the times inside the captured segments, and %v: "+
				"give etcd-manager-ctl --backup-decryption-key-file with key %s, or restore with --to-revision (list-backups --ranges shows what each timeline holds); nothing was queued",
				pf.toTime, err, nk.KeyID)
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
						"so whether its snapshot held writes made after that time is not known; restore it by name, or give --to-revision", changelog.ErrRange, pf.toTime, in.Name)
				}
			}
			return "", point, fmt.Errorf("%w: %w: --to-time %s is before the oldest backup kept of timeline %s (%s, at %s)%s", changelog.ErrRange, errBeforeBackups, pf.toTime, timeline,
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

// timelineRange is what a restore can reach on one timeline.
type timelineRange struct {
	Timeline string `json:"timeline"`
	// Earliest is the oldest full backup's point; Latest the last
	// captured revision, or the newest backup's when it is later.
	EarliestRevision int64     `json:"earliestRevision"`
	EarliestTime     time.Time `json:"earliestTime"`
	LatestRevision   int64     `json:"latestRevision"`
	LatestTime       time.Time `json:"latestTime"`
	Backups          int       `json:"backups"`
	// Branch says where a restore started the timeline from another.
	Branch *changelog.Branch `json:"branch,omitempty"`
	// BranchError says why the branch record cannot be read.
	BranchError string   `json:"branchError,omitempty"`
	Runs        []runRow `json:"runs"`
	// Restorable are the stretches of revisions the kept backups reach
	// through the runs; Gaps the holes between them.
	Restorable []changelog.Span `json:"restorable"`
	Gaps       []changelog.Gap  `json:"gaps"`
}

type runRow struct {
	Base      string    `json:"base,omitempty"`
	First     int64     `json:"first"`
	Last      int64     `json:"last"`
	FirstTime time.Time `json:"firstTime"`
	LastTime  time.Time `json:"lastTime"`
}

// ranges reads every timeline's restorable range.
func ranges(ctx context.Context, s *store.Store) ([]timelineRange, error) {
	infos, err := backup.List(ctx, s)
	if err != nil {
		return nil, err
	}
	tls, err := changelog.Timelines(ctx, s)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var order []string
	for _, in := range infos {
		if t := in.Meta.ClusterToken; t != "" && !seen[t] {
			seen[t] = true
			order = append(order, t)
		}
	}
	for _, t := range tls {
		if !seen[t] {
			seen[t] = true
			order = append(order, t)
		}
	}
	var out []timelineRange
	for _, t := range order {
		r := timelineRange{Timeline: t, Runs: []runRow{}, Restorable: []changelog.Span{}, Gaps: []changelog.Gap{}}
		if b, ok, err := changelog.ReadBranch(ctx, s, t); err != nil {
			r.BranchError = err.Error()
		} else if ok {
			r.Branch = &b
		}
		var revs []int64
		at := map[int64]time.Time{} // when each reachable end held
		for _, in := range infos {
			if in.Meta.ClusterToken != t {
				continue
			}
			rev := changelog.SnapshotRevision(in.Meta.Revision)
			if r.Backups == 0 {
				r.EarliestRevision, r.EarliestTime = rev, in.Meta.PointTime().UTC()
			}
			revs = append(revs, rev)
			at[rev] = in.Meta.PointTime().UTC()
			r.Backups++
		}
		runs, err := changelog.Runs(ctx, s, t)
		if err != nil {
			return nil, err
		}
		for _, run := range runs {
			row := runRow{First: run.First, Last: run.Last, FirstTime: run.FirstTime.UTC(), LastTime: run.LastTime.UTC()}
			if run.Base != nil {
				row.Base = run.Base.Backup
			}
			r.Runs = append(r.Runs, row)
			at[run.Last] = run.LastTime.UTC()
		}
		// What the kept backups reach, not what the runs hold: a run
		// whose base backup retention removed is reachable only from a
		// kept backup inside it.
		if spans := changelog.Reachable(runs, revs); spans != nil {
			r.Restorable = spans
		}
		if n := len(r.Restorable); n > 0 {
			r.LatestRevision = r.Restorable[n-1].To
			r.LatestTime = at[r.LatestRevision]
		}
		r.Gaps = append(r.Gaps, changelog.Holes(r.Restorable)...)
		out = append(out, r)
	}
	return out, nil
}

// listRanges prints every timeline's restorable range.
func listRanges(ctx context.Context, s *store.Store, w io.Writer, asJSON bool) error {
	rs, err := ranges(ctx, s)
	if err != nil {
		return err
	}
	if rs == nil {
		rs = []timelineRange{}
	}
	if asJSON {
		return writeJSON(w, rs)
	}
	for _, r := range rs {
		fprintf(w, "timeline %s: %d full backups; restorable from revision %d (%s) to revision %d (%s)\n", r.Timeline, r.Backups,
			r.EarliestRevision, rfcTime(r.EarliestTime), r.LatestRevision, rfcTime(r.LatestTime))
		if b := r.Branch; b != nil {
			bump := ""
			if b.BumpRevision > 0 {
				bump = fmt.Sprintf(", revisions bumped by %d to start at %d", b.BumpRevision, b.Start())
			}
			fprintf(w, "  branched from timeline %s at its revision %d (restored %s from backup %s%s)\n", b.Parent, b.Revision, rfcTime(b.Time), dash(b.Backup), bump)
		}
		if r.BranchError != "" {
			fprintf(w, "  branch record unreadable: %s\n", r.BranchError)
		}
		for _, run := range r.Runs {
			fprintf(w, "  captured revisions %d to %d (%s to %s), after backup %s\n", run.First, run.Last, rfcTime(run.FirstTime), rfcTime(run.LastTime), dash(run.Base))
		}
		for _, g := range r.Gaps {
			fprintf(w, "  gap: revisions %d to %d cannot be restored\n", g.After+1, g.Before-1)
		}
	}
	return nil
}

// summarizeRanges writes one line per timeline with captured changes.
func summarizeRanges(ctx context.Context, s *store.Store, w io.Writer) {
	rs, err := ranges(ctx, s)
	if err != nil {
		fprintf(w, "cannot read the captured ranges: %v\n", err)
		return
	}
	for _, r := range rs {
		if len(r.Runs) == 0 || r.Backups == 0 {
			continue
		}
		fprintf(w, "timeline %s: restorable to any revision from %d (%s) to %d (%s), %d gaps (list-backups --ranges)\n",
			r.Timeline, r.EarliestRevision, rfcTime(r.EarliestTime), r.LatestRevision, rfcTime(r.LatestTime), len(r.Gaps))
	}
}

func rfcTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
