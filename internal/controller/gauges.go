package controller

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/history"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// The figures the agent exports beside its own counters: the cluster as
// the leader sees it, and the backup figures every agent reads from the
// store alike, so that a change of leader resets nothing.

// storeFiguresEvery is how often each agent reads the backup figures at
// most: every lease (20 s by default), a listing of the store's top level
// and one meta.
const storeFiguresEvery = time.Minute

// storeFiguresTimeout bounds those reads, which the loop waits for.
const storeFiguresTimeout = 10 * time.Second

// storeFigures reads, every storeFiguresEvery, the newest backup and the
// newest captured revision of this node's cluster from the store.
func (lp *loop) storeFigures(ctx context.Context, s *store.Store, obs plan.Observed) {
	if s == nil || obs.StoreErr != nil || lp.now().Sub(lp.lastStoreFigures) < min(storeFiguresEvery, lp.cfg.LeaderLease) {
		return
	}
	lp.lastStoreFigures = lp.now()
	ctx, cancel := context.WithTimeout(ctx, storeFiguresTimeout)
	defer cancel()
	newest, err := lp.newestOfEachKind(ctx, s)
	if err != nil {
		lp.log.Warn("cannot read the newest backups for the metrics", "error", err)
		return
	}
	lp.newestStored = newest
	lp.recordFigures(ctx, s)
	if newest != nil {
		lp.met.backupLastOK.Set(float64(int64(newest.Meta.Timestamp)))
	}
	timeline := ""
	if m := obs.Self.Member; m != nil {
		timeline = m.ClusterToken
	}
	point, err := history.NewestPoint(ctx, s, timeline, newest, lp.cfg.Capture.Enabled)
	if err != nil {
		lp.log.Warn("cannot read the captured revisions for the metrics", "error", err)
	}
	lp.historyMet.Show(point)
	lp.restorable = point
}

// Bounds of newestOfEachKind: the newest names it looks at, and the metas it
// reads at most in one pass (a meta, once written, never changes, so the
// ones read are kept).
const (
	figuresNames     = 50
	figuresMetaReads = 10
	// figuresUnfinished is the age past which a backup without a valid
	// meta is taken as one that never will have one.
	figuresUnfinished = time.Hour
)

// newestOfEachKind sets the figures of the newest backup of each kind from
// the newest figuresNames backups, and returns the newest of all.
func (lp *loop) newestOfEachKind(ctx context.Context, s *store.Store) (*backup.Info, error) {
	names, err := backup.Names(ctx, s)
	if err != nil {
		return nil, err
	}
	names = names[max(0, len(names)-figuresNames):]
	kept := make(map[string]*backup.Meta, len(names))
	seen := map[string]bool{}
	var newest *backup.Info
	reads := 0
	for i := len(names) - 1; i >= 0; i-- {
		name := names[i]
		cached, ok := lp.metaCache[name]
		if !ok {
			if reads == figuresMetaReads {
				continue
			}
			reads++
			meta, err := backup.ReadMeta(ctx, s, name)
			switch {
			case errors.Is(err, backup.ErrNotFound) || errors.Is(err, backup.ErrCorrupt):
				// Being written, or no backup: once its name is old
				// enough for any upload to have ended, never read again.
				if at, perr := time.Parse("2006-01-02T15:04:05Z", name[:min(len(name), 20)]); perr == nil && lp.now().Sub(at) > figuresUnfinished {
					kept[name] = nil
				}
				continue
			case err != nil:
				return nil, err
			}
			cached = &meta
		}
		kept[name] = cached
		if cached == nil {
			continue
		}
		meta := *cached
		if newest == nil {
			newest = &backup.Info{Name: name, Meta: meta}
		}
		kind := meta.Kind
		if !spec.ValidBackupKind(kind) {
			kind = "other"
		}
		if !seen[kind] {
			seen[kind] = true
			lp.met.backupFigures(meta)
		}
	}
	lp.metaCache = kept
	// A kind not among the newest backups has no figures any more.
	for _, kind := range append(slices.Clone(spec.BackupKinds), "other") {
		if !seen[kind] {
			lp.met.backupDuration.DeleteLabelValues(kind)
			lp.met.backupSize.DeleteLabelValues(kind)
		}
	}
	return newest, nil
}

// recordFigures reads the last failed backup and the restore drills'
// record from the store.
func (lp *loop) recordFigures(ctx context.Context, s *store.Store) {
	f, err := s.ReadBackupFailure(ctx)
	switch {
	case err != nil:
		lp.log.Warn("cannot read the last failed backup for the metrics", "error", err)
	case f != nil:
		lp.met.backupLastFailure.Set(float64(f.Time.Unix()))
	}
	d, err := s.ReadDrills(ctx)
	lp.drillRecord, lp.drillRecordErr = d, err
	switch {
	case err != nil:
		lp.log.Warn("cannot read the restore drills' record", "error", err)
	case d != nil:
		lp.met.drillFigures(d)
	}
}
