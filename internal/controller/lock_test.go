package controller

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

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
	a := &LeaderLock{NodeID: "a", TTL: 30 * time.Second, Now: clock.Now}
	b := &LeaderLock{NodeID: "b", TTL: 30 * time.Second, Now: clock.Now}

	ta, err := a.Acquire(ctx, s)
	if err != nil || ta != 1 {
		t.Fatalf("a: term %d, %v", ta, err)
	}
	if tb, err := b.Acquire(ctx, s); err != nil || tb != 0 {
		t.Fatalf("b while a holds: term %d, %v", tb, err)
	}
	// Within a third of the lease a keeps its term; later it renews into
	// the next one.
	clock.Add(5 * time.Second)
	if got, _ := a.Acquire(ctx, s); got != 1 {
		t.Errorf("a early re-acquire: term %d, want 1", got)
	}
	clock.Add(10 * time.Second)
	if got, _ := a.Acquire(ctx, s); got != 2 {
		t.Errorf("a renewal: term %d, want 2", got)
	}
	if held, _ := a.Holds(ctx, s, 1); held {
		t.Error("an old term still counts as held")
	}
	if held, _ := a.Holds(ctx, s, 2); !held {
		t.Error("the current term is not held")
	}
	// a stops renewing; once the lease runs out, b takes the next term and
	// a's fencing check fails.
	clock.Add(31 * time.Second)
	tb, err := b.Acquire(ctx, s)
	if err != nil || tb != 3 {
		t.Fatalf("b after expiry: term %d, %v", tb, err)
	}
	if held, _ := a.Holds(ctx, s, 2); held {
		t.Error("a still holds after b took over")
	}
	if got, _ := a.Acquire(ctx, s); got != 0 {
		t.Errorf("a while b holds: term %d", got)
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
			l := &LeaderLock{NodeID: string(rune('a' + i)), TTL: time.Minute, Now: clock.Now}
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
	l := &LeaderLock{NodeID: "a", TTL: time.Minute, Now: time.Now}
	if got, err := l.Acquire(t.Context(), s); err != nil || got != 8 {
		t.Errorf("Acquire over junk: term %d, %v", got, err)
	}
}

// A released lock is free at once, and its old term no longer holds.
func TestLeaderLockRelease(t *testing.T) {
	s := openLockStore(t)
	ctx := t.Context()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := &LeaderLock{NodeID: "a", TTL: 30 * time.Second, Now: clock.Now}
	b := &LeaderLock{NodeID: "b", TTL: 30 * time.Second, Now: clock.Now}
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
	if tb, err := b.Acquire(ctx, s); err != nil || tb != 3 {
		t.Fatalf("b right after the release: term %d, %v; want 3", tb, err)
	}
}

// A lock written by a newer etcd-manager is never taken or misread.
func TestLeaderLockNewerFormat(t *testing.T) {
	s := openLockStore(t)
	ctx := t.Context()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if err := s.Create(ctx, lockKey(4), []byte(`{"format":2,"nodeId":"new","acquired":"2020-01-01T00:00:00Z","ttl":1}`)); err != nil {
		t.Fatal(err)
	}
	a := &LeaderLock{NodeID: "a", TTL: 30 * time.Second, Now: clock.Now}
	term, err := a.Acquire(ctx, s)
	if !errors.Is(err, spec.ErrNewerFormat) || term != 0 {
		t.Fatalf("Acquire over a newer lock = %d, %v; want 0 and ErrNewerFormat", term, err)
	}
	if _, err := s.Read(ctx, lockKey(5)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a newer term was written over the newer lock: %v", err)
	}
}
