package drill

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// recordTimeout bounds the write of a drill's outcome.
const recordTimeout = 10 * time.Second

// Driller runs one drill at a time in the background, for the leader's
// loop, and records each outcome: in the store (so that every agent
// reports it), in its metrics and in the event history. A drill stopped
// midway is not recorded. Create it with NewDriller.
type Driller struct {
	// Store is the backup store's URL: each drill opens a store of its
	// own. Node names this agent in the record.
	Store string
	Node  string
	Log   *slog.Logger
	Now   func() time.Time
	// Event records an event in the history; Panicked counts a drill
	// that panicked and was recovered.
	Event    func(spec.Event)
	Panicked func()

	met    metrics
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewDriller returns a driller whose metrics reg takes; set its fields
// before the first Start.
func NewDriller(reg prometheus.Registerer) *Driller {
	return &Driller{met: newMetrics(reg)}
}

// Running reports whether a drill runs now.
func (d *Driller) Running() bool {
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

// Start drills backup name in a goroutine of its own; runningVersion is
// the etcd version the cluster runs.
func (d *Driller) Start(ctx context.Context, cfg Config, name, runningVersion string) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	d.mu.Lock()
	d.cancel, d.done = cancel, done
	d.mu.Unlock()
	d.Log.Info("restore drill started", "backup", name)
	go func() {
		defer close(done)
		defer cancel()
		defer func() {
			// As in the loop: a bug met on bad data must not take the
			// agent, and its etcd, down.
			if r := recover(); r != nil {
				d.Panicked()
				d.Log.Error("a restore drill panicked; recovered", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			}
		}()
		d.drill(ctx, cfg, name, runningVersion)
	}()
}

// Interrupt cancels a drill in progress without waiting for it.
func (d *Driller) Interrupt() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel != nil {
		d.cancel()
	}
}

// Stop cancels a drill in progress and waits for it to clean up.
func (d *Driller) Stop() {
	d.mu.Lock()
	cancel, done := d.cancel, d.done
	d.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// drill runs one drill of backup name and records its outcome.
func (d *Driller) drill(ctx context.Context, cfg Config, name, runningVersion string) {
	start := d.Now()
	res := spec.DrillResult{Time: start.UTC(), Node: d.Node, Backup: name, Outcome: spec.EventOK}
	// A store of its own: the loop's is not shared across goroutines.
	s, err := store.Open(ctx, d.Store, store.Options{})
	opened := err == nil
	var got Result
	if opened {
		defer s.Close()
		got, err = Run(ctx, s, cfg, name, runningVersion)
	}
	if ctx.Err() != nil {
		d.Log.Info("restore drill stopped", "backup", name)
		return // stopped, not failed: nothing to record
	}
	res.Seconds = d.Now().Sub(start).Seconds()
	res.Revision, res.HashKV = got.Revision, got.HashKV
	res.Message = got.Note
	result, outcome := "ok", spec.EventOK
	switch {
	case err != nil && Failed(err):
		res.Outcome, res.Message, result, outcome = spec.EventFailed, err.Error(), "failed", spec.EventFailed
		d.Log.Error("restore drill failed: the newest backup did not restore as its meta says", "backup", name, "error", err)
	case err != nil:
		res.Outcome, res.Message, result, outcome = spec.DrillNotRun, err.Error(), "not_run", spec.EventFailed
		d.Log.Warn("restore drill could not run; it says nothing of the backup, and is tried again later", "backup", name, "error", err)
	default:
		d.Log.Info("restore drill passed", "backup", name, "revision", got.Revision, "hashkv-checked", got.HashKV != nil,
			"duration", time.Duration(res.Seconds*float64(time.Second)).Round(time.Millisecond))
	}
	d.met.drills.WithLabelValues(result).Inc()
	msg := res.Message
	if res.Outcome == spec.DrillNotRun {
		msg = "could not run: " + msg
	}
	d.Event(spec.Event{Time: d.Now(), Action: "restore-drill " + name, Outcome: outcome, Message: spec.Clip(msg, spec.MaxEventMessage)})
	if !opened {
		return // no store to record the outcome in; the log and the event say it
	}
	rctx, rcancel := context.WithTimeout(context.Background(), recordTimeout)
	defer rcancel()
	if err := s.RecordDrill(rctx, res); err != nil {
		d.Log.Warn("cannot record the restore drill's outcome in the store", "backup", name, "error", err)
	}
}
