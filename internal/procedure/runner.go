package procedure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

// ErrFenced means the driver no longer holds the term it acted under:
// another agent drives now, and this one must stop acting.
var ErrFenced = errors.New("procedure: no longer the driver")

// ErrWait means a step or a loop action found its precondition not yet
// met (the members of a restored cluster still starting, a learner still
// catching up). It is tried again soon; waiting is no failure.
var ErrWait = errors.New("procedure: not ready yet")

// Phase is one phase of a procedure.
type Phase struct {
	Name string
	// Deadline bounds one attempt at one of the phase's steps.
	Deadline time.Duration
}

// Definition is a procedure: its name and its phases, in order.
type Definition struct {
	Name   string
	Phases []Phase
}

// phase returns the named phase, or a phase with the longest deadline of
// the definition when the name is not one of them (the step before the
// first record, say).
func (d Definition) phase(name string) Phase {
	if i := slices.IndexFunc(d.Phases, func(p Phase) bool { return p.Name == name }); i >= 0 {
		return d.Phases[i]
	}
	longest := Phase{Name: name}
	for _, p := range d.Phases {
		longest.Deadline = max(longest.Deadline, p.Deadline)
	}
	return longest
}

// follows reports whether phase next may be recorded after phase cur: the
// same phase again, or a later one.
func (d Definition) follows(cur, next string) bool {
	i := slices.IndexFunc(d.Phases, func(p Phase) bool { return p.Name == cur })
	j := slices.IndexFunc(d.Phases, func(p Phase) bool { return p.Name == next })
	return j >= 0 && (cur == "" || i <= j)
}

// The procedures, with deadlines longer than any one step needs when all
// goes well.
var (
	// Restore replaces the cluster with one restored from a backup.
	Restore = Definition{Name: "restore", Phases: []Phase{
		{spec.RestoreStopping, 5 * time.Minute},
		{spec.RestoreRestoring, 35 * time.Minute},
		{spec.RestoreVerifying, 2 * time.Minute},
		{spec.RestoreLifting, 5 * time.Minute},
		{spec.RestoreBackingUp, 60 * time.Minute},
	}}
	// DumpRestore changes the etcd version where no roll can: it
	// quarantines the cluster and backs it up, then restores that backup
	// into the new version.
	DumpRestore = Definition{Name: "dump-restore", Phases: append([]Phase{
		{spec.RestoreQuarantining, 5 * time.Minute},
		{spec.RestoreDumping, 60 * time.Minute},
	}, Restore.Phases...)}
	// RecoverQuorum rebuilds a cluster that lost quorum from one
	// survivor's data.
	RecoverQuorum = Definition{Name: "recover-quorum", Phases: []Phase{
		{PhaseForcing, 2 * time.Minute},
	}}
)

// PhaseForcing is recover-quorum's one phase: the survivor restarts etcd
// with --force-new-cluster.
const PhaseForcing = "forcing"

// Fence is the driver's right to act, held under a term: the fencing
// token that every record and every call it makes carries.
type Fence interface {
	// Hold returns the term the driver holds, or an error wrapping
	// ErrFenced when it holds none.
	Hold(ctx context.Context) (int64, error)
	// Renew extends the driver's lease; it fails, wrapping ErrFenced,
	// once another agent holds the fence.
	Renew(ctx context.Context) error
	// Deadline is when the driver's lease runs out unless renewed, by
	// this process's clock; zero when it holds none. Destructive calls
	// carry it (as their NotAfter) for the node to check.
	Deadline() time.Time
}

// Records is where the runner records a procedure's progress: the
// status of the command the procedure carries out, one object per
// fencing term, and the choice it makes once.
type Records interface {
	// SetCommandStatus writes the status under term; readers take the
	// highest term's.
	SetCommandStatus(ctx context.Context, id string, term int64, st spec.CommandStatus, now time.Time) error
	// CreateChoice writes the choice unless one exists, and returns the
	// one that does.
	CreateChoice(ctx context.Context, id string, c spec.Choice) (spec.Choice, error)
	DeleteCommand(ctx context.Context, id string) error
}

// Runner carries out procedure steps for one driver. The control loop
// calls it from its own goroutine, one step at a time.
type Runner struct {
	Fence   Fence
	Records Records
	Log     *slog.Logger
	Now     func() time.Time
	// RenewEvery is how often the lease is renewed while a step runs.
	RenewEvery time.Duration
	Metrics    *Metrics
	// OnTakeOver, when set, is told when this driver adopts a procedure
	// from an earlier one, before it acts.
	OnTakeOver func(ctx context.Context, term int64)
	// OnFail, when set, is told of each command Fail marks failed.
	OnFail func(id, reason string)
}

