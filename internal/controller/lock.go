package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/procedure"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// lockPrefix holds the leader lock's terms: control/leader/<term>.
const lockPrefix = "control/leader/"

// lockStore is the part of the backup store the lock needs.
type lockStore interface {
	Create(ctx context.Context, key string, data []byte) error
	Read(ctx context.Context, key string) ([]byte, error)
	List(ctx context.Context, prefix, delimiter string) ([]string, error)
	Delete(ctx context.Context, key string) error
}

// lockRecord is one term of the lock.
type lockRecord struct {
	// Format is the record's format (see spec.FormatVersion).
	Format   int           `json:"format,omitempty"`
	NodeID   string        `json:"nodeId"`
	Acquired time.Time     `json:"acquired"`
	TTL      time.Duration `json:"ttl"`
}

// LeaderLock decides which agent leads while etcd has no quorum (first
// boot, total loss). Each term is an object created only if absent, so at
// most one agent wins a term; the term number is the fencing token. A
// holder renews by creating the next term before its lease runs out.
//
// Leases compare the holder's clock with the reader's, so clocks must
// agree to well within the TTL. Safety does not rest on the lock alone:
// cluster creation is also fenced by the once-only creation marker.
type LeaderLock struct {
	NodeID string
	TTL    time.Duration
	Now    func() time.Time
}

// Acquire takes or renews the lock. It returns the term held, or 0 when
// another agent holds an unexpired lease.
func (l *LeaderLock) Acquire(ctx context.Context, s lockStore) (int64, error) {
	term, rec, err := l.latest(ctx, s)
	if err != nil {
		return 0, err
	}
	now := l.Now()
	expired := rec == nil || now.After(rec.Acquired.Add(rec.TTL))
	switch {
	case rec != nil && rec.NodeID == l.NodeID && !expired && now.Before(rec.Acquired.Add(rec.TTL/3)):
		return term, nil
	case rec != nil && rec.NodeID != l.NodeID && !expired:
		return 0, nil
	}
	// Free, expired, or ours and due for renewal: take the next term.
	next := term + 1
	data, err := json.Marshal(lockRecord{Format: spec.FormatVersion, NodeID: l.NodeID, Acquired: now.UTC(), TTL: l.TTL})
	if err != nil {
		return 0, fmt.Errorf("controller: encode lock: %w", err)
	}
	if err := s.Create(ctx, lockKey(next), data); err != nil {
		if errors.Is(err, store.ErrExists) {
			return 0, nil
		}
		return 0, fmt.Errorf("controller: take leader lock: %w", err)
	}
	l.gc(ctx, s, next)
	return next, nil
}

// Holds reports whether term is still the newest term and unexpired: the
// fencing check before a step that must not be taken twice.
func (l *LeaderLock) Holds(ctx context.Context, s lockStore, term int64) (bool, error) {
	latest, rec, err := l.latest(ctx, s)
	if err != nil {
		return false, err
	}
	return latest == term && rec != nil && rec.NodeID == l.NodeID && l.Now().Before(rec.Acquired.Add(rec.TTL)), nil
}

// Release gives the lock up early, when its holder no longer needs it
// (the cluster it was creating or restoring is up): it ends term with a
// newer term whose lease has already run out, so the next agent to need
// the lock takes it at once instead of waiting for the lease.
func (l *LeaderLock) Release(ctx context.Context, s lockStore, term int64) error {
	held, err := l.Holds(ctx, s, term)
	if err != nil || !held {
		return err
	}
	data, err := json.Marshal(lockRecord{Format: spec.FormatVersion, NodeID: l.NodeID, Acquired: l.Now().UTC(), TTL: 0})
	if err != nil {
		return fmt.Errorf("controller: encode lock: %w", err)
	}
	if err := s.Create(ctx, lockKey(term+1), data); err != nil && !errors.Is(err, store.ErrExists) {
		return fmt.Errorf("controller: release leader lock: %w", err)
	}
	return nil
}

