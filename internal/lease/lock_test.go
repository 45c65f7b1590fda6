package lease

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/procedure"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func openLockStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Open(t.Context(), "file://"+filepath.Join(t.TempDir(), "s"), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestLeaderLock(t *testing.T) {
	s := openLockStore(t)
	ctx := t.Context()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := &Lock{NodeID: "a", TTL: 30 * time.Second, Now: clock.Now}
	b := &Lock{NodeID: "b", TTL: 30 * time.Second, Now: clock.Now}

	ta, err := a.Acquire(ctx, s)
	if err != nil || ta != 1 {
		t.Fatalf("a: term %d, %v", ta, err)
	}
	if tb, err := b.Acquire(ctx, s); err != nil || tb != 0 {
		t.Fatalf("b while a holds: term %d, %v", tb, err)
	}
	// Renewals keep the term: it changes only when the holder does.
	clock.Add(5 * time.Second)
	if got, _ := a.Acquire(ctx, s); got != 1 {
		t.Errorf("a early re-acquire: term %d, want 1", got)
	}
	for range 3 {
		clock.Add(20 * time.Second) // each renewal extends the lease
		if got, _ := a.Acquire(ctx, s); got != 1 {
			t.Fatalf("a renewal: term %d, want 1", got)
		}
		if tb, _ := b.Acquire(ctx, s); tb != 0 {
			t.Fatalf("b took a renewed lock: term %d", tb)
		}
	}
	if held, _ := a.Holds(ctx, s, 1); !held {
		t.Error("the current term is not held")
	}
	// a stops renewing; once the lease runs out, b takes the next term and
	// a's fencing check fails.
	clock.Add(31 * time.Second)
	tb, err := b.Acquire(ctx, s)
	if err != nil || tb != 2 {
		t.Fatalf("b after expiry: term %d, %v", tb, err)
	}
	if held, _ := a.Holds(ctx, s, 1); held {
		t.Error("a still holds after b took over")
	}
	if got, _ := a.Acquire(ctx, s); got != 0 {
		t.Errorf("a while b holds: term %d", got)
	}
}

// The lease is each reader's own: a record that claims a 100-year TTL
// does not hold the lock longer than the reader's lease.
func TestLeaderLockTTLIsTheReaders(t *testing.T) {
	s := openLockStore(t)
	ctx := t.Context()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	rec := fmt.Sprintf(`{"format":1,"nodeId":"squatter","term":5,"acquired":%q,"ttl":%d}`,
		clock.Now().Format(time.RFC3339Nano), int64(100*365*24*time.Hour))
	if err := s.Create(ctx, lockKey(5), []byte(rec)); err != nil {
		t.Fatal(err)
	}
	b := &Lock{NodeID: "b", TTL: 30 * time.Second, Now: clock.Now}
	if tb, _ := b.Acquire(ctx, s); tb != 0 {
		t.Fatalf("b took a fresh lock: term %d", tb)
	}
	clock.Add(31 * time.Second)
	if tb, err := b.Acquire(ctx, s); err != nil || tb != 6 {
		t.Fatalf("b after its own lease ran out: term %d, %v; want 6", tb, err)
	}
}

// The term cannot overflow: a lock at the largest term is refused, with
// an error that says what to do.
func TestLeaderLockTermLimit(t *testing.T) {
	s := openLockStore(t)
	if err := s.Create(t.Context(), lockKey(maxTerm), []byte(`{"nodeId":"x","released":true,"format":1}`)); err != nil {
		t.Fatal(err)
	}
	l := &Lock{NodeID: "a", TTL: time.Minute, Now: time.Now}
	if term, err := l.Acquire(t.Context(), s); err == nil || term != 0 || !strings.Contains(err.Error(), "remove control/leader/") {
		t.Fatalf("Acquire at the largest term: %d, %v", term, err)
	}
}

// Records no agent could have written do not wedge the lock: one renewed
// years ahead of the reader's clock is an expired lease, and one of a
// term beyond any agent's (near the int64 limit) is ignored, so terms go
// on from the real ones.
func TestLeaderLockHostileRecords(t *testing.T) {
	s := openLockStore(t)
	ctx := t.Context()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	future := fmt.Sprintf(`{"format":1,"nodeId":"squatter","term":3,"acquired":%q,"ttl":30000000000}`,
		clock.Now().Add(100*365*24*time.Hour).Format(time.RFC3339Nano))
	if err := s.Create(ctx, lockKey(3), []byte(future)); err != nil {
		t.Fatal(err)
	}
	huge := int64(math.MaxInt64 - 1)
	if err := s.Create(ctx, fmt.Sprintf("%s%d", lockPrefix, huge), []byte(`{"format":1,"nodeId":"squatter","term":9223372036854775806}`)); err != nil {
		t.Fatal(err)
	}
	b := &Lock{NodeID: "b", TTL: 30 * time.Second, Now: clock.Now}
	if tb, err := b.Acquire(ctx, s); err != nil || tb != 4 {
		t.Fatalf("b with a record from the future and one at term %d: term %d, %v; want 4", huge, tb, err)
	}
	// A lease a little ahead of the reader's clock (skew within the
	// lease) still holds.
	skewed := fmt.Sprintf(`{"format":1,"nodeId":"other","term":5,"acquired":%q,"ttl":30000000000}`,
		clock.Now().Add(10*time.Second).Format(time.RFC3339Nano))
	if err := s.Create(ctx, lockKey(5), []byte(skewed)); err != nil {
		t.Fatal(err)
	}
	if tb, _ := b.Acquire(ctx, s); tb != 0 {
		t.Fatalf("b took a lock renewed 10s ahead of its clock: term %d", tb)
	}
}

