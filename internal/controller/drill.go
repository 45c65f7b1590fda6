package controller

import (
	"context"
	"errors"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/drill"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Restore drills: every --restore-drill-interval the leader restores the
// newest backup into a scratch etcd on loopback in its tmp/ folder, and
// checks the restored revision and HashKV against the backup's meta. The
// cluster is not touched. The outcome goes to the store (so that every
// agent reports it), the metrics and the event history.

// drillClock follows the lead for the drills' schedule.
type drillClock struct {
	// leadSince is when this agent began to lead, lostSince when it last
	// saw no cluster to lead, started when it last started a drill.
	leadSince, lostSince, started time.Time
}

// tendDrill starts a restore drill of the newest backup when one is due
// and this agent leads a cluster that nothing else needs the disk for,
// and interrupts one in progress when that changes: when this agent has
// seen no cluster to lead for a lease, or when a backup, a restore, a
// roll or a defragmentation comes. An interrupted drill is not recorded.
func (lp *loop) tendDrill(ctx context.Context, obs plan.Observed, actions []plan.Action) {
	d, drills := &lp.drillClock, lp.drills
	now := lp.now()
	if obs.Cluster == nil {
		// One failed read is no loss of the lead.
		if d.lostSince.IsZero() {
			d.lostSince = now
		}
		if now.Sub(d.lostSince) >= lp.cfg.LeaderLease {
			d.leadSince = time.Time{}
			if drills.Running() {
				lp.log.Info("no longer leading; stopping the restore drill")
				drills.Interrupt()
			}
		}
		return
	}
	d.lostSince = time.Time{}
	if d.leadSince.IsZero() {
		d.leadSince = now
	}
	if why := plan.DrillBusy(obs, actions, !lp.activitySince.IsZero()); why != "" {
		if drills.Running() {
			lp.log.Info("stopping the restore drill; it will run again later", "reason", why)
			drills.Interrupt()
			d.started = time.Time{}
		}
		return
	}
	if lp.cfg.RestoreDrillInterval <= 0 || drills.Running() || lp.drillable == nil || obs.StoreErr != nil {
		return
	}
	if err := lp.drillRecordErr; err != nil && !errors.Is(err, spec.ErrBadRecord) {
		return // the store did not answer; the next read will tell
	}
	if !plan.DrillDue(now, lp.cfg.RestoreDrillInterval, lp.drillRecord, d.leadSince, d.started) {
		return
	}
	d.started = now
	drills.Start(ctx, lp.drillConfig(), lp.drillable.Name, obs.Self.Version)
}

// drillConfig is where this agent's drills run, and how they reach their
// scratch etcd: with the TLS its own etcd serves with.
func (lp *loop) drillConfig() drill.Config {
	cfg := drill.Config{
		DataDir:    lp.cfg.DataDir,
		EtcdBinDir: lp.cfg.EtcdBinDir,
		Fetch:      lp.cfg.fetchOptions(lp.backups.Status, lp.env.Keys),
	}
	if files := lp.env.EtcdTLSFiles; files != nil {
		cfg.ServerTLS, cfg.ClientTLS = files, lp.env.EtcdTLS
	}
	return cfg
}
