package journal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// The event history (etcd-manager-ctl events): every change an agent
// makes to the cluster, and every failure, as a small object in the
// store's events/ prefix. A failure that repeats is recorded once, then
// once every eventCollapse with the count since, and with the success
// that ends it. Recording never blocks the loop: events wait in a bounded
// queue for a writer of their own, and the oldest are dropped, counted,
// when the store is away for long.
const (
	eventCollapse   = 10 * time.Minute
	eventQueueLimit = 256
)

// failingAction is an action that keeps failing: since when, how often
// since then, when its last event was written (window) and when it last
// failed (seen), and its last error.
type failingAction struct {
	since, window, seen time.Time
	count               int
	last                string
}

// failingIdle is how long an action may not be tried before the record
// of its failures is dropped (actions such as one command's steps never
// come again); failingLimit bounds how many are kept.
const (
	failingIdle  = 2 * eventCollapse
	failingLimit = 256
)

// Journal records the events of one agent.
type Journal struct {
	node string
	now  func() time.Time
	log  *slog.Logger
	// quiet says which errors of an action are no event (see New).
	quiet func(error) bool

	mu      sync.Mutex
	queue   []spec.Event
	failing map[string]*failingAction
	// commandFailedStep is set when the step being taken marked its
	// command failed (which the step reports as done): its success is no
	// event, the failure is.
	commandFailedStep bool
	wake              chan struct{}
	dropped           atomic.Int64
}

// New returns the journal of a node's changes and failures; Start writes
// it to the store. quiet says which errors of an action are no event (an
// action that must wait, or that found this agent no longer leading);
// nil: every error is one.
func New(node string, now func() time.Time, log *slog.Logger, quiet func(error) bool) *Journal {
	return &Journal{node: node, now: now, log: log, quiet: quiet, failing: map[string]*failingAction{}, wake: make(chan struct{}, 1)}
}

// Outcome records what came of an action the loop took: a change that
// succeeded, a failure (collapsed when it repeats), or a success after
// failures. Waits, and steps refused for no longer leading, are no
// events.
func (e *Journal) Outcome(act plan.Action, err error) {
	if e == nil {
		return
	}
	e.mu.Lock()
	stepFailed := e.commandFailedStep
	e.commandFailedStep = false
	e.mu.Unlock()
	if err != nil && e.quiet != nil && e.quiet(err) {
		return
	}
	now := e.now()
	if fc, ok := act.(plan.FailCommand); ok && err == nil {
		e.Add(spec.Event{Time: now, Action: "fail-command " + fc.ID, Outcome: spec.EventFailed, Message: fc.Reason})
		return
	}
	if stepFailed && err == nil {
		return
	}
	key := plan.ActionKey(act)
	e.mu.Lock()
	for k, f := range e.failing {
		if now.Sub(f.seen) > failingIdle {
			delete(e.failing, k)
		}
	}
	f := e.failing[key]
	if f != nil {
		f.seen = now
	}
	switch {
	case err == nil && f != nil:
		delete(e.failing, key)
		e.mu.Unlock()
		e.Add(spec.Event{Time: now, Action: act.String(), Outcome: spec.EventOK,
			Message: fmt.Sprintf("succeeded after failing %d times since %s", f.count, f.since.UTC().Format(time.RFC3339))})
	case err == nil:
		e.mu.Unlock()
		if act.Mutates() {
			e.Add(spec.Event{Time: now, Action: act.String(), Outcome: spec.EventOK})
		}
	case f == nil:
		if len(e.failing) < failingLimit {
			e.failing[key] = &failingAction{since: now, window: now, seen: now, count: 1, last: err.Error()}
		}
		e.mu.Unlock()
		e.Add(spec.Event{Time: now, Action: act.String(), Outcome: spec.EventFailed, Message: err.Error()})
	default:
		f.count++
		f.last = err.Error()
		if now.Sub(f.window) < eventCollapse {
			e.mu.Unlock()
			return
		}
		ev := spec.Event{Time: now, Action: act.String(), Outcome: spec.EventFailed, Message: f.last, Count: f.count, Since: f.since}
		f.window = now
		e.mu.Unlock()
		e.Add(ev)
	}
}