func (l *LeaderLock) latest(ctx context.Context, s lockStore) (int64, *lockRecord, error) {
	terms, err := lockTerms(ctx, s)
	if err != nil {
		return 0, nil, err
	}
	if len(terms) == 0 {
		return 0, nil, nil
	}
	term := terms[len(terms)-1]
	data, err := s.Read(ctx, lockKey(term))
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return term, nil, nil
		}
		return 0, nil, fmt.Errorf("controller: read leader lock: %w", err)
	}
	var rec lockRecord
	if err := json.Unmarshal(data, &rec); err != nil || rec.NodeID == "" {
		// Junk in the lock counts as an expired lease, so it cannot wedge
		// leadership forever.
		return term, nil, nil
	}
	if err := spec.CheckFormat("the store lock "+lockKey(term), rec.Format); err != nil {
		// A newer etcd-manager holds it, or did: wait for an upgrade
		// rather than misread its lease.
		return 0, nil, err
	}
	return term, &rec, nil
}

// gc deletes old terms, keeping a few for debugging.
func (l *LeaderLock) gc(ctx context.Context, s lockStore, current int64) {
	terms, err := lockTerms(ctx, s)
	if err != nil {
		return
	}
	for _, t := range terms {
		if t < current-5 {
			_ = s.Delete(ctx, lockKey(t))
		}
	}
}

func lockTerms(ctx context.Context, s lockStore) ([]int64, error) {
	keys, err := s.List(ctx, lockPrefix, "")
	if err != nil {
		return nil, fmt.Errorf("controller: list leader lock: %w", err)
	}
	var terms []int64
	for _, k := range keys {
		t, err := strconv.ParseInt(strings.TrimPrefix(k, lockPrefix), 10, 64)
		if err == nil && t > 0 {
			terms = append(terms, t)
		}
	}
	sort.Slice(terms, func(i, j int) bool { return terms[i] < terms[j] })
	return terms, nil
}

func lockKey(term int64) string { return fmt.Sprintf("%s%020d", lockPrefix, term) }

// lease is this agent's hold on the store lock: the term it holds,
// shared by the loop (which takes, renews and releases the lock once a
// cycle) and the procedure runner (which renews it while a long step
// runs, and checks it before every step). It implements procedure.Fence.
type lease struct {
	lock  *LeaderLock
	store func() lockStore

	mu   sync.Mutex
	term int64
}

// Term is the term held, 0 for none.
func (l *lease) Term() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.term
}

// Acquire takes or renews the lock, once a cycle; it returns the term
// held, 0 when another agent holds it.
func (l *lease) Acquire(ctx context.Context, s lockStore) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	term, err := l.lock.Acquire(ctx, s)
	if err != nil {
		return 0, err
	}
	l.term = term
	return term, nil
}

// Release gives the lock up when its holder no longer needs it.
func (l *lease) Release(ctx context.Context, s lockStore) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == 0 {
		return nil
	}
	err := l.lock.Release(ctx, s, l.term)
	l.term = 0
	return err
}

// Hold checks that this agent still holds its term: the fencing check
// before a step that must not be taken twice.
func (l *lease) Hold(ctx context.Context) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	held, err := l.lock.Holds(ctx, l.store(), l.term)
	if err != nil {
		return 0, fmt.Errorf("controller: check the store lock: %w", err)
	}
	if !held {
		return 0, fmt.Errorf("%w: %w: the store lock (term %d) has passed to another agent", procedure.ErrFenced, ErrNotLeader, l.term)
	}
	return l.term, nil
}

// Renew renews the lock while a procedure step runs.
func (l *lease) Renew(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == 0 {
		return fmt.Errorf("%w: this agent holds no store lock", procedure.ErrFenced)
	}
	term, err := l.lock.Acquire(ctx, l.store())
	if err != nil {
		return fmt.Errorf("controller: renew the store lock: %w", err)
	}
	if term == 0 {
		return fmt.Errorf("%w: %w: the store lock (term %d) has passed to another agent", procedure.ErrFenced, ErrNotLeader, l.term)
	}
	l.term = term
	return nil
}