func TestLeaderLockRace(t *testing.T) {
	s := openLockStore(t)
	clock := &fakeClock{t: time.Now()}
	var wg sync.WaitGroup
	terms := make([]int64, 10)
	for i := range terms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := &Lock{NodeID: string(rune('a' + i)), TTL: time.Minute, Now: clock.Now}
			terms[i], _ = l.Acquire(t.Context(), s)
		}()
	}
	wg.Wait()
	winners := 0
	for _, term := range terms {
		if term != 0 {
			winners++
		}
	}
	if winners != 1 {
		t.Errorf("%d agents hold the lock at once: %v", winners, terms)
	}
}

func TestLeaderLockJunkCountsAsExpired(t *testing.T) {
	s := openLockStore(t)
	if err := s.Write(t.Context(), lockKey(7), []byte("{junk")); err != nil {
		t.Fatal(err)
	}
	l := &Lock{NodeID: "a", TTL: time.Minute, Now: time.Now}
	if got, err := l.Acquire(t.Context(), s); err != nil || got != 8 {
		t.Errorf("Acquire over junk: term %d, %v", got, err)
	}
}

// A released lock is free at once, and its old term no longer holds.
func TestLeaderLockRelease(t *testing.T) {
	s := openLockStore(t)
	ctx := t.Context()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := &Lock{NodeID: "a", TTL: 30 * time.Second, Now: clock.Now}
	b := &Lock{NodeID: "b", TTL: 30 * time.Second, Now: clock.Now}
	ta, err := a.Acquire(ctx, s)
	if err != nil || ta != 1 {
		t.Fatalf("a: term %d, %v", ta, err)
	}
	// b cannot release a's term.
	if err := b.Release(ctx, s, ta); err != nil {
		t.Fatal(err)
	}
	if tb, _ := b.Acquire(ctx, s); tb != 0 {
		t.Fatalf("b took a held lock after a bogus release: term %d", tb)
	}
	if err := a.Release(ctx, s, ta); err != nil {
		t.Fatal(err)
	}
	if held, _ := a.Holds(ctx, s, ta); held {
		t.Error("a still holds a released term")
	}
	clock.Add(time.Millisecond)
	if tb, err := b.Acquire(ctx, s); err != nil || tb != 2 {
		t.Fatalf("b right after the release: term %d, %v; want 2", tb, err)
	}
}

// An agent before format 1 released the lock by a record with TTL 0;
// that still frees it.
func TestLeaderLockOldRelease(t *testing.T) {
	s := openLockStore(t)
	if err := s.Create(t.Context(), lockKey(3), []byte(`{"nodeId":"old","acquired":"2026-01-01T00:00:00Z","ttl":0}`)); err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)}
	l := &Lock{NodeID: "a", TTL: time.Minute, Now: clock.Now}
	if term, err := l.Acquire(t.Context(), s); err != nil || term != 4 {
		t.Fatalf("Acquire after an old release: %d, %v; want 4", term, err)
	}
}

// A lock written by a newer etcd-manager is never taken or misread.
func TestLeaderLockNewerFormat(t *testing.T) {
	s := openLockStore(t)
	ctx := t.Context()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if err := s.Create(ctx, lockKey(4), []byte(`{"format":9,"nodeId":"new","acquired":"2020-01-01T00:00:00Z","ttl":1}`)); err != nil {
		t.Fatal(err)
	}
	a := &Lock{NodeID: "a", TTL: 30 * time.Second, Now: clock.Now}
	term, err := a.Acquire(ctx, s)
	if !errors.Is(err, spec.ErrNewerFormat) || term != 0 {
		t.Fatalf("Acquire over a newer lock = %d, %v; want 0 and ErrNewerFormat", term, err)
	}
	if _, err := s.Read(ctx, lockKey(5)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a newer term was written over the newer lock: %v", err)
	}
}

