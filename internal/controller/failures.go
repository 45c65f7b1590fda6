package controller

import (
	"errors"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/membership"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/procedure"
)

// Backoff of the leader's failing actions: the first retry after
// failureBackoff, doubling with each failure up to maxFailureBackoff.
const (
	failureBackoff    = 5 * time.Second
	maxFailureBackoff = 5 * time.Minute
	// staleFailure is how long a failure is kept without another try:
	// an action that still fails is tried again within maxFailureBackoff
	// of its last failure, one no longer planned (its node went away,
	// this agent no longer leads) never is.
	staleFailure = 2 * maxFailureBackoff
)

// failures counts the leader's actions that failed in a row, by
// plan.ActionKey. It belongs to the loop's goroutine.
type failures struct {
	m map[string]*failure
}

type failure struct {
	count int
	last  time.Time
	err   string
}

func newFailures() *failures { return &failures{m: map[string]*failure{}} }

// failed records one more failure of the action key.
func (f *failures) failed(key string, err error, now time.Time) {
	x := f.m[key]
	if x == nil {
		x = &failure{}
		f.m[key] = x
	}
	x.count++
	x.last = now
	x.err = err.Error()
}

// succeeded forgets the action's failures.
func (f *failures) succeeded(key string) { delete(f.m, key) }

// prune forgets the failures of actions not tried for staleFailure, and
// returns how many are left: the actions that keep failing.
func (f *failures) prune(now time.Time) int {
	for key, x := range f.m {
		if now.Sub(x.last) > staleFailure {
			delete(f.m, key)
		}
	}
	return len(f.m)
}

// count is how many times in a row the action failed.
func (f *failures) count(key string) int {
	if x := f.m[key]; x != nil {
		return x.count
	}
	return 0
}

// retryAt is when the action may be tried again.
func (x *failure) retryAt() time.Time {
	d := failureBackoff
	for i := 1; i < x.count && d < maxFailureBackoff; i++ {
		d *= 2
	}
	return x.last.Add(min(d, maxFailureBackoff))
}

// backingOff returns the actions waiting out their backoff now, with
// their last error; for the planner, which passes them over.
func (f *failures) backingOff(now time.Time) map[string]string {
	out := map[string]string{}
	for key, x := range f.m {
		if now.Before(x.retryAt()) {
			out[key] = x.err
		}
	}
	return out
}

// report lists every action that failed and not yet succeeded since, for
// the node's status.
func (f *failures) report() []string {
	var out []string
	for key, x := range f.m {
		out = append(out, key+": "+x.err)
	}
	return out
}

// waiting reports whether err means an action found its precondition not
// yet met (a learner still catching up): it is retried on a later cycle
// and is no failure. Actions and procedure steps both say so with
// procedure.ErrWait.
func waiting(err error) bool {
	return errors.Is(err, procedure.ErrWait)
}

// QuietError reports whether err is no failure of an action, for the
// journal: the action must wait, or found this agent no longer leading.
func QuietError(err error) bool { return waiting(err) || lostLead(err) }

// lostLead reports whether err says only that this agent does not lead
// (any more): by etcd's raft, or by the store lock. Neither is a failure
// of the action.
func lostLead(err error) bool {
	return errors.Is(err, membership.ErrNotLeader) || errors.Is(err, lease.ErrNotHeld)
}

// ActionLabels are the action's labels in the actions metric: its kind
// (its name without arguments) and its result (ok, wait or error).
func ActionLabels(act plan.Action, err error) (kind, res string) {
	kind, _, _ = strings.Cut(act.String(), " ")
	return kind, result(err)
}

func result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case waiting(err):
		return "wait"
	default:
		return "error"
	}
}
