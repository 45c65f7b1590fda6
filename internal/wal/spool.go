package wal

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The spool is a local directory of cut segments waiting for upload:
// <timeline>-<first>.body and <timeline>-<first>.hdr. The header is
// written last; a body without one is the segment being written, lost
// with the process that wrote it (nothing of it was reported durable).

// segmentWriter writes one segment's body into the spool.
type segmentWriter struct {
	dir      string
	f        *os.File
	w        *bufio.Writer
	sum      hash.Hash
	header   Header
	chain    []byte
	buf      []byte
	chained  []byte
	revision bool // a revision record was written
}

func spoolName(timeline string, first int64) string {
	return fmt.Sprintf("%s-%020d", timeline, first)
}

// newSegmentWriter starts a segment of timeline after the revision whose
// chain value is prev; base is set when it starts a run.
func newSegmentWriter(dir, timeline string, prev []byte, first int64, base *Base) (*segmentWriter, error) {
	f, err := os.OpenFile(filepath.Join(dir, spoolName(timeline, first)+".body.tmp"), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("wal: spool: %w", err)
	}
	sw := &segmentWriter{dir: dir, f: f, sum: sha256.New(), chain: prev,
		header: Header{Format: FormatVersion, Timeline: timeline, First: first, Last: first - 1, Prev: hex.EncodeToString(prev), Base: base}}
	sw.w = bufio.NewWriterSize(io.MultiWriter(f, sw.sum), 64<<10)
	return sw, nil
}

// add appends a record. Revision records must come in order.
func (sw *segmentWriter) add(r Record) error {
	sw.buf = AppendRecord(sw.buf[:0], r)
	if r.Kind == KindRevision {
		if r.Revision != sw.header.Last+1 {
			return fmt.Errorf("wal: revision %d after %d: the watch skipped revisions", r.Revision, sw.header.Last)
		}
		sw.chained = chainBytes(sw.chained[:0], r)
		sw.chain = NextChain(sw.chain, sw.chained)
		sw.header.Last = r.Revision
		sw.header.LastTime = r.Time
		if !sw.revision {
			sw.header.FirstTime = r.Time
		}
		sw.revision = true
	}
	sw.header.Records++
	sw.header.BodySize += int64(len(sw.buf))
	if _, err := sw.w.Write(sw.buf); err != nil {
		return fmt.Errorf("wal: spool: %w", err)
	}
	return nil
}

// cut makes the segment durable in the spool: the body synced, then the
// header written, synced and renamed into place.
func (sw *segmentWriter) cut() (Header, error) {
	h := sw.header
	if err := sw.w.Flush(); err != nil {
		sw.abandon()
		return h, fmt.Errorf("wal: spool: %w", err)
	}
	h.SHA256 = hex.EncodeToString(sw.sum.Sum(nil))
	h.Chain = hex.EncodeToString(sw.chain)
	if err := sw.f.Sync(); err != nil {
		sw.abandon()
		return h, fmt.Errorf("wal: spool: %w", err)
	}
	if err := sw.f.Close(); err != nil {
		return h, fmt.Errorf("wal: spool: %w", err)
	}
	name := filepath.Join(sw.dir, spoolName(h.Timeline, h.First))
	if err := os.Rename(name+".body.tmp", name+".body"); err != nil {
		return h, fmt.Errorf("wal: spool: %w", err)
	}
	data, err := json.Marshal(h)
	if err != nil {
		return h, fmt.Errorf("wal: spool: %w", err)
	}
	if err := writeFileSync(name+".hdr", append(data, '\n')); err != nil {
		return h, err
	}
	return h, syncDir(sw.dir)
}

// abandon drops an unfinished segment.
func (sw *segmentWriter) abandon() {
	sw.f.Close()
	os.Remove(sw.f.Name())
}

