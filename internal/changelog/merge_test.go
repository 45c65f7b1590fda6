package changelog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/store"
)

// hdr is a header for the planner: chain values name revisions, so
// consecutive segments chain.
func hdr(first, last int64, level int, at time.Duration, base bool) Header {
	h := Header{Format: FormatVersion, Timeline: "tl1", Level: level, First: first, Last: last, FirstTime: int64(at), LastTime: int64(at),
		BodySize: 100, Prev: fmt.Sprint("c", first-1), Chain: fmt.Sprint("c", last)}
	if base {
		h.Base = &Base{Backup: "b", Revision: first - 1}
	}
	return h
}

func TestPlanMerge(t *testing.T) {
	const m, hour = time.Minute, time.Hour
	windows := []time.Duration{m, hour}
	type want struct {
		merges  [][]int64 // first revisions of each merge's sources, with its level first
		covered [][]int64 // the covering segment's first revision, then its sources'
	}
	broken := hdr(30, 39, 0, 3*time.Second, false)
	broken.Prev = "other"
	big := func(h Header) Header { h.BodySize = 200; return h }
	tests := []struct {
		name string
		segs []Header
		now  time.Duration
		want want
	}{
		{"a closed minute is merged",
			[]Header{hdr(10, 19, 0, 0, true), hdr(20, 29, 0, time.Second, false), hdr(30, 39, 0, 2*time.Second, false)},
			m + 10*time.Second, want{merges: [][]int64{{1, 10, 20, 30}}}},
		{"a minute within its grace waits",
			[]Header{hdr(10, 19, 0, 0, true), hdr(20, 29, 0, time.Second, false)},
			m + time.Second, want{}},
		{"the open minute waits",
			[]Header{hdr(10, 19, 0, 0, false), hdr(20, 29, 0, time.Second, false), hdr(30, 39, 0, m, false), hdr(40, 49, 0, m+time.Second, false)},
			m + 30*time.Second, want{merges: [][]int64{{1, 10, 20}}}},
		{"a lone segment is left",
			[]Header{hdr(10, 19, 0, 0, false), hdr(20, 29, 0, m, false)},
			3 * m, want{}},
		{"a gap splits",
			[]Header{hdr(10, 19, 0, 0, false), hdr(20, 29, 0, 1, false), hdr(40, 49, 0, 2, false), hdr(50, 59, 0, 3, false)},
			2 * m, want{merges: [][]int64{{1, 10, 20}, {1, 40, 50}}}},
		{"a run start splits",
			[]Header{hdr(10, 19, 0, 0, false), hdr(20, 29, 0, 1, false), hdr(30, 39, 0, 2, true), hdr(40, 49, 0, 3, false)},
			2 * m, want{merges: [][]int64{{1, 10, 20}, {1, 30, 40}}}},
		{"a broken chain splits",
			[]Header{hdr(10, 19, 0, 0, false), hdr(20, 29, 0, 1, false), broken, hdr(40, 49, 0, 4, false)},
			2 * m, want{merges: [][]int64{{1, 10, 20}, {1, 30, 40}}}},
		{"the size bound splits",
			[]Header{big(hdr(10, 19, 0, 0, false)), big(hdr(20, 29, 0, 1, false)), big(hdr(30, 39, 0, 2, false)), big(hdr(40, 49, 0, 3, false))},
			2 * m, want{merges: [][]int64{{1, 10, 20}, {1, 30, 40}}}},
		{"segments a merged one holds are covered, not merged again",
			[]Header{hdr(10, 39, 1, 0, true), hdr(10, 19, 0, 0, true), hdr(20, 29, 0, 1, false), hdr(30, 39, 0, 2, false), hdr(40, 49, 0, m, false)},
			2 * m, want{covered: [][]int64{{10, 10, 20, 30}}}},
		{"a closed hour is merged per hour, not per minute",
			[]Header{hdr(10, 39, 1, 0, true), hdr(40, 49, 0, m, false), hdr(50, 59, 0, m+1, false), hdr(60, 69, 0, hour, false)},
			hour + m, want{merges: [][]int64{{2, 10, 40, 50}}}},
		{"an hour merge covers minute merges",
			[]Header{hdr(10, 59, 2, 0, true), hdr(10, 39, 1, 0, true), hdr(40, 49, 0, m, false), hdr(60, 69, 0, hour, false)},
			hour + m, want{covered: [][]int64{{10, 10, 40}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planMerge(tt.segs, windows, time.Unix(0, int64(tt.now)), 450)
			var got want
			for _, g := range p.Merges {
				fs := []int64{int64(g.Level)}
				for _, s := range g.Sources {
					fs = append(fs, s.First)
				}
				got.merges = append(got.merges, fs)
			}
			for _, c := range p.Covered {
				fs := []int64{c.By.First}
				for _, s := range c.Sources {
					fs = append(fs, s.First)
				}
				got.covered = append(got.covered, fs)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("plan = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// fileStore opens a file:// store in a temporary directory.
func fileStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), "file://"+t.TempDir(), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// storeSegments writes segments of size revisions from first to last
// into s, revision r observed at at(r), and returns their headers.
func storeSegments(t *testing.T, s Store, prev []byte, base *Base, first, last, size int64, at func(int64) time.Duration) ([]Header, []byte) {
	t.Helper()
	dir := t.TempDir()
	var out []Header
	for f := first; f <= last; f += size {
		b := base
		if f != first {
			b = nil
		}
		w, err := newSegmentWriter(dir, "tl1", prev, f, b)
		if err != nil {
			t.Fatal(err)
		}
		for r := f; r < f+size && r <= last; r++ {
			rec := Record{Kind: KindRevision, Revision: r, Time: int64(at(r)), Events: []Event{{Value: fmt.Appendf(nil, "put %d", r)}}}
			if err := w.add(rec); err != nil {
				t.Fatal(err)
			}
			if r%3 == 0 {
				if err := w.add(Record{Kind: KindGrant, Revision: r, Lease: r, TTL: 30}); err != nil {
					t.Fatal(err)
				}
			}
		}
		h, err := w.cut()
		if err != nil {
			t.Fatal(err)
		}
		sp := spooled{Header: h, path: filepath.Join(dir, spoolName("tl1", f))}
		rd, err := sp.open()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.CreateFrom(context.Background(), KeyOf(h), rd); err != nil {
			t.Fatal(err)
		}
		rd.Close()
		out = append(out, h)
		prev = w.chain
	}
	return out, prev
}

// records reads every record of the timeline's segments, as Apply would
// take them: highest level first, each revision once.
func records(t *testing.T, s Store) []Record {
	t.Helper()
	refs, err := List(context.Background(), s, "tl1")
	if err != nil {
		t.Fatal(err)
	}
	var out []Record
	var covered int64
	for _, ref := range refs {
		seg, rc, err := openSegment(context.Background(), s, ref, nil)
		if err != nil {
			t.Fatal(err)
		}
		skip := seg.Header.Last <= covered
		for {
			rec, err := seg.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if !skip {
				for i := range rec.Events {
					rec.Events[i].Value = bytes.Clone(rec.Events[i].Value)
				}
				out = append(out, rec)
			}
		}
		rc.Close()
		covered = max(covered, seg.Header.Last)
	}
	return out
}

func keys(t *testing.T, s Store) []string {
	t.Helper()
	refs, err := List(context.Background(), s, "tl1")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range refs {
		out = append(out, r.Key[len(Prefix+"tl1/"):])
	}
	return out
}

func TestMerger(t *testing.T) {
	ctx := context.Background()
	s := fileStore(t)
	base := &Base{Backup: "b", Revision: 9}
	// Revisions 10..69, 5 per segment, 12 per minute of observed time
	// (minutes 0 to 4).
	at := func(r int64) time.Duration { return time.Duration(r-10) * 5 * time.Second }
	_, _ = storeSegments(t, s, mustHex(RunStart("tl1", 9)), base, 10, 69, 5, at)
	before := records(t, s)
	m := &Merger{Store: s, Dir: t.TempDir(), Windows: []time.Duration{time.Minute, time.Hour}, Log: slog.New(slog.DiscardHandler)}

	// Minutes 0 to 3 are closed; minute 4 is open.
	res, err := m.Once(ctx, "tl1", time.Unix(0, int64(4*time.Minute+10*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if res != (MergeResult{Merged: 4, Deleted: 10}) {
		t.Errorf("first pass = %+v, want 4 merged, 10 deleted", res)
	}
	// Segments start at 10, 15, ... 65, at 0s, 25s, ... 275s.
	wantKeys := []string{
		"00000000000000000010-L1-base.seg", "00000000000000000025-L1.seg", "00000000000000000035-L1.seg",
		"00000000000000000050-L1.seg", "00000000000000000060-L0.seg", "00000000000000000065-L0.seg",
	}
	if got := keys(t, s); !reflect.DeepEqual(got, wantKeys) {
		t.Errorf("after the minute merges: %v, want %v", got, wantKeys)
	}
	if after := records(t, s); !reflect.DeepEqual(after, before) {
		t.Errorf("merging changed the records: %d before, %d after", len(before), len(after))
	}
	runs, err := Runs(ctx, s, "tl1")
	if err != nil || len(runs) != 1 || runs[0].First != 10 || runs[0].Last != 69 || runs[0].Base == nil {
		t.Errorf("runs after merging = %+v, %v; want one run 10..69 after the base", runs, err)
	}

	// A second pass in the same minute has nothing to do.
	if res, err := m.Once(ctx, "tl1", time.Unix(0, int64(4*time.Minute+20*time.Second))); err != nil || res != (MergeResult{}) {
		t.Errorf("second pass = %+v, %v; want nothing done", res, err)
	}

	// The hour closes: one segment for it all.
	if res, err := m.Once(ctx, "tl1", time.Unix(0, int64(time.Hour+time.Minute))); err != nil || res != (MergeResult{Merged: 1, Deleted: 6}) {
		t.Errorf("hour pass = %+v, %v; want 1 merged, 6 deleted", res, err)
	}
	if got := keys(t, s); !reflect.DeepEqual(got, []string{"00000000000000000010-L2-base.seg"}) {
		t.Errorf("after the hour merge: %v", got)
	}
	if after := records(t, s); !reflect.DeepEqual(after, before) {
		t.Errorf("the hour merge changed the records")
	}
}

func TestMergerAfterACrash(t *testing.T) {
	ctx := context.Background()
	s := fileStore(t)
	at := func(r int64) time.Duration { return time.Duration(r) * time.Second }
	segs, _ := storeSegments(t, s, mustHex(RunStart("tl1", 9)), &Base{Backup: "b", Revision: 9}, 10, 39, 10, at)
	m := &Merger{Store: s, Dir: t.TempDir(), Windows: []time.Duration{time.Minute, time.Hour}, Log: slog.New(slog.DiscardHandler)}
	// The merged segment was written, then the agent died before the
	// deletes.
	if _, err := m.merge(ctx, mergeGroup{Level: 1, Sources: segs}); err != nil {
		t.Fatal(err)
	}
	// One source is not what the merged segment holds (tampered with
	// after the merge): it must stay.
	var tampered bytes.Buffer
	{
		w, err := newSegmentWriter(t.TempDir(), "tl1", mustHex(segs[1].Prev), 20, nil)
		if err != nil {
			t.Fatal(err)
		}
		for r := int64(20); r <= 29; r++ {
			if err := w.add(Record{Kind: KindRevision, Revision: r, Time: 1, Events: []Event{{Value: []byte("other")}}}); err != nil {
				t.Fatal(err)
			}
		}
		h, err := w.cut()
		if err != nil {
			t.Fatal(err)
		}
		rd, _ := spooled{Header: h, path: filepath.Join(w.dir, spoolName("tl1", 20))}.open()
		io.Copy(&tampered, rd)
		rd.Close()
	}
	if err := s.Delete(ctx, KeyOf(segs[1])); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateFrom(ctx, KeyOf(segs[1]), &tampered); err != nil {
		t.Fatal(err)
	}
	res, err := m.Once(ctx, "tl1", time.Unix(0, int64(2*time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	if res != (MergeResult{Deleted: 2, Kept: 1}) {
		t.Errorf("pass after the crash = %+v, want 2 deleted, 1 kept", res)
	}
	want := []string{"00000000000000000010-L1-base.seg", "00000000000000000020-L0.seg"}
	if got := keys(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("left: %v, want %v", got, want)
	}
	// The next pass does not read them again, and still counts it.
	if res, err := m.Once(ctx, "tl1", time.Unix(0, int64(3*time.Minute))); err != nil || res != (MergeResult{Kept: 1}) {
		t.Errorf("the pass after: %+v, %v; want 1 kept", res, err)
	}
}

func TestPrune(t *testing.T) {
	ctx := context.Background()
	s := fileStore(t)
	at := func(r int64) time.Duration { return time.Duration(r) * time.Second }
	storeSegments(t, s, mustHex(RunStart("tl1", 9)), &Base{Backup: "b", Revision: 9}, 10, 59, 10, at)
	for _, tt := range []struct {
		floors map[string]int64
		want   []string
	}{
		{nil, []string{"00000000000000000010-L0-base.seg", "00000000000000000020-L0.seg", "00000000000000000030-L0.seg", "00000000000000000040-L0.seg", "00000000000000000050-L0.seg"}},
		{map[string]int64{"tl1": 29}, []string{"00000000000000000030-L0.seg", "00000000000000000040-L0.seg", "00000000000000000050-L0.seg"}},
		{map[string]int64{"tl1": 35}, []string{"00000000000000000030-L0.seg", "00000000000000000040-L0.seg", "00000000000000000050-L0.seg"}},
		// No backup of tl1 left, but its segments are newer than the
		// oldest kept backup: a listing may have missed tl1's.
		{map[string]int64{"other": 1}, []string{"00000000000000000030-L0.seg", "00000000000000000040-L0.seg", "00000000000000000050-L0.seg"}},
		// Older than every kept backup: gone.
		{map[string]int64{"other": 1}, nil},
	} {
		before := time.Unix(0, int64(60*time.Second))
		if tt.want != nil && tt.floors["other"] == 1 {
			before = time.Unix(0, int64(59*time.Second)) // the newest segment's last revision was observed at 59s
		}
		if _, err := Prune(ctx, s, tt.floors, before); err != nil {
			t.Fatal(err)
		}
		if got := keys(t, s); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("floors %v: left %v, want %v", tt.floors, got, tt.want)
		}
	}
}

func TestHistory(t *testing.T) {
	ctx := context.Background()
	s := fileStore(t)
	const a, b, c = "AAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBB", "CCCCCCCCCCCCCCCC"
	for _, br := range []Branch{
		{Timeline: b, Parent: a, Revision: 100, Time: time.Unix(10, 0).UTC()},
		{Timeline: c, Parent: b, Revision: 150, BumpRevision: 1000, Time: time.Unix(20, 0).UTC()},
	} {
		if err := WriteBranch(ctx, s, br); err != nil {
			t.Fatal(err)
		}
	}
	// Written once: a retried restore does not change it.
	if err := WriteBranch(ctx, s, Branch{Timeline: c, Parent: a, Revision: 5, Time: time.Unix(30, 0)}); err != nil {
		t.Fatal(err)
	}
	h, err := History(ctx, s, c)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range h {
		s := l.Timeline
		if l.Branch != nil {
			s += fmt.Sprintf("<-%s@%d..%d", l.Branch.Parent, l.Branch.Revision, l.Branch.Start())
		}
		got = append(got, s)
	}
	want := []string{c + "<-" + b + "@150..1150", b + "<-" + a + "@100..100", a}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("history = %v, want %v", got, want)
	}

	// Bad records are refused, not followed.
	for name, data := range map[string]string{
		"not JSON":        "{",
		"another's":       `{"timeline":"` + b + `","parent":"` + a + `","revision":1}`,
		"its own parent":  `{"timeline":"` + a + `","parent":"` + a + `","revision":1}`,
		"no revision":     `{"timeline":"` + a + `","parent":"` + b + `"}`,
		"a path as token": `{"timeline":"` + a + `","parent":"../x","revision":1}`,
	} {
		if err := s.Write(ctx, BranchKey(a), []byte(data)); err != nil {
			t.Fatal(err)
		}
		if _, err := History(ctx, s, c); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: history = %v, want ErrCorrupt", name, err)
		}
	}
	// A loop is refused.
	if err := s.Write(ctx, BranchKey(a), []byte(`{"timeline":"`+a+`","parent":"`+c+`","revision":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := History(ctx, s, c); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a loop: history = %v, want ErrCorrupt", err)
	}
}

func TestSpoolIsLocked(t *testing.T) {
	dir := t.TempDir()
	s := fileStore(t)
	if _, err := New(Default(), dir, s, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Default(), dir, s, slog.New(slog.DiscardHandler)); !errors.Is(err, ErrSpoolBusy) {
		t.Errorf("a second capture on one spool: %v, want ErrSpoolBusy", err)
	}
}

// Two writers of the same revisions observe them at different times; the
// chain does not depend on it, so their segments join and trim.
func TestChainIgnoresObservedTime(t *testing.T) {
	var chains []string
	for _, at := range []int64{1000, 99999} {
		w, err := newSegmentWriter(t.TempDir(), "tl1", mustHex(RunStart("tl1", 9)), 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		for r := int64(10); r <= 12; r++ {
			if err := w.add(Record{Kind: KindRevision, Revision: r, Time: at + r, Events: []Event{{Value: []byte("v")}}}); err != nil {
				t.Fatal(err)
			}
		}
		h, err := w.cut()
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := readAll(objectBytes(t, spooled{Header: h, path: filepath.Join(w.dir, spoolName("tl1", 10))})); err != nil {
			t.Fatalf("read back: %v", err)
		}
		chains = append(chains, h.Chain)
	}
	if chains[0] != chains[1] {
		t.Errorf("the same revisions observed at other times chain to %s and %s", chains[0], chains[1])
	}
}

// A format 1 segment, whose chain covered the observed time, still reads.
func TestFormat1StillReads(t *testing.T) {
	prev := mustHex(RunStart("tl1", 9))
	chain := prev
	var body []byte
	for r := int64(10); r <= 11; r++ {
		rec := AppendRecord(nil, Record{Kind: KindRevision, Revision: r, Time: 5 + r, Events: []Event{{Value: []byte("v")}}})
		chain = NextChain(chain, rec)
		body = append(body, rec...)
	}
	sum := sha256.Sum256(body)
	h := Header{Format: 1, Timeline: "tl1", First: 10, Last: 11, FirstTime: 15, LastTime: 16, Records: 2, BodySize: int64(len(body)),
		SHA256: hex.EncodeToString(sum[:]), Prev: hex.EncodeToString(prev), Chain: hex.EncodeToString(chain)}
	line, _ := json.Marshal(h)
	if recs, _, err := readAll(append(append(line, '\n'), body...)); err != nil || len(recs) != 2 {
		t.Errorf("format 1: %d records, %v", len(recs), err)
	}
	h.Format = 2
	line, _ = json.Marshal(h)
	if _, _, err := readAll(append(append(line, '\n'), body...)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("the same body as format 2: %v, want a broken chain", err)
	}
}
