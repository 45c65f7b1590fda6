package controller

import (
	"context"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/history"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// When the store's figures are read: every agent reads them alike (see
// status.Figures), so that a change of leader resets nothing.

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
	timeline := ""
	if m := obs.Self.Member; m != nil {
		timeline = m.ClusterToken
	}
	got, err := lp.figures.Read(ctx, s, lp.log, timeline)
	if err != nil {
		lp.log.Warn("cannot read the newest backups for the metrics", "error", err)
		return
	}
	newest := got.Newest
	lp.newestStored, lp.drillable = newest, got.Drillable
	lp.drillRecord, lp.drillRecordErr = got.Drills, got.DrillsErr
	point, err := history.NewestPoint(ctx, s, timeline, newest, lp.cfg.Capture.Enabled)
	if err != nil {
		lp.log.Warn("cannot read the captured revisions for the metrics", "error", err)
	}
	lp.historyMet.Show(point)
	lp.restorable = point
}
