package changelog

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
)

// Merging. Capture cuts a segment every 200ms: hundreds of thousands of
// objects a day. The capturing agent joins the segments of each closed
// window into one segment of the next level (by default per minute at
// level 1, per hour at level 2), reads the merged segment back from the
// store, checks its hash chain at every source's first and last
// revision, and only then deletes the sources. A crash anywhere leaves
// either the sources, or the sources and a merged segment that covers
// them: the next pass verifies it and deletes them.

// DefaultMergeWindows are the windows of levels 1 and 2.
var DefaultMergeWindows = []time.Duration{time.Minute, time.Hour}

// maxMergedBytes bounds a merged segment's body: a window with more is
// merged into several segments.
const maxMergedBytes = 256 << 20

// mergeGrace is how long after a window closes its segments wait to be
// merged: the last one cut in it has been uploaded by then, unless the
// store was out (it then joins a later merge of the next level).
const mergeGrace = 5 * time.Second

// mergeGroup is one merge: consecutive segments of one window, joined
// into a segment of Level.
type mergeGroup struct {
	Level   int
	Sources []Header
}

// coveredSet is segments that a higher-level segment, By, holds: they go
// once By is verified against them.
type coveredSet struct {
	By      Header
	Sources []Header
}

// mergePlan is what one merge pass does.
type mergePlan struct {
	Merges  []mergeGroup
	Covered []coveredSet
}

// planMerge decides, from a timeline's segment headers in List order
// (by first revision, higher levels first), which segments are already
// held by a higher-level one and which closed windows to merge.
// windows[i] is the window of level i+1; maxBytes bounds a merged body.
func planMerge(segs []Header, windows []time.Duration, now time.Time, maxBytes int64) mergePlan {
	var p mergePlan
	// Every segment with a lower first revision comes first, so the
	// longest-reaching segment seen so far at each level says whether one
	// holds this one.
	var reach [10]*Header
	byKey := map[string]int{}
	var live []Header
	for i := range segs {
		h := segs[i]
		var by *Header
		for l := 9; l > h.Level; l-- {
			if r := reach[l]; r != nil && r.Last >= h.Last {
				by = r
				break
			}
		}
		if by != nil {
			k := KeyOf(*by)
			j, ok := byKey[k]
			if !ok {
				j = len(p.Covered)
				byKey[k] = j
				p.Covered = append(p.Covered, coveredSet{By: *by})
			}
			p.Covered[j].Sources = append(p.Covered[j].Sources, h)
			continue
		}
		if r := reach[h.Level]; r == nil || h.Last > r.Last {
			reach[h.Level] = &segs[i]
		}
		live = append(live, h)
	}

	// Higher levels first: a window about to be merged per hour is not
	// merged per minute on the way.
	taken := map[string]bool{}
	for level := len(windows); level >= 1; level-- {
		w := int64(windows[level-1])
		var group []Header
		var size int64
		flush := func() {
			if len(group) >= 2 && time.Unix(0, (group[0].FirstTime/w+1)*w).Add(mergeGrace).Before(now) {
				p.Merges = append(p.Merges, mergeGroup{Level: level, Sources: group})
				for _, h := range group {
					taken[KeyOf(h)] = true
				}
			}
			group, size = nil, 0
		}
		for _, h := range live {
			// A format 1 segment chains differently: it is left as it is.
			if h.Level >= level || taken[KeyOf(h)] || h.Format < 2 {
				flush()
				continue
			}
			if n := len(group); n > 0 {
				last := group[n-1]
				if h.FirstTime/w != group[0].FirstTime/w || h.Base != nil || h.First != last.Last+1 ||
					h.Prev != last.Chain || size+h.BodySize > maxBytes {
					flush()
				}
			}
			group = append(group, h)
			size += h.BodySize
		}
		flush()
	}
	return p
}

// Merger merges the segments of a timeline in the store.
type Merger struct {
	Store Store
	// Dir is scratch space for the merged segment being written.
	Dir string
	// Windows are the merge windows of levels 1, 2, ...
	Windows []time.Duration
	Log     *slog.Logger
	// Keys decrypt the sources and, with a writing key, encrypt the
	// merged segments.
	Keys *crypt.Keyring

	// Segments never change once written: their headers are kept, and so
	// are the sources found to disagree with what covers them (by source
	// key, the covering key), so they are not read again each pass.
	headers  map[string]Header
	disagree map[string]string
}

// MergeResult counts what a pass did.
type MergeResult struct {
	// Merged is the number of merged segments written, Deleted the number
	// of segments deleted once a merged one was verified to hold them.
	Merged, Deleted int
	// Kept counts segments a merged one should hold but does not agree
	// with: they stay, and the disagreement is logged.
	Kept int
}

