package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/procedure"
)

// ErrNotHeld means this agent does not hold the store lock, or no longer
// does: it has none, its lease ran out, or the lock passed to another agent.
var ErrNotHeld = errors.New("lease: this agent does not hold the store lock")

// Fence is this agent's hold on the store lock: the term it holds,
// shared by the loop (which takes, renews and releases the lock once a
// cycle) and the procedure runner (which renews it while a long step
// runs, and checks it before every step). It implements procedure.Fence.
//
// Besides the store's record, the fence keeps its own deadline on this
// process's monotonic clock: half the lease after the start of the call
// that last wrote the record (took the term or renewed it). Others may
// take over only once a whole lease has passed since that write, by their
// clocks, so the holder stops first, with half a lease to spare for clock
// offsets (which the agents keep under a fifth), even if it was paused (a
// paused process finds its deadline past when it resumes).
type Fence struct {
	Lock *Lock
	// Store is the store the lock lives in, read on each check.
	Store func() Store
	// Now is the local clock of the deadline; nil: time.Now.
	Now func() time.Time

	mu         sync.Mutex
	term       int64
	validUntil time.Time
	// held mirrors term for the metrics, which must not wait on mu while
	// a store call holds it.
	held atomic.Int64
}

func (l *Fence) clock() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Term is the term held, 0 for none.
func (l *Fence) Term() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.term
}

// acquireLocked takes or renews the lock and moves the local deadline:
// half a lease after the start of the call that last wrote the record.
// With no deadline yet (a term just adopted after a restart), or with
// force, it renews at once.
func (l *Fence) acquireLocked(ctx context.Context, s Store, force bool) (int64, error) {
	start := l.clock()
	term, wrote, err := l.Lock.acquire(ctx, s, force || l.validUntil.IsZero())
	if err != nil {
		return 0, err
	}
	if term != l.term {
		l.validUntil = time.Time{}
	}
	l.term = term
	l.held.Store(term)
	if term != 0 && wrote {
		l.validUntil = start.Add(l.Lock.TTL / 2)
	}
	return term, nil
}

// Acquire takes or renews the lock, once a cycle; it returns the term
// held, 0 when another agent holds it.
func (l *Fence) Acquire(ctx context.Context, s Store) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acquireLocked(ctx, s, false)
}

// Release gives the lock up when its holder no longer needs it.
func (l *Fence) Release(ctx context.Context, s Store) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == 0 {
		return nil
	}
	err := l.Lock.Release(ctx, s, l.term)
	l.term, l.validUntil = 0, time.Time{}
	l.held.Store(0)
	return err
}

// Hold checks that this agent still holds its term: within its own
// deadline, and still the store's newest, unexpired term. It is the
// fencing check before a step that must not be taken twice.
func (l *Fence) Hold(ctx context.Context) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == 0 {
		return 0, fmt.Errorf("%w: %w: this agent holds no store lock", procedure.ErrFenced, ErrNotHeld)
	}
	if !l.clock().Before(l.validUntil) {
		return 0, fmt.Errorf("%w: %w: the lease of store lock term %d ran out before it was renewed", procedure.ErrFenced, ErrNotHeld, l.term)
	}
	held, err := l.Lock.Holds(ctx, l.Store(), l.term)
	if err != nil {
		return 0, fmt.Errorf("lease: check the store lock: %w", err)
	}
	if !held {
		return 0, fmt.Errorf("%w: %w: the store lock (term %d) has passed to another agent", procedure.ErrFenced, ErrNotHeld, l.term)
	}
	return l.term, nil
}

// Deadline is when the lease runs out unless renewed; zero with no term.
func (l *Fence) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == 0 {
		return time.Time{}
	}
	return l.validUntil
}

// Renew renews the lock while a procedure step runs. The term never
// changes on renewal: a different one means the lock was lost.
func (l *Fence) Renew(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := l.term
	if held == 0 {
		return fmt.Errorf("%w: this agent holds no store lock", procedure.ErrFenced)
	}
	if !l.clock().Before(l.validUntil) {
		// Paused past the lease, or the store was too slow: whatever the
		// store says now, another agent may have acted.
		return fmt.Errorf("%w: %w: the lease of store lock term %d ran out before it was renewed", procedure.ErrFenced, ErrNotHeld, held)
	}
	// The record is due for renewal a third of a lease after its write,
	// by the time the store read it then; the local deadline runs from
	// before that read. A renewal that went by the record alone could
	// find it not yet due on the tick before the deadline, and the
	// deadline past on the next, whenever the store was slower to read
	// at the write than after it. So it renews whenever less than a
	// quarter of a lease is left locally: the ticks (a sixth of a lease
	// apart) land there at least once.
	force := !l.clock().Add(l.Lock.TTL / 4).Before(l.validUntil)
	term, err := l.acquireLocked(ctx, l.Store(), force)
	if err != nil {
		return fmt.Errorf("lease: renew the store lock: %w", err)
	}
	if term != held {
		l.term, l.validUntil = 0, time.Time{}
		l.held.Store(0)
		return fmt.Errorf("%w: %w: the store lock (term %d) has passed to another agent", procedure.ErrFenced, ErrNotHeld, held)
	}
	return nil
}