func writeFileSync(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("wal: spool: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("wal: spool: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("wal: spool: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("wal: spool: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("wal: spool: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("wal: spool: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("wal: spool: %w", err)
	}
	return nil
}

// spooled is one cut segment in the spool.
type spooled struct {
	Header Header
	path   string // without .hdr / .body
}

func (s spooled) size() int64 { return s.Header.BodySize }

// open streams the segment as its store object: header line, then body.
func (s spooled) open() (io.ReadCloser, error) {
	data, err := json.Marshal(s.Header)
	if err != nil {
		return nil, fmt.Errorf("wal: spool: %w", err)
	}
	f, err := os.Open(s.path + ".body")
	if err != nil {
		return nil, fmt.Errorf("wal: spool: %w", err)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(strings.NewReader(string(data)+"\n"), f), f}, nil
}

func (s spooled) remove() error {
	if err := os.Remove(s.path + ".hdr"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("wal: spool: %w", err)
	}
	if err := os.Remove(s.path + ".body"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("wal: spool: %w", err)
	}
	return nil
}

// readSpool lists the cut segments in dir, oldest first per timeline,
// and removes what a crash left half-written. A header that does not
// parse is moved aside, not trusted and not deleted.
func readSpool(dir string) ([]spooled, int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, fmt.Errorf("wal: spool: %w", err)
	}
	var out []spooled
	var total int64
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, ".tmp"):
			continue // being written, or left by a crash (removed by clearSpoolTemp)
		case !strings.HasSuffix(name, ".hdr"):
			continue
		}
		base := filepath.Join(dir, strings.TrimSuffix(name, ".hdr"))
		data, err := os.ReadFile(base + ".hdr")
		if errors.Is(err, os.ErrNotExist) {
			continue // uploaded and removed since the listing
		}
		if err != nil {
			return nil, 0, fmt.Errorf("wal: spool: %w", err)
		}
		var h Header
		if err := json.Unmarshal(data, &h); err != nil || h.Validate() != nil {
			_ = os.Rename(base+".hdr", base+".hdr.bad")
			continue
		}
		out = append(out, spooled{Header: h, path: base})
		total += h.BodySize
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Header, out[j].Header
		if a.Timeline != b.Timeline {
			return a.Timeline < b.Timeline
		}
		return a.First < b.First
	})
	return out, total, nil
}

// clearSpoolTemp removes the unfinished files a crash left.
func clearSpoolTemp(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("wal: spool: %w", err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("wal: spool: %w", err)
			}
		}
	}
	return nil
}

// trimSpooled rewrites a spooled segment to hold only what follows
// revision after, whose chain value must be want: another writer's
// segment already holds the rest. It returns the new segment, or false
// when nothing is left.
func trimSpooled(dir string, s spooled, after int64, want string) (spooled, bool, error) {
	f, err := os.Open(s.path + ".body")
	if err != nil {
		return s, false, fmt.Errorf("wal: spool: %w", err)
	}
	defer f.Close()
	data, _ := json.Marshal(s.Header)
	rd, err := NewReader(io.MultiReader(strings.NewReader(string(data)+"\n"), f), s.path)
	if err != nil {
		return s, false, err
	}
	var sw *segmentWriter
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return s, false, err
		}
		if sw == nil {
			if rec.Kind != KindRevision || rec.Revision != after {
				continue
			}
			if got := hex.EncodeToString(rd.Chain()); got != want {
				return s, false, fmt.Errorf("%w: the store's segment and this agent's spool disagree at revision %d of timeline %s", ErrCorrupt, after, s.Header.Timeline)
			}
			if sw, err = newSegmentWriter(dir, s.Header.Timeline, rd.Chain(), after+1, nil); err != nil {
				return s, false, err
			}
			continue
		}
		if err := sw.add(rec); err != nil {
			sw.abandon()
			return s, false, err
		}
	}
	if sw == nil || !sw.revision {
		if sw != nil {
			sw.abandon()
		}
		return s, false, s.remove()
	}
	h, err := sw.cut()
	if err != nil {
		return s, false, err
	}
	if err := s.remove(); err != nil {
		return s, false, err
	}
	return spooled{Header: h, path: filepath.Join(dir, spoolName(h.Timeline, h.First))}, true, nil
}