// Once runs one merge pass over timeline.
func (m *Merger) Once(ctx context.Context, timeline string, now time.Time) (MergeResult, error) {
	var res MergeResult
	segs, err := m.list(ctx, timeline)
	if err != nil {
		return res, err
	}
	p := planMerge(segs, m.Windows, now, maxMergedBytes)
	for _, g := range p.Merges {
		by, err := m.merge(ctx, g)
		if err != nil {
			return res, err
		}
		res.Merged++
		if err := m.verifyAndDelete(ctx, by, g.Sources, &res); err != nil {
			return res, err
		}
	}
	for _, c := range p.Covered {
		var left []Header
		for _, src := range c.Sources {
			if m.disagree[KeyOf(src)] == KeyOf(c.By) {
				res.Kept++
			} else {
				left = append(left, src)
			}
		}
		if len(left) == 0 {
			continue
		}
		if err := m.verifyAndDelete(ctx, c.By, left, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// list reads the headers of timeline's segments, in List order.
func (m *Merger) list(ctx context.Context, timeline string) ([]Header, error) {
	refs, err := List(ctx, m.Store, timeline)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]Header, len(refs))
	out := make([]Header, 0, len(refs))
	for _, r := range refs {
		h, ok := m.headers[r.Key]
		if !ok {
			if h, err = ReadHeaderAt(ctx, m.Store, r.Key); err != nil {
				if isNotFound(err) {
					continue // deleted since the listing
				}
				return nil, err
			}
		}
		seen[r.Key] = h
		out = append(out, h)
	}
	m.headers = seen
	return out, nil
}

// merge writes the merged segment of g into the store, create-once, and
// returns its header: the one already there if another writer merged
// the same window first.
func (m *Merger) merge(ctx context.Context, g mergeGroup) (Header, error) {
	if err := os.RemoveAll(m.Dir); err != nil {
		return Header{}, fmt.Errorf("changelog: merge: %w", err)
	}
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return Header{}, fmt.Errorf("changelog: merge: %w", err)
	}
	first := g.Sources[0]
	prev, err := hex.DecodeString(first.Prev)
	if err != nil {
		return Header{}, fmt.Errorf("%w: %s: prev is not hex", ErrCorrupt, KeyOf(first))
	}
	sw, err := newSegmentWriter(m.Dir, first.Timeline, prev, first.First, first.Base)
	if err != nil {
		return Header{}, err
	}
	sw.header.Level = g.Level
	for _, src := range g.Sources {
		if err := m.copyInto(ctx, sw, src); err != nil {
			sw.abandon()
			return Header{}, err
		}
	}
	h, err := sw.cut()
	if err != nil {
		return h, err
	}
	merged := spooled{Header: h, path: filepath.Join(m.Dir, spoolName(h.Timeline, h.First))}
	defer merged.remove()
	r, err := merged.object(m.Keys)
	if err != nil {
		return h, err
	}
	key := KeyOf(h)
	err = m.Store.CreateFrom(ctx, key, r)
	r.Close()
	if isExists(err) {
		return ReadHeaderAt(ctx, m.Store, key)
	}
	if err != nil {
		return h, fmt.Errorf("changelog: merge: upload %s: %w", key, err)
	}
	m.Log.Info("segments merged", "key", key, "segments", len(g.Sources), "first-revision", h.First, "last-revision", h.Last, "bytes", h.BodySize)
	return h, nil
}

// eachRecord reads the segment h describes from the store, checked as
// it goes, and calls f with each record and the reader (for its chain).
func (m *Merger) eachRecord(ctx context.Context, h Header, f func(Record, *Reader) error) error {
	ref, _ := parseKey(KeyOf(h))
	seg, rc, err := openSegment(ctx, m.Store, ref, m.Keys)
	if err != nil {
		return err
	}
	defer rc.Close()
	if seg.Header.SHA256 != h.SHA256 {
		return fmt.Errorf("%w: %s changed since it was listed", ErrCorrupt, ref.Key)
	}
	for {
		rec, err := seg.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := f(rec, seg); err != nil {
			return err
		}
	}
}

// copyInto appends the records of src, read from the store and checked,
// to sw.
func (m *Merger) copyInto(ctx context.Context, sw *segmentWriter, src Header) error {
	if err := m.eachRecord(ctx, src, func(rec Record, _ *Reader) error { return sw.add(rec) }); err != nil {
		return err
	}
	if hex.EncodeToString(sw.chain) != src.Chain {
		return fmt.Errorf("%w: merging %s: the hash chain breaks", ErrCorrupt, KeyOf(src))
	}
	return nil
}

// verifyAndDelete reads by back from the store, whole, and deletes each
// source whose first and last revisions it holds with the same chain
// values: then it holds the same revisions, byte for byte.
func (m *Merger) verifyAndDelete(ctx context.Context, by Header, sources []Header, res *MergeResult) error {
	want := map[int64]bool{}
	for _, s := range sources {
		want[s.First-1], want[s.Last] = true, true
	}
	at := map[int64]string{by.First - 1: by.Prev}
	err := m.eachRecord(ctx, by, func(rec Record, seg *Reader) error {
		if rec.Kind == KindRevision && want[rec.Revision] {
			at[rec.Revision] = hex.EncodeToString(seg.Chain())
		}
		return nil
	})
	if err != nil {
		return err
	}
	byKey := KeyOf(by)
	for _, s := range sources {
		key := KeyOf(s)
		if s.First < by.First || s.Last > by.Last || at[s.First-1] != s.Prev || at[s.Last] != s.Chain {
			res.Kept++
			if m.disagree == nil {
				m.disagree = map[string]string{}
			}
			m.disagree[key] = byKey
			m.Log.Error("a merged segment does not hold what a segment it covers holds; keeping both",
				"merged", byKey, "segment", key, "first-revision", s.First, "last-revision", s.Last)
			continue
		}
		if err := m.Store.Delete(ctx, key); err != nil {
			return fmt.Errorf("changelog: merge: delete %s: %w", key, err)
		}
		delete(m.headers, key)
		res.Deleted++
	}
	return nil
}
