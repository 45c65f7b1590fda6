package changelog

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// A spooled segment whose head another writer already uploaded is cut
// down to the rest, and its chain still verifies.
func TestTrimSpooled(t *testing.T) {
	dir := t.TempDir()
	s := spoolSegment(t, dir, mustHex(RunStart("tl1", 9)), 10, 20, &Base{Backup: "b", Revision: 9})
	other := spoolSegment(t, t.TempDir(), mustHex(RunStart("tl1", 9)), 10, 14, &Base{Backup: "b", Revision: 9})
	trimmed, left, err := trimSpooled(dir, s, 14, other.Header.Chain)
	if err != nil || !left {
		t.Fatalf("trim: %v, %v", left, err)
	}
	if h := trimmed.Header; h.First != 15 || h.Last != 20 || h.Prev != other.Header.Chain || h.Chain != s.Header.Chain || h.Base != nil {
		t.Fatalf("trimmed header: %+v", h)
	}
	if _, _, err := readAll(objectBytes(t, trimmed)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.path + spoolExt); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the untrimmed segment is still spooled: %v", err)
	}
	// A different history at the same revision is refused.
	s2 := spoolSegment(t, dir, mustHex(RunStart("tl1", 9)), 10, 20, nil)
	if _, _, err := trimSpooled(dir, s2, 14, strings.Repeat("ab", 32)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("trim against another history: %v", err)
	}
}

