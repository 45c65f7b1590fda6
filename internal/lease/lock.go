package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// lockPrefix holds the leader lock's terms: control/leader/<term>.
const lockPrefix = "control/leader/"

// Store is the part of the backup store the lock needs.
type Store interface {
	Create(ctx context.Context, key string, data []byte) error
	Write(ctx context.Context, key string, data []byte) error
	ReadMax(ctx context.Context, key string, max int64) ([]byte, error)
	List(ctx context.Context, prefix, delimiter string) ([]string, error)
	Delete(ctx context.Context, key string) error
}

// record is one term of the lock, written by its holder only: created
// once when the term is taken, rewritten on each renewal and on release.
type record struct {
	// Format is the record's format (see spec.FormatVersion).
	Format int    `json:"format,omitempty"`
	NodeID string `json:"nodeId"`
	// Term is the term this record is for, the fencing token.
	Term int64 `json:"term,omitempty"`
	// Since is when the holder took the term.
	Since time.Time `json:"since,omitzero"`
	// Acquired is when the holder last renewed its lease, by its clock.
	Acquired time.Time `json:"acquired"`
	// TTL is the holder's lease, for agents before format 1 to read;
	// readers of format 1 use their own configured lease instead.
	TTL time.Duration `json:"ttl"`
	// Released is set when the holder gave the lock up.
	Released bool `json:"released,omitempty"`
}

// maxTerm is the largest term; a store whose lock reached it is refused
// rather than wrapped around. A record of a larger term is junk.
const maxTerm = spec.MaxTerm

// Lock decides which agent leads while etcd has no quorum (first
// boot, total loss, a restore). Each term is an object created only if
// absent, so at most one agent ever takes a term; the term number is the
// fencing token that every record and every call of the holder carries.
// The term changes only when the holder does: a holder renews its lease
// by rewriting its own term's record.
//
// A lease lasts TTL after its last renewal, as each agent reads it with
// its own TTL, never the record's, so that a record cannot claim the lock
// for longer than the cluster's agents allow. Leases compare the holder's
// clock with the reader's, so clocks must agree to well within the TTL;
// agents measure their offsets over the peer API and stop taking the
// lock when they do not. Safety does not rest on the lock alone: the
// choices of a procedure are created once in the store, records of an
// older term are ignored, and nodes refuse calls of an older term.
type Lock struct {
	NodeID string
	TTL    time.Duration
	Now    func() time.Time
	// Floor, when set, is a term the next one must exceed: the highest
	// term the nodes report having obeyed, or a status was written under.
	// If control/leader/ is ever lost (a new bucket, an expiry rule, an
	// operator), terms start above the old ones again instead of at 1,
	// which every node would refuse.
	Floor func() int64
}

// expired reports whether rec's lease has run out for this reader.
func (l *Lock) expired(rec *record, now time.Time) bool {
	switch {
	case rec == nil || rec.Released:
		return true
	case rec.Format == 0 && rec.TTL == 0:
		// An agent before format 1 released it so.
		return true
	case rec.Acquired.After(now.Add(l.TTL)):
		// Renewed more than a lease ahead of this reader's clock: no
		// holder whose clock agrees with ours wrote it, and taken at its
		// word it would hold the lock for as long as it says.
		return true
	}
	return !now.Before(rec.Acquired.Add(l.TTL))
}

// Acquire takes or renews the lock. It returns the term held, or 0 when
// another agent holds an unexpired lease.
func (l *Lock) Acquire(ctx context.Context, s Store) (int64, error) {
	term, _, err := l.acquire(ctx, s, false)
	return term, err
}

// acquire is Acquire, and says whether it wrote the record (took the
// term, or renewed the lease); renew forces a renewal of a term held.
func (l *Lock) acquire(ctx context.Context, s Store, renew bool) (int64, bool, error) {
	term, rec, err := l.latest(ctx, s)
	if err != nil {
		return 0, false, err
	}
	now := l.Now()
	expired := l.expired(rec, now)
	var floor int64
	if l.Floor != nil {
		floor = l.Floor()
	}
	switch {
	case rec != nil && rec.NodeID == l.NodeID && !expired && term >= floor:
		// A floor equal to the term held is the holder's own doing: the
		// statuses it wrote, the nodes that obeyed it.
		if !renew && now.Before(rec.Acquired.Add(l.TTL/3)) {
			return term, false, nil
		}
		// Ours and due: renew in place; the term stays.
		renewed := *rec
		renewed.Acquired, renewed.TTL = now.UTC(), l.TTL
		if err := l.write(ctx, s, term, renewed, false); err != nil {
			return 0, false, err
		}
		return term, true, nil
	case rec != nil && rec.NodeID != l.NodeID && !expired:
		return 0, false, nil
	}
	// Free, released, expired, or ours but below the floor: take the next
	// term.
	next := max(term, floor)
	if next >= maxTerm {
		return 0, false, fmt.Errorf("lease: the store lock's term %d is at its maximum; remove %s by hand", next, lockPrefix)
	}
	next++
	rec = &record{NodeID: l.NodeID, Term: next, Since: now.UTC(), Acquired: now.UTC(), TTL: l.TTL}
	if err := l.write(ctx, s, next, *rec, true); err != nil {
		if errors.Is(err, store.ErrExists) {
			return 0, false, nil
		}
		return 0, false, err
	}
	l.gc(ctx, s, next)
	return next, true, nil
}

