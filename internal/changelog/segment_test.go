package changelog

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// spoolSegment writes a segment of revisions first..last into dir's
// spool and returns it, with one lease record in the middle.
func spoolSegment(t *testing.T, dir string, prev []byte, first, last int64, base *Base) spooled {
	t.Helper()
	w, err := newSegmentWriter(dir, "tl1", prev, first, base)
	if err != nil {
		t.Fatal(err)
	}
	for r := first; r <= last; r++ {
		rec := Record{Kind: KindRevision, Revision: r, Time: r * 1000,
			Events: []Event{{Value: []byte("put " + string(rune('a'+r%26)))}, {Tombstone: true, Value: []byte("del")}}}
		if err := w.add(rec); err != nil {
			t.Fatal(err)
		}
		if r == first {
			if err := w.add(Record{Kind: KindGrant, Revision: r, Lease: 7, TTL: 30}); err != nil {
				t.Fatal(err)
			}
		}
	}
	h, err := w.cut()
	if err != nil {
		t.Fatal(err)
	}
	return spooled{Header: h, path: filepath.Join(dir, spoolName("tl1", first))}
}

func objectBytes(t *testing.T, s spooled) []byte {
	t.Helper()
	r, err := s.open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func readAll(data []byte) ([]Record, *Reader, error) {
	rd, err := NewReader(bytes.NewReader(data), "seg", nil)
	if err != nil {
		return nil, nil, err
	}
	var out []Record
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out, rd, nil
		}
		if err != nil {
			return out, rd, err
		}
		for i := range rec.Events {
			rec.Events[i].Value = bytes.Clone(rec.Events[i].Value) // the reader reuses its buffer
		}
		out = append(out, rec)
	}
}

func TestSegmentRoundTrip(t *testing.T) {
	dir := t.TempDir()
	base := &Base{Backup: "b", Revision: 9}
	s := spoolSegment(t, dir, mustHex(RunStart("tl1", 9)), 10, 20, base)
	recs, rd, err := readAll(objectBytes(t, s))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 12 || recs[0].Revision != 10 || recs[1].Kind != KindGrant || recs[11].Revision != 20 {
		t.Fatalf("records: %d, first %+v", len(recs), recs[0])
	}
	if !recs[0].Events[1].Tombstone || string(recs[0].Events[0].Value) != "put k" {
		t.Fatalf("events: %+v", recs[0].Events)
	}
	if got := rd.Header; got.First != 10 || got.Last != 20 || got.Records != 12 || got.Base == nil || got.FirstTime != 10000 || got.LastTime != 20000 {
		t.Fatalf("header: %+v", got)
	}
	// The next segment's chain continues from this one's.
	next := spoolSegment(t, dir, mustHex(s.Header.Chain), 21, 25, nil)
	if next.Header.Prev != s.Header.Chain {
		t.Fatalf("prev %s, want %s", next.Header.Prev, s.Header.Chain)
	}
}

// Every kind of damage is refused, naming the segment.
func TestSegmentTampering(t *testing.T) {
	dir := t.TempDir()
	s := spoolSegment(t, dir, mustHex(RunStart("tl1", 9)), 10, 20, &Base{Backup: "b", Revision: 9})
	good := objectBytes(t, s)
	nl := bytes.IndexByte(good, '\n')
	header := func(f func(*Header)) []byte {
		h := s.Header
		b := *h.Base
		h.Base = &b
		f(&h)
		data, _ := json.Marshal(h)
		return append(append(data, '\n'), good[nl+1:]...)
	}
	flip := bytes.Clone(good)
	flip[len(flip)-3] ^= 0xff
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"truncated body", good[:len(good)-5], "truncated"},
		{"flipped byte", flip, "sha256"},
		{"no header", good[nl+1:], "not valid JSON"},
		{"empty", nil, "no header line"},
		{"last revision lies", header(func(h *Header) { h.Last = 21 }), "ends at revision 20"},
		{"chain lies", header(func(h *Header) { h.Chain = strings.Repeat("0", 64) }), "chain"},
		{"wrong base", header(func(h *Header) { h.Base.Revision = 5 }), "base"},
		{"bad timeline", header(func(h *Header) { h.Timeline = "../x" }), "timeline"},
		{"newer format", header(func(h *Header) { h.Format = FormatVersion + 1 }), fmt.Sprintf("format %d", FormatVersion+1)},
		{"no format", header(func(h *Header) { h.Format = 0 }), "format 0"},
		{"body size lies", header(func(h *Header) { h.BodySize++ }), "body is"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := readAll(tc.data)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrCorrupt mentioning %q", err, tc.want)
			}
		})
	}
}

func TestSegmentKeys(t *testing.T) {
	for _, tc := range []struct {
		key  string
		ok   bool
		want Ref
	}{
		{SegmentKey("tl", 42, 0, false), true, Ref{First: 42}},
		{SegmentKey("tl", 42, 1, true), true, Ref{First: 42, Level: 1, RunStart: true}},
		{"wal/tl/42-L0.seg", false, Ref{}},
		{"wal/tl/00000000000000000042-Lx.seg", false, Ref{}},
		{"wal/tl/00000000000000000000-L0.seg", false, Ref{}},
		{"wal/tl/notes.txt", false, Ref{}},
	} {
		got, ok := parseKey(tc.key)
		tc.want.Key = tc.key
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("parseKey(%q) = %+v, %v; want %+v, %v", tc.key, got, ok, tc.want, tc.ok)
		}
	}
}

func mustHex(s string) []byte {
	b, _ := hex.DecodeString(s)
	return b
}

// A segment whose lengths lie is refused before the reader allocates what
// they claim: a small object that says it holds a 200 MiB event, in a body
// it says is 256 MiB, costs the reader what it actually read; and a body
// longer than its header says is refused too.
func TestSegmentLengthsAreNotTrusted(t *testing.T) {
	s := spoolSegment(t, t.TempDir(), mustHex(RunStart("tl1", 9)), 10, 10, &Base{Backup: "b", Revision: 9})
	good := objectBytes(t, s)
	h := s.Header
	h.BodySize = 256 << 20
	head, _ := json.Marshal(h)
	body := []byte{KindRevision}
	body = binary.AppendUvarint(body, 10)
	body = binary.AppendVarint(body, 1)
	body = binary.AppendUvarint(body, 1) // one event
	body = append(body, 0)
	body = binary.AppendUvarint(body, 200<<20) // of 200 MiB, it says
	body = append(body, bytes.Repeat([]byte("x"), 100)...)
	data := append(append(head, '\n'), body...)
	if len(data) > 1024 {
		t.Fatalf("the hostile segment is %d bytes", len(data))
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, err := readAll(data)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("a %d-byte segment claiming a 200 MiB event: %v, want ErrCorrupt (truncated)", len(data), err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("reading it allocated %d bytes, want under 1 MiB", got)
	}

	// A body longer than its header says.
	longer := append(bytes.Clone(good), 'x')
	if _, _, err := readAll(longer); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a body one byte longer than its header says: %v, want ErrCorrupt", err)
	}
}