// Do runs one step of phase of procedure d for command c: it checks the
// fence; the first time this driver acts on c, it adopts c's status by
// writing it again under its own term; then it runs step, bounded by the
// phase's deadline, renewing the lease while it runs. The step's context
// is cancelled the moment the lease cannot be renewed; Do then returns an
// error wrapping ErrFenced. The step gets the term to put on every call
// it makes.
func (r *Runner) Do(ctx context.Context, d Definition, c *plan.Command, phase string, step func(ctx context.Context, term int64) error) error {
	term, err := r.Fence.Hold(ctx)
	if err != nil {
		return err
	}
	if st := c.Status; st.State == spec.CommandRunning && st.Term < term {
		// A new driver first makes the state it adopts its own, so that
		// the old driver's late writes (of an older term) change nothing.
		if err := r.Records.SetCommandStatus(ctx, c.ID, term, st, r.Now()); err != nil {
			return err
		}
		r.Log.Warn("took over a procedure from an earlier driver", "procedure", d.Name, "command", c.ID, "phase", phase,
			"term", term, "earlier-term", st.Term)
		if r.OnTakeOver != nil {
			r.OnTakeOver(ctx, term)
		}
	}
	r.Metrics.running(d.Name, phase)
	testhook.Pause(r.Log, pausePoint(d, phase))
	ph := d.phase(phase)
	ctx, cancel := context.WithTimeoutCause(ctx, ph.Deadline,
		fmt.Errorf("procedure: %s phase %s: a step took longer than its deadline of %s", d.Name, phase, ph.Deadline))
	defer cancel()
	fenced := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		// Renew until the step ends; a lease that cannot be renewed
		// stops the step, and so does its deadline passing between two
		// renewals (a process paused, a store too slow).
		t := time.NewTicker(r.RenewEvery)
		defer t.Stop()
		for {
			var expiry <-chan time.Time
			var timer *time.Timer
			if d := r.Fence.Deadline(); !d.IsZero() {
				timer = time.NewTimer(time.Until(d))
				expiry = timer.C
			}
			stop := func() {
				if timer != nil {
					timer.Stop()
				}
			}
			select {
			case <-done:
				stop()
				return
			case <-expiry:
				if d := r.Fence.Deadline(); !d.IsZero() && !time.Now().Before(d) {
					fenced <- fmt.Errorf("%w: the lease ran out before it was renewed", ErrFenced)
					cancel()
					return
				}
				continue
			case <-t.C:
				stop()
			}
			err := r.Fence.Renew(ctx)
			switch {
			case err == nil || ctx.Err() != nil:
			case errors.Is(err, ErrFenced):
				// The lease is lost (or ran out locally): stop at once.
				fenced <- err
				cancel()
				return
			default:
				// The store did not answer this time; the lease holds
				// until its local deadline, which the next renewals
				// check.
				r.Log.Warn("cannot renew the store lock; retrying", "error", err)
			}
		}
	}()
	err = step(ctx, term)
	close(done)
	select {
	case ferr := <-fenced:
		err = fmt.Errorf("%w: the lease was lost during %s phase %s: %v (step: %v)", ErrFenced, d.Name, phase, ferr, err)
	default:
		// Say why a step was cut short, unless it already does.
		if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
	}
	r.Metrics.step(d.Name, phase, err)
	return err
}

// pausePoint names the test hook inside a step of phase (see
// testhook.Pause): after the fence check, before the step acts.
func pausePoint(d Definition, phase string) string {
	if phase == "" {
		phase = "prepare"
	}
	return "procedure-" + d.Name + "-" + phase
}

// Choose records the procedure's choice once, under the fence, and
// returns the choice to act on: c, or the one an earlier driver made.
func (r *Runner) Choose(ctx context.Context, id string, c spec.Choice) (spec.Choice, error) {
	term, err := r.Fence.Hold(ctx)
	if err != nil {
		return c, err
	}
	c.Term = term
	got, err := r.Records.CreateChoice(ctx, id, c)
	if err != nil {
		return c, err
	}
	if got.Term != term {
		r.Log.Info("acting on the choice an earlier driver made", "command", id, "term", term, "choice-term", got.Term)
	}
	return got, nil
}

