package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/history"
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
func (p pointFlags) keyring() (*crypt.Keyring, error) { return loadKeyring(p.keyFiles) }

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
	if n == 0 && pf.timeline != "" {
		return "", point, errors.New("--timeline needs --latest, --to-revision or --to-time")
	}
	t := history.Target{Latest: pf.latest, Revision: pf.toRevision, Timeline: pf.timeline, Keys: keys}
	if pf.toTime != "" {
		if t.Time, err = time.Parse(time.RFC3339Nano, pf.toTime); err != nil {
			return "", point, fmt.Errorf("--to-time %q: want RFC3339, as 2026-11-22T05:07:30Z: %w", pf.toTime, err)
		}
		if t.Time.IsZero() {
			return "", point, fmt.Errorf("--to-time %q: before any backup could be taken", pf.toTime)
		}
	}
	return history.Resolve(ctx, s, name, t, point)
}

// listRanges prints every timeline's restorable range.
func (o *options) listRanges(ctx context.Context, s *store.Store, w io.Writer) error {
	rs, err := history.Ranges(ctx, s)
	if err != nil {
		return err
	}
	if rs == nil {
		rs = []history.Range{}
	}
	if o.structured() {
		return o.emit(w, rs, nil)
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
	rs, err := history.Ranges(ctx, s)
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