// A holder stops acting half a lease after its last renewal, by its own
// clock, whatever the store still says: a paused holder finds its lease
// over when it resumes. A renewal never changes the term.
func TestLeaseFencesAPausedHolder(t *testing.T) {
	s := openLockStore(t)
	ctx := t.Context()
	const ttl = 400 * time.Millisecond
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := &Fence{Lock: &Lock{NodeID: "a", TTL: ttl, Now: clock.Now}, Store: func() Store { return s }, Now: clock.Now}
	term, err := l.Acquire(ctx, s)
	if err != nil || term != 1 {
		t.Fatalf("Acquire: %d, %v", term, err)
	}
	if got, err := l.Hold(ctx); err != nil || got != 1 {
		t.Fatalf("Hold right after taking the lock: %d, %v", got, err)
	}
	for range 4 {
		clock.Add(ttl / 6)
		if err := l.Renew(ctx); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if l.Term() != 1 {
			t.Fatalf("a renewal changed the term to %d", l.Term())
		}
	}
	// "Paused": no renewal for more than half the lease. The store still
	// names a as the holder, but a must not act.
	clock.Add(ttl/2 + 50*time.Millisecond)
	if _, err := l.Hold(ctx); !errors.Is(err, procedure.ErrFenced) {
		t.Fatalf("Hold after the local lease ran out: %v, want ErrFenced", err)
	}
	if err := l.Renew(ctx); !errors.Is(err, procedure.ErrFenced) {
		t.Fatalf("Renew after the local lease ran out: %v, want ErrFenced", err)
	}
	// Another agent takes the lock once it has expired; a's next cycle
	// sees that and holds nothing.
	clock.Add(ttl)
	b := &Lock{NodeID: "b", TTL: ttl, Now: clock.Now}
	if tb, err := b.Acquire(ctx, s); err != nil || tb != 2 {
		t.Fatalf("b: %d, %v", tb, err)
	}
	if got, err := l.Acquire(ctx, s); err != nil || got != 0 {
		t.Fatalf("a while b holds: %d, %v", got, err)
	}
	if _, err := l.Hold(ctx); !errors.Is(err, procedure.ErrFenced) {
		t.Fatalf("Hold while b holds: %v, want ErrFenced", err)
	}
}

// A long step's renewals keep the lease whatever the store's latency: a
// renewal that wrote the record after a slow read leaves the record not
// yet due on the tick before the local deadline. The lease must renew
// there anyway, not find its deadline past on the next tick.
func TestLeaseRenewalsOutlastASlowStoreRead(t *testing.T) {
	s := openLockStore(t)
	ctx := t.Context()
	const ttl = 600 * time.Millisecond
	tick := ttl / 6 // the procedure runner's RenewEvery
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	// The lock reads its clock after it has read the store: latency is
	// how long that read took on this call.
	var latency time.Duration
	l := &Fence{Lock: &Lock{NodeID: "a", TTL: ttl, Now: func() time.Time { return clock.Now().Add(latency) }},
		Store: func() Store { return s }, Now: clock.Now}
	if term, err := l.Acquire(ctx, s); err != nil || term != 1 {
		t.Fatalf("Acquire: %d, %v", term, err)
	}
	// Writes come every second tick; each time, the read before the write
	// is the slow one. Before the fix, the lease ran out on the fifth tick.
	for i := 1; i <= 30; i++ {
		clock.Add(tick)
		latency = 0
		if i%3 == 2 {
			latency = 10 * time.Millisecond
		}
		if err := l.Renew(ctx); err != nil {
			t.Fatalf("tick %d: Renew: %v", i, err)
		}
		if _, err := l.Hold(ctx); err != nil {
			t.Fatalf("tick %d: Hold: %v", i, err)
		}
	}
}

// Terms start above what the nodes obeyed and the statuses were written
// under, even when control/leader/ was lost: nodes would refuse a lower
// term, and readers would ignore its statuses.
func TestLeaderLockFloor(t *testing.T) {
	s := openLockStore(t)
	ctx := t.Context()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	floor := int64(7)
	a := &Lock{NodeID: "a", TTL: 30 * time.Second, Now: clock.Now, Floor: func() int64 { return floor }}
	if term, err := a.Acquire(ctx, s); err != nil || term != 8 {
		t.Fatalf("a fresh lock over nodes that obeyed term 7: term %d, %v; want 8", term, err)
	}
	// The holder's own statuses and obeying nodes raise the floor to its
	// term: it keeps the term, and renews it.
	floor = 8
	clock.Add(11 * time.Second)
	if term, err := a.Acquire(ctx, s); err != nil || term != 8 {
		t.Fatalf("a holder at a floor of its own term: term %d, %v; want 8 kept", term, err)
	}
	// A holder whose term falls behind the floor takes a new term above it.
	floor = 12
	clock.Add(time.Second)
	if term, err := a.Acquire(ctx, s); err != nil || term != 13 {
		t.Fatalf("a holder under a floor of 12: term %d, %v; want 13", term, err)
	}
}

// A status far above every term seen does not raise the floor: one
// object must not push the terms to their maximum.
func TestStatusFloor(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct{ floor, term, want int64 }{
		{0, 5, 5},
		{5, 3, 5},
		{10, 10 + statusTermSlack, 10 + statusTermSlack},
		{10, 11 + statusTermSlack, 10},
		{0, maxTerm, 0},
		{0, maxTerm - 1, 0},
	} {
		if got := StatusFloor(tc.floor, tc.term, log); got != tc.want {
			t.Errorf("StatusFloor(%d, %d) = %d, want %d", tc.floor, tc.term, got, tc.want)
		}
	}
}