// Only cut segments are listed; what a crash left unfinished is removed,
// and a segment that does not read is set aside, not trusted or deleted.
func TestReadSpool(t *testing.T) {
	dir := t.TempDir()
	spoolSegment(t, dir, mustHex(RunStart("tl1", 9)), 10, 12, nil)
	spoolSegment(t, dir, make([]byte, 32), 13, 15, nil)
	if _, err := newSegmentWriter(dir, "tl1", nil, 16, nil); err != nil { // left open
		t.Fatal(err)
	}
	// Damaged segments, each made from a good one.
	good := objectBytes(t, spoolSegment(t, t.TempDir(), nil, 1, 3, nil))
	whole, err := os.ReadFile(filepath.Join(dir, spoolName("tl1", 10)+spoolExt))
	if err != nil {
		t.Fatal(err)
	}
	damaged := map[string][]byte{
		"truncated":      whole[:len(whole)-1],
		"empty":          nil,
		"no footer":      good,
		"body cut short": append(append([]byte{}, whole[:5]...), whole[6:]...),
		"a lying length": append(append([]byte{}, whole[:len(whole)-4]...), 0xff, 0xff, 0xff, 0xff),
		"a bad header":   append([]byte("{not json"), []byte(spoolMagic+"\x00\x00\x00\x09")...),
	}
	first := int64(100)
	var bad []string
	for what, data := range damaged {
		name := filepath.Join(dir, spoolName("tl1", first)+spoolExt)
		if err := os.WriteFile(name, data, 0o600); err != nil {
			t.Fatal(err)
		}
		bad = append(bad, name+badExt+" ("+what+")")
		first++
	}
	if err := os.WriteFile(filepath.Join(dir, spoolName("tl1", 99)+legacyHdr), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad = append(bad, filepath.Join(dir, spoolName("tl1", 99)+legacyHdr+badExt+" (legacy)"))
	if err := clearSpoolTemp(dir); err != nil {
		t.Fatal(err)
	}
	segs, total, aside, err := readSpool(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(segs) != 2 || segs[0].Header.First != 10 || segs[1].Header.First != 13 || total != segs[0].size()+segs[1].size() {
		t.Fatalf("spool: %+v (total %d)", segs, total)
	}
	if len(aside) != len(bad) {
		t.Errorf("%d segments reported set aside, want %d: %+v", len(aside), len(bad), aside)
	}
	for _, a := range aside {
		if a.Timeline != "tl1" || a.First < 99 || a.First >= first {
			t.Errorf("a segment set aside is reported as %+v", a)
		}
	}
	if _, _, again, err := readSpool(dir); err != nil || len(again) != 0 {
		t.Errorf("a second listing reports %v set aside again (%v)", again, err)
	}
	for _, b := range bad {
		name, what, _ := strings.Cut(b, " ")
		if _, err := os.Stat(name); err != nil {
			t.Errorf("a segment with %s is not set aside: %v", what, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, spoolName("tl1", 16)+spoolExt+tempExt)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an unfinished segment is left: %v", err)
	}
}

// A spool written by an earlier version (a .hdr and a .body per segment)
// is still uploaded, byte for byte the same object, and then removed.
func TestLegacySpoolUploads(t *testing.T) {
	dir := t.TempDir()
	s := spoolSegment(t, dir, mustHex(RunStart("tl1", 9)), 10, 20, &Base{Backup: "b", Revision: 9})
	want := objectBytes(t, s)
	hdr, body, _ := strings.Cut(string(want), "\n")
	if err := os.WriteFile(s.path+legacyHdr, []byte(hdr+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.path+legacyBody, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(s.path + spoolExt); err != nil {
		t.Fatal(err)
	}
	st := fileStore(t)
	c, err := New(Default(), dir, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	segs, _, _, err := readSpool(dir)
	if err != nil || len(segs) != 1 || !segs[0].legacy {
		t.Fatalf("legacy spool: %+v, %v", segs, err)
	}
	if err := c.UploadOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	r, err := st.Reader(context.Background(), KeyOf(s.Header))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(got) != string(want) {
		t.Fatalf("uploaded object differs (%v)", err)
	}
	for _, ext := range []string{legacyHdr, legacyBody} {
		if _, err := os.Stat(s.path + ext); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left in the spool: %v", ext, err)
		}
	}
	if got := c.DurableRevision("tl1"); got != 20 {
		t.Errorf("durable revision %d, want 20", got)
	}
}

// outage is a store that refuses writes while down.
type outage struct {
	Store
	down bool
}

func (o *outage) CreateFrom(ctx context.Context, key string, r io.Reader) error {
	if o.down {
		return errors.New("store unreachable")
	}
	return o.Store.CreateFrom(ctx, key, r)
}

// A full spool stops capture from starting another segment, and says so;
// once the store takes the spool, capture may go on.
func TestSpoolBound(t *testing.T) {
	dir := t.TempDir()
	a := spoolSegment(t, dir, mustHex(RunStart("tl1", 9)), 10, 20, &Base{Backup: "b", Revision: 9})
	b := spoolSegment(t, dir, mustHex(a.Header.Chain), 21, 30, nil)
	cfg := Default()
	cfg.MaxSegmentBytes = a.size()
	cfg.MaxSpoolBytes = a.size() + b.size()
	st := &outage{Store: fileStore(t), down: true}
	c, err := New(cfg, dir, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	f := &follower{c: c, timeline: "tl1", chain: mustHex(b.Header.Chain), last: 30}
	if err := c.UploadOnce(context.Background()); err == nil {
		t.Fatal("an upload to a store that is down succeeded")
	}
	if got := c.Status().SpoolBytes; got != cfg.MaxSpoolBytes {
		t.Fatalf("spool bytes %d, want %d", got, cfg.MaxSpoolBytes)
	}
	if _, err := f.writer(); !errors.Is(err, ErrSpoolFull) || !c.Status().SpoolFull {
		t.Fatalf("a full spool: %v, status %+v", err, c.Status())
	}
	st.down = false
	if err := c.UploadOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := c.Status(); s.SpoolBytes != 0 || s.Durable != 30 {
		t.Fatalf("after the upload: %+v", s)
	}
	w, err := f.writer()
	if err != nil || c.Status().SpoolFull {
		t.Fatalf("after the upload: %v, status %+v", err, c.Status())
	}
	w.abandon()
	segs, _, _, err := readSpool(dir)
	if err != nil || len(segs) != 0 {
		t.Fatalf("spool after the upload: %+v, %v", segs, err)
	}
}

// countingOutage counts the uploads tried against a store that is down.
type countingOutage struct {
	Store
	mu    sync.Mutex
	tries int
}

func (o *countingOutage) CreateFrom(ctx context.Context, key string, r io.Reader) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tries++
	return errors.New("store unreachable")
}

// During an outage, Upload backs off: the cuts that keep coming do not
// make it try again at once (it did, every CutInterval).
func TestUploadBacksOff(t *testing.T) {
	dir := t.TempDir()
	spoolSegment(t, dir, mustHex(RunStart("tl1", 9)), 10, 20, &Base{Backup: "b", Revision: 9})
	st := &countingOutage{Store: fileStore(t)}
	c, err := New(Default(), dir, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Upload(ctx)
	}()
	// Cuts every 10ms for 1.5s: the first try, then one after the
	// first back-off of 1s; the next is due at 3s.
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		c.poke()
	}
	cancel()
	<-done
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.tries < 1 || st.tries > 2 {
		t.Fatalf("%d uploads tried in 1.5s of outage with a cut every 10ms; want 1 or 2", st.tries)
	}
}

// A spooled segment that does not read ends its run: it is set aside and
// counted, the segments after it are set aside and never uploaded (the
// store would hold a run with a hole that only a restore finds), nothing
// after the hole is durable, and capture resumes before it.
func TestSetAsideEndsTheRun(t *testing.T) {
	dir := t.TempDir()
	first := spoolSegment(t, dir, mustHex(RunStart("tl1", 9)), 10, 20, &Base{Backup: "b", Revision: 9})
	second := spoolSegment(t, dir, mustHex(first.Header.Chain), 21, 30, nil)
	third := spoolSegment(t, dir, mustHex(second.Header.Chain), 31, 40, nil)
	// The second is damaged on disk.
	if err := os.WriteFile(second.path+spoolExt, []byte("damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	st := fileStore(t)
	c, err := New(Default(), dir, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := c.UploadOnce(ctx); err != nil {
		t.Fatal(err)
	}
	refs, err := List(ctx, st, "tl1")
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) != 1 || refs[0].First != 10 {
		t.Fatalf("the store holds %+v, want the first segment alone", refs)
	}
	if s := c.Status(); s.SetAside != 1 || s.Durable != 20 {
		t.Errorf("status %+v: want 1 set aside and revision 20 durable", s)
	}
	if _, err := os.Stat(second.path + spoolExt + badExt); err != nil {
		t.Errorf("the damaged segment is not kept aside: %v", err)
	}
	if _, err := os.Stat(third.path + spoolExt + orphanExt); err != nil {
		t.Errorf("the segment after the damaged one is not kept aside: %v", err)
	}
	if h, ok := c.hole("tl1"); !ok || h != 21 {
		t.Errorf("hole = %d, %v; want 21", h, ok)
	}
	// Capture resumes after the last revision held whole.
	at, found, err := c.Resume(ctx, "tl1")
	if err != nil || !found || at.Revision != 20 || hex.EncodeToString(at.Chain) != first.Header.Chain {
		t.Errorf("Resume = %+v, %v, %v; want revision 20 and the first segment's chain", at, found, err)
	}
	// Nothing after the hole is uploaded, even if a writer cut it before
	// it stopped.
	spoolSegment(t, dir, mustHex(third.Header.Chain), 41, 50, nil)
	if err := c.UploadOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if refs, _ := List(ctx, st, "tl1"); len(refs) != 1 {
		t.Errorf("a segment after the hole was uploaded: %+v", refs)
	}
}