// Note writes why the procedure's command waits into its status, under
// the fence. It changes the message only: a running procedure's node,
// phase and choice stay, and a command not started stays pending.
func (r *Runner) Note(ctx context.Context, id string, cur spec.CommandStatus, message string) error {
	term, err := r.Fence.Hold(ctx)
	if err != nil {
		return err
	}
	st := cur
	st.Message = message
	if st.State == "" {
		st.State = spec.CommandPending
	}
	return r.Records.SetCommandStatus(ctx, id, term, st, r.Now())
}

// NotAfter is when the driver's lease runs out, for the destructive calls
// to carry: a node refuses one that arrives later (a driver paused past
// its lease, whose late call must change nothing).
func (r *Runner) NotAfter() time.Time { return r.Fence.Deadline() }

// Fail marks the procedure's command failed, under the fence, keeping it
// for the operator to read in list-commands. The progress of its current
// status cur is kept, so that what the procedure left behind (a restored
// cluster held quarantined, the survivor chosen) can still be read.
func (r *Runner) Fail(ctx context.Context, id string, cur spec.CommandStatus, reason string) error {
	term, err := r.Fence.Hold(ctx)
	if err != nil {
		return err
	}
	r.Log.Error("queued command failed", "command", id, "reason", reason)
	st := spec.CommandStatus{State: spec.CommandFailed, Message: reason, Restore: cur.Restore, Node: cur.Node, NodeToken: cur.NodeToken}
	err = r.Records.SetCommandStatus(ctx, id, term, st, r.Now())
	r.Metrics.idle()
	if err == nil && r.OnFail != nil {
		r.OnFail(id, reason)
	}
	return err
}

// Record writes the command's status, which holds the procedure's phase,
// under the fence and before anything of that phase acts. It refuses to
// move the procedure backwards. After the write, the crash point named
// crash (if any) lets the tests crash the driver there.
func (r *Runner) Record(ctx context.Context, d Definition, id, from string, st spec.CommandStatus, phase, crash string) error {
	if !d.follows(from, phase) {
		return fmt.Errorf("procedure: %s %s: refusing to move from phase %q to %q", d.Name, id, from, phase)
	}
	term, err := r.Fence.Hold(ctx)
	if err != nil {
		return err
	}
	if err := r.Records.SetCommandStatus(ctx, id, term, st, r.Now()); err != nil {
		return err
	}
	r.Metrics.running(d.Name, phase)
	r.Log.Info("procedure moves on", "procedure", d.Name, "command", id, "phase", phase)
	if crash != "" {
		testhook.Here(r.Log, crash)
	}
	testhook.Pause(r.Log, "procedure-"+d.Name+"-recorded-"+phase)
	return nil
}

// Finish removes the command of a completed procedure.
func (r *Runner) Finish(ctx context.Context, d Definition, id string) error {
	if _, err := r.Fence.Hold(ctx); err != nil {
		return err
	}
	if err := r.Records.DeleteCommand(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	r.Metrics.idle()
	return nil
}

// Idle reports that this agent drives no procedure.
func (r *Runner) Idle() { r.Metrics.idle() }

// Show reports work the planner drives outside the runner (a roll, a
// defragmentation) in the procedure metric.
func (r *Runner) Show(procedure, phase string) { r.Metrics.running(procedure, phase) }

// Metrics report the procedure steps an agent drives.
type Metrics struct {
	phase *prometheus.GaugeVec
	steps *prometheus.CounterVec
}

// NewMetrics registers the procedure metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "etcd_manager_procedure_phase",
			Help: "1 for the procedure and phase this agent drives now; no series while it drives none."}, []string{"procedure", "phase"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "etcd_manager_procedure_steps_total",
			Help: "Procedure steps this agent took, by procedure, phase and result."}, []string{"procedure", "phase", "result"}),
	}
	reg.MustRegister(m.phase, m.steps)
	return m
}

func (m *Metrics) running(proc, phase string) {
	if m == nil {
		return
	}
	m.phase.Reset()
	m.phase.WithLabelValues(proc, phase).Set(1)
}

func (m *Metrics) idle() {
	if m != nil {
		m.phase.Reset()
	}
}

func (m *Metrics) step(proc, phase string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	switch {
	case errors.Is(err, ErrWait):
		result = "wait"
	case err != nil:
		result = "error"
	}
	m.steps.WithLabelValues(proc, phase, result).Inc()
}