// write stores rec as term's record: created once for a new term,
// rewritten by its holder after.
func (l *Lock) write(ctx context.Context, s Store, term int64, rec record, create bool) error {
	rec.Format = spec.FormatBase
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("lease: encode lock: %w", err)
	}
	if create {
		err = s.Create(ctx, lockKey(term), data)
	} else {
		err = s.Write(ctx, lockKey(term), data)
	}
	if err != nil && !errors.Is(err, store.ErrExists) {
		return fmt.Errorf("lease: leader lock term %d: %w", term, err)
	}
	return err
}

// Holds reports whether term is still the newest term, this agent's,
// and unexpired: the fencing check before a step that must not be taken
// twice.
func (l *Lock) Holds(ctx context.Context, s Store, term int64) (bool, error) {
	latest, rec, err := l.latest(ctx, s)
	if err != nil {
		return false, err
	}
	return term != 0 && latest == term && rec != nil && rec.NodeID == l.NodeID && !l.expired(rec, l.Now()), nil
}

// Release gives the lock up early, when its holder no longer needs it
// (the cluster it was creating or restoring is up): it marks its term
// released, so the next agent to need the lock takes the next term at
// once instead of waiting for the lease.
func (l *Lock) Release(ctx context.Context, s Store, term int64) error {
	latest, rec, err := l.latest(ctx, s)
	if err != nil {
		return err
	}
	if term == 0 || latest != term || rec == nil || rec.NodeID != l.NodeID || l.expired(rec, l.Now()) {
		return nil // not ours to release
	}
	released := *rec
	// TTL 0 is how agents before format 1 read a release.
	released.Acquired, released.TTL, released.Released = l.Now().UTC(), 0, true
	return l.write(ctx, s, term, released, false)
}

func (l *Lock) latest(ctx context.Context, s Store) (int64, *record, error) {
	terms, err := lockTerms(ctx, s)
	if err != nil {
		return 0, nil, err
	}
	if len(terms) == 0 {
		return 0, nil, nil
	}
	term := terms[len(terms)-1]
	data, err := s.ReadMax(ctx, lockKey(term), store.MaxRecordSize)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return term, nil, nil
	case errors.Is(err, store.ErrTooLarge):
		// Junk, like below: an expired lease.
		return term, nil, nil
	case err != nil:
		return 0, nil, fmt.Errorf("lease: read leader lock: %w", err)
	}
	var rec record
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
func (l *Lock) gc(ctx context.Context, s Store, current int64) {
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

func lockTerms(ctx context.Context, s Store) ([]int64, error) {
	keys, err := s.List(ctx, lockPrefix, "")
	if err != nil {
		return nil, fmt.Errorf("lease: list leader lock: %w", err)
	}
	var terms []int64
	for _, k := range keys {
		t, err := strconv.ParseInt(strings.TrimPrefix(k, lockPrefix), 10, 64)
		if err == nil && t > 0 && t <= maxTerm {
			terms = append(terms, t)
		}
	}
	sort.Slice(terms, func(i, j int) bool { return terms[i] < terms[j] })
	return terms, nil
}

func lockKey(term int64) string { return fmt.Sprintf("%s%020d", lockPrefix, term) }

// statusTermSlack is how far above every term seen a status's term may
// raise the floor: drivers whose statuses count took their terms one by
// one above the nodes' obeyed ones.
const statusTermSlack = 1 << 20

// StatusFloor is the term floor once a command status of term t is
// seen. A status far above every term seen (the nodes' obeyed terms and
// earlier statuses) was not written by a driver: one such object would
// otherwise push the terms to their maximum and wedge the lock.
func StatusFloor(floor, t int64, log *slog.Logger) int64 {
	if t > floor+statusTermSlack {
		log.Warn("ignoring a command status whose term is far above every term seen", "term", t, "floor", floor)
		return floor
	}
	return max(floor, t)
}