// CommandFailed records that a procedure step marked its command failed,
// with the reason (procedure.Runner's OnFail).
func (e *Journal) CommandFailed(id, reason string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	e.commandFailedStep = true
	e.mu.Unlock()
	e.Add(spec.Event{Time: e.now(), Action: "fail-command " + id, Outcome: spec.EventFailed, Message: reason})
}

// Note records an event of the agent's own, apart from the loop's
// actions (a certificate issued).
func (e *Journal) Note(action, message string) {
	if e == nil {
		return
	}
	e.Add(spec.Event{Time: e.now(), Action: action, Outcome: spec.EventOK, Message: message})
}

// Add queues an event for the store.
func (e *Journal) Add(ev spec.Event) {
	if e == nil {
		return
	}
	ev.Node = e.node
	e.mu.Lock()
	if len(e.queue) >= eventQueueLimit {
		e.queue = e.queue[1:]
		e.dropped.Add(1)
	}
	e.queue = append(e.queue, ev)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// pending takes the queued events.
func (e *Journal) pending() []spec.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	q := e.queue
	e.queue = nil
	return q
}

// requeue puts back events that could not be written, ahead of newer
// ones, within the queue's bound.
func (e *Journal) requeue(evs []spec.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	q := append(evs, e.queue...)
	if over := len(q) - eventQueueLimit; over > 0 {
		q = q[over:]
		e.dropped.Add(int64(over))
	}
	e.queue = q
}

// eventWriter is where events go: the store.
type eventWriter interface {
	AddEvent(ctx context.Context, e spec.Event) error
}

// run writes queued events to the store opened by open until ctx ends,
// retrying with backoff while the store is away.
func (e *Journal) run(ctx context.Context, open func(context.Context) (eventWriter, func(), error)) {
	delay := time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-time.After(time.Minute):
		}
		evs := e.pending()
		if len(evs) == 0 {
			continue
		}
		if n := e.dropped.Swap(0); n > 0 {
			e.log.Warn("events were dropped while the store could not take them", "dropped", n)
		}
		i, err := write(ctx, open, evs)
		if errors.Is(err, spec.ErrBadEvent) {
			e.log.Error("an event could not be recorded", "error", err, "action", evs[i].Action)
			i++ // never retried
			err = nil
		}
		if i < len(evs) {
			e.requeue(evs[i:])
			e.poke()
		}
		if err != nil {
			e.log.Warn("cannot record events in the store; will retry", "error", err, "queued", len(evs)-i, "retry-in", delay)
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Minute)
			e.poke()
			continue
		}
		delay = time.Second
	}
}

// Start writes queued events to the store at url until ctx ends; the
// returned stop writes what is left, within 5 s, as the agent stops.
func (e *Journal) Start(ctx context.Context, url string) (stop func()) {
	open := openEventStore(url)
	go e.run(ctx, open)
	return func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.flush(fctx, open)
	}
}

// flush writes what is queued once, as the agent stops.
func (e *Journal) flush(ctx context.Context, open func(context.Context) (eventWriter, func(), error)) {
	evs := e.pending()
	if len(evs) == 0 {
		return
	}
	if i, err := write(ctx, open, evs); err != nil {
		e.log.Warn("events not recorded as the agent stops", "error", err, "events", len(evs)-i)
	}
}

// write writes evs, in order, to a store opened for them, and returns
// how many it wrote before the first error.
func write(ctx context.Context, open func(context.Context) (eventWriter, func(), error), evs []spec.Event) (int, error) {
	w, closeStore, err := open(ctx)
	if err != nil {
		return 0, err
	}
	defer closeStore()
	for i, ev := range evs {
		if err := w.AddEvent(ctx, ev); err != nil {
			return i, err
		}
	}
	return len(evs), nil
}

func (e *Journal) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// openEventStore opens a store of the writer's own for each batch.
func openEventStore(url string) func(context.Context) (eventWriter, func(), error) {
	return func(ctx context.Context) (eventWriter, func(), error) {
		s, err := store.Open(ctx, url, store.Options{Create: true})
		if err != nil {
			return nil, nil, err
		}
		return s, func() { s.Close() }, nil
	}
}
