package changelog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
)

// Run is a stretch of a timeline's segments with no gap: capture started
// it after a full backup (Base) and carried on without a break.
type Run struct {
	Base *Base
	// First and Last are its revisions, FirstTime and LastTime when
	// capture observed them.
	First, Last         int64
	FirstTime, LastTime time.Time
	refs                []Ref
}

// Runs reads a timeline's runs, oldest first, from its listing and the
// headers at the runs' ends.
func Runs(ctx context.Context, s Store, timeline string) ([]Run, error) {
	return relisting(func() ([]Run, error) { return runs(ctx, s, timeline) })
}

// relisting runs f again when a segment it listed was gone by the time
// it read it: merges delete segments once a merged one holds them.
func relisting[T any](f func() (T, error)) (T, error) {
	var v T
	var err error
	for range 3 {
		if v, err = f(); !isNotFound(err) {
			break
		}
	}
	return v, err
}

func runs(ctx context.Context, s Store, timeline string) ([]Run, error) {
	refs, err := List(ctx, s, timeline)
	if err != nil {
		return nil, err
	}
	var runs []Run
	for _, r := range refs {
		if len(runs) == 0 || r.RunStart {
			runs = append(runs, Run{})
		}
		cur := &runs[len(runs)-1]
		if n := len(cur.refs); n > 0 && cur.refs[n-1].First == r.First {
			continue // another level of the same stretch
		}
		cur.refs = append(cur.refs, r)
	}
	for i := range runs {
		run := &runs[i]
		first, err := ReadHeaderAt(ctx, s, run.refs[0].Key)
		if err != nil {
			return nil, err
		}
		last := first
		if len(run.refs) > 1 {
			if last, err = ReadHeaderAt(ctx, s, run.refs[len(run.refs)-1].Key); err != nil {
				return nil, err
			}
		}
		run.Base, run.First, run.FirstTime = first.Base, first.First, time.Unix(0, first.FirstTime)
		run.Last, run.LastTime = last.Last, time.Unix(0, last.LastTime)
	}
	return runs, nil
}

// RevisionAt is the last revision of the timeline captured at or before
// t, and false when none was. It reads the times inside one segment, so
// an encrypted one needs its key in keys (ErrNoKey otherwise).
func RevisionAt(ctx context.Context, s Store, timeline string, t time.Time, keys *crypt.Keyring) (int64, bool, error) {
	type found struct {
		rev int64
		ok  bool
	}
	f, err := relisting(func() (found, error) {
		rev, ok, err := revisionAt(ctx, s, timeline, t, keys)
		return found{rev, ok}, err
	})
	return f.rev, f.ok, err
}

func revisionAt(ctx context.Context, s Store, timeline string, t time.Time, keys *crypt.Keyring) (int64, bool, error) {
	runs, err := runs(ctx, s, timeline)
	if err != nil {
		return 0, false, err
	}
	want := t.UnixNano()
	for i := len(runs) - 1; i >= 0; i-- {
		run := runs[i]
		if run.FirstTime.After(t) {
			continue
		}
		if !run.LastTime.After(t) {
			return run.Last, true, nil
		}
		// The segment that holds t: the last whose first revision was
		// observed at or before it.
		lo, hi := 0, len(run.refs)-1
		for lo < hi {
			mid := (lo + hi + 1) / 2
			h, err := ReadHeaderAt(ctx, s, run.refs[mid].Key)
			if err != nil {
				return 0, false, err
			}
			if h.FirstTime <= want {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		return revisionIn(ctx, s, run.refs[lo], want, keys)
	}
	return 0, false, nil
}

// revisionIn scans one segment for the last revision observed at or
// before want.
func revisionIn(ctx context.Context, s Store, ref Ref, want int64, keys *crypt.Keyring) (int64, bool, error) {
	seg, rc, err := openSegment(ctx, s, ref, keys)
	if err != nil {
		return 0, false, err
	}
	defer rc.Close()
	var rev int64
	for {
		rec, err := seg.Next()
		if errors.Is(err, io.EOF) {
			return rev, rev > 0, nil
		}
		if err != nil {
			return 0, false, err
		}
		if rec.Kind != KindRevision {
			continue
		}
		if rec.Time > want {
			return rev, rev > 0, nil
		}
		rev = rec.Revision
	}
}

// Gap says where a timeline's capture has a hole: revisions After+1 to
// Before-1 cannot be reached (they lie between one run's end and the next
// run's base backup).
type Gap struct{ After, Before int64 }

// Gaps lists the holes between runs.
func Gaps(runs []Run) []Gap {
	var out []Gap
	for i := 1; i < len(runs); i++ {
		prev, next := runs[i-1], runs[i]
		if prev.Last+1 < next.First {
			out = append(out, Gap{After: prev.Last, Before: next.First})
		}
	}
	return out
}

// Span is a stretch of revisions a restore can reach: from a kept full
// backup at From on, through captured changes without a hole, to To.
type Span struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

// Reachable computes what can be restored from the full backups kept (at
// the revisions backups, in any order) and the runs: a run whose base
// backup retention removed is reachable only from a kept backup inside
// it. The holes between the spans cannot be restored, whatever the runs
// hold. It is pure.
func Reachable(runs []Run, backups []int64) []Span {
	sorted := slices.Clone(backups)
	slices.Sort(sorted)
	var out []Span
	for _, b := range sorted {
		to := reach(runs, b)
		if n := len(out); n > 0 && b <= out[n-1].To+1 {
			out[n-1].To = max(out[n-1].To, to)
			continue
		}
		out = append(out, Span{From: b, To: to})
	}
	return out
}

// Holes are the revisions between spans, which cannot be restored.
func Holes(spans []Span) []Gap {
	var out []Gap
	for i := 1; i < len(spans); i++ {
		out = append(out, Gap{After: spans[i-1].To, Before: spans[i].From})
	}
	return out
}

// reach is the last revision the runs carry a full backup at revision
// from to without a hole.
func reach(runs []Run, from int64) int64 {
	covered := from
	for _, r := range runs {
		if r.Last <= covered {
			continue
		}
		if r.First > covered+1 {
			break
		}
		covered = r.Last
	}
	return covered
}

// CheckReach says whether revision to can be reached from a full backup
// at revision from with the runs: ErrRange when it lies beyond the last
// captured revision, ErrGap when a hole lies between.
func CheckReach(runs []Run, from, to int64) error {
	covered := reach(runs, from)
	if to <= covered {
		return nil
	}
	for _, r := range runs {
		if r.Last > covered { // reach stopped here: the run starts after a hole
			return fmt.Errorf("%w: revisions %d to %d were not captured (capture started again after a full backup at %d); restore from that backup or a point after it", ErrGap, covered+1, r.First-1, r.First-1)
		}
	}
	return fmt.Errorf("%w: revision %d is after the last captured revision %d", ErrRange, to, covered)
}
