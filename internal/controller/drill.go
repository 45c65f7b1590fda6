package controller

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/drill"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Restore drills: every --restore-drill-interval the leader restores the
// newest backup into a scratch etcd on loopback in its tmp/ folder, and
// checks the restored revision and HashKV against the backup's meta. The
// cluster is not touched. The outcome goes to the store (so that every
// agent reports it), the metrics and the event history.

const (
	// drillRecordTimeout bounds the write of a drill's outcome.
	drillRecordTimeout = 10 * time.Second
)

// driller runs one drill at a time, in the background.
type driller struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	// leadSince is when this agent began to lead, lostSince when it last
	// saw no cluster to lead, started when it last started a drill.
	leadSince, lostSince, started time.Time
}

// running reports whether a drill runs now.
func (d *driller) running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done == nil {
		return false
	}
	select {
	case <-d.done:
		d.done, d.cancel = nil, nil
		return false
	default:
		return true
	}
}

// start runs drill in a goroutine of its own.
func (d *driller) start(ctx context.Context, drill func(context.Context)) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	d.mu.Lock()
	d.cancel, d.done = cancel, done
	d.mu.Unlock()
	go func() {
		defer close(done)
		defer cancel()
		drill(ctx)
	}()
}

// interrupt cancels a drill in progress without waiting for it.
func (d *driller) interrupt() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel != nil {
		d.cancel()
	}
}

// stop cancels a drill in progress and waits for it to clean up.
func (d *driller) stop() {
	d.mu.Lock()
	cancel, done := d.cancel, d.done
	d.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// tendDrill starts a restore drill of the newest backup when one is due
// and this agent leads a cluster that nothing else needs the disk for,
// and interrupts one in progress when that changes: when this agent has
// seen no cluster to lead for a lease, or when a backup, a restore, a
// roll or a defragmentation comes. An interrupted drill is not recorded.
func (lp *loop) tendDrill(ctx context.Context, obs plan.Observed, actions []plan.Action) {
	d := &lp.drills
	now := lp.now()
	if obs.Cluster == nil {
		// One failed read is no loss of the lead.
		if d.lostSince.IsZero() {
			d.lostSince = now
		}
		if now.Sub(d.lostSince) >= lp.cfg.LeaderLease {
			d.leadSince = time.Time{}
			if d.running() {
				lp.log.Info("no longer leading; stopping the restore drill")
				d.interrupt()
			}
		}
		return
	}
	d.lostSince = time.Time{}
	if d.leadSince.IsZero() {
		d.leadSince = now
	}
	if why := plan.DrillBusy(obs, actions, !lp.activitySince.IsZero()); why != "" {
		if d.running() {
			lp.log.Info("stopping the restore drill; it will run again later", "reason", why)
			d.interrupt()
			d.started = time.Time{}
		}
		return
	}
	if lp.cfg.RestoreDrillInterval <= 0 || d.running() || lp.newestStored == nil || obs.StoreErr != nil {
		return
	}
	if err := lp.drillRecordErr; err != nil && !errors.Is(err, spec.ErrBadRecord) {
		return // the store did not answer; the next read will tell
	}
	if !plan.DrillDue(now, lp.cfg.RestoreDrillInterval, lp.drillRecord, d.leadSince, d.started) {
		return
	}
	name := lp.newestStored.Name
	d.started = now
	lp.log.Info("restore drill started", "backup", name)
	d.start(ctx, func(ctx context.Context) {
		defer func() {
			// As in the loop: a bug met on bad data must not take the
			// agent, and its etcd, down.
			if r := recover(); r != nil {
				lp.met.panics.Inc()
				lp.log.Error("a restore drill panicked; recovered", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			}
		}()
		lp.drill(ctx, name, obs.Self.Version)
	})
}

// drill runs one drill of backup name and records its outcome.
func (lp *loop) drill(ctx context.Context, name, runningVersion string) {
	start := lp.now()
	res := spec.DrillResult{Time: start.UTC(), Node: lp.node.ID(), Backup: name, Outcome: spec.EventOK}
	// A store of its own: the loop's is not shared across goroutines.
	s, err := store.Open(ctx, lp.cfg.BackupStore, store.Options{})
	opened := err == nil
	var got drill.Result
	if opened {
		defer s.Close()
		got, err = drill.Run(ctx, s, lp.drillConfig(), name, runningVersion)
	}
	if ctx.Err() != nil {
		lp.log.Info("restore drill stopped", "backup", name)
		return // stopped, not failed: nothing to record
	}
	res.Seconds = lp.now().Sub(start).Seconds()
	res.Revision, res.HashKV = got.Revision, got.HashKV
	res.Message = got.Note
	result, outcome := "ok", spec.EventOK
	switch {
	case err != nil && drill.Failed(err):
		res.Outcome, res.Message, result, outcome = spec.EventFailed, err.Error(), "failed", spec.EventFailed
		lp.log.Error("restore drill failed: the newest backup did not restore as its meta says", "backup", name, "error", err)
	case err != nil:
		res.Outcome, res.Message, result, outcome = spec.DrillNotRun, err.Error(), "not_run", spec.EventFailed
		lp.log.Warn("restore drill could not run; it says nothing of the backup, and is tried again later", "backup", name, "error", err)
	default:
		lp.log.Info("restore drill passed", "backup", name, "revision", got.Revision, "hashkv-checked", got.HashKV != nil,
			"duration", time.Duration(res.Seconds*float64(time.Second)).Round(time.Millisecond))
	}
	lp.met.drills.WithLabelValues(result).Inc()
	msg := res.Message
	if res.Outcome == spec.DrillNotRun {
		msg = "could not run: " + msg
	}
	lp.events.Add(spec.Event{Time: lp.now(), Action: "restore-drill " + name, Outcome: outcome, Message: spec.Clip(msg, spec.MaxEventMessage)})
	if !opened {
		return // no store to record the outcome in; the log and the event say it
	}
	rctx, rcancel := context.WithTimeout(context.Background(), drillRecordTimeout)
	defer rcancel()
	if err := s.RecordDrill(rctx, res); err != nil {
		lp.log.Warn("cannot record the restore drill's outcome in the store", "backup", name, "error", err)
	}
}

// drillConfig is where this agent's drills run, and how they reach their
// scratch etcd: with the TLS its own etcd serves with.
func (lp *loop) drillConfig() drill.Config {
	cfg := drill.Config{
		DataDir:    lp.cfg.DataDir,
		EtcdBinDir: lp.cfg.EtcdBinDir,
		Fetch:      lp.cfg.fetchOptions(lp.backups.status, lp.keys),
	}
	if files := lp.env.EtcdTLSFiles; files != nil {
		cfg.ServerTLS, cfg.ClientTLS = files, lp.etcdTLS
	}
	return cfg
}
