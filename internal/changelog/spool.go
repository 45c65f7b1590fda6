package changelog

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
)

// The spool is a local directory of cut segments waiting for upload,
// one file each: <timeline>-<first>.seg holds the body, then the header
// as JSON, then a footer (spoolMagic and the header's length). It is
// written as .seg.tmp, synced, renamed and the directory synced: a cut
// costs two syncs on the disk etcd may share. A .tmp file is the segment
// being written, or one a crash cut short; nothing of it was reported
// durable. Spools of versions before this one hold a .body and a .hdr
// per segment; they are still read, uploaded and removed.

const (
	spoolExt   = ".seg"
	spoolMagic = "emwalsp1"
	footerSize = len(spoolMagic) + 4
	legacyHdr  = ".hdr"
	legacyBody = ".body"
	tempExt    = ".tmp"
	badExt     = ".bad"
	// orphanExt marks a segment set aside because an earlier one of its
	// timeline did not read: its chain can never be whole in the store.
	orphanExt = ".orphan"
)

// setAside is a spooled segment that did not read, moved aside; its name
// says its timeline and first revision.
type setAside struct {
	Timeline string
	First    int64
	Path     string
}

// errSetAside means readSpooled moved the segment aside.
var errSetAside = errors.New("changelog: spooled segment set aside")

// parseSpoolName is the timeline and first revision of a spool name
// (spoolName's form); ok is false for another.
func parseSpoolName(name string) (string, int64, bool) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 || len(name)-i-1 != 20 {
		return "", 0, false
	}
	first, err := strconv.ParseInt(name[i+1:], 10, 64)
	if err != nil || !ValidTimeline(name[:i]) {
		return "", 0, false
	}
	return name[:i], first, true
}

// segmentWriter writes one segment into the spool.
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
	f, err := os.OpenFile(filepath.Join(dir, spoolName(timeline, first)+spoolExt+tempExt), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("changelog: spool: %w", err)
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
			return fmt.Errorf("changelog: revision %d after %d: the watch skipped revisions", r.Revision, sw.header.Last)
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
		return fmt.Errorf("changelog: spool: %w", err)
	}
	return nil
}

// cut makes the segment durable in the spool: the header and footer
// appended to the body, the file synced, renamed into place, and the
// directory synced.
func (sw *segmentWriter) cut() (Header, error) {
	h := sw.header
	if err := sw.w.Flush(); err != nil {
		sw.abandon()
		return h, fmt.Errorf("changelog: spool: %w", err)
	}
	h.SHA256 = hex.EncodeToString(sw.sum.Sum(nil))
	h.Chain = hex.EncodeToString(sw.chain)
	data, err := json.Marshal(h)
	if err != nil {
		sw.abandon()
		return h, fmt.Errorf("changelog: spool: %w", err)
	}
	data = append(data, spoolMagic...)
	data = binary.BigEndian.AppendUint32(data, uint32(len(data)-len(spoolMagic)))
	if _, err := sw.f.Write(data); err != nil {
		sw.abandon()
		return h, fmt.Errorf("changelog: spool: %w", err)
	}
	if err := sw.f.Sync(); err != nil {
		sw.abandon()
		return h, fmt.Errorf("changelog: spool: %w", err)
	}
	if err := sw.f.Close(); err != nil {
		return h, fmt.Errorf("changelog: spool: %w", err)
	}
	name := filepath.Join(sw.dir, spoolName(h.Timeline, h.First)) + spoolExt
	if err := os.Rename(name+tempExt, name); err != nil {
		return h, fmt.Errorf("changelog: spool: %w", err)
	}
	return h, syncDir(sw.dir)
}

// abandon drops an unfinished segment.
func (sw *segmentWriter) abandon() {
	sw.f.Close()
	os.Remove(sw.f.Name())
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("changelog: spool: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("changelog: spool: %w", err)
	}
	return nil
}

// spooled is one cut segment in the spool.
type spooled struct {
	Header Header
	path   string // without the extension
	legacy bool   // a .hdr and a .body, as earlier versions wrote
}

func (s spooled) size() int64 { return s.Header.BodySize }

// open streams the segment as its store object: header line, then body.
func (s spooled) open() (io.ReadCloser, error) {
	data, err := json.Marshal(s.Header)
	if err != nil {
		return nil, fmt.Errorf("changelog: spool: %w", err)
	}
	f, err := s.openBody()
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(append(data, '\n')), io.LimitReader(f, s.Header.BodySize)), f}, nil
}

// object streams the segment as its store object: as open does, or with
// a writing key the header, of FormatEncrypted and naming the key, then
// the body encrypted.
func (s spooled) object(keys *crypt.Keyring) (io.ReadCloser, error) {
	if !keys.Encrypting() {
		return s.open()
	}
	body, err := s.openBody()
	if err != nil {
		return nil, err
	}
	enc, info, err := keys.EncryptReader(io.LimitReader(body, s.Header.BodySize))
	if err != nil {
		body.Close()
		return nil, fmt.Errorf("changelog: %w", err)
	}
	h := s.Header
	h.Format, h.Encryption = FormatEncrypted, info
	data, err := json.Marshal(h)
	if err != nil {
		body.Close()
		return nil, fmt.Errorf("changelog: spool: %w", err)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(append(data, '\n')), enc), body}, nil
}

func (s spooled) openBody() (*os.File, error) {
	name := s.path + spoolExt
	if s.legacy {
		name = s.path + legacyBody
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("changelog: spool: %w", err)
	}
	return f, nil
}

// orphan sets the segment aside: an earlier one of its timeline did not
// read, so its chain can never be whole in the store. It is kept, for a
// person to look at.
func (s spooled) orphan() error {
	for _, name := range s.files() {
		if err := os.Rename(name, name+orphanExt); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("changelog: spool: %w", err)
		}
	}
	return nil
}

// files are the segment's files in the spool.
func (s spooled) files() []string {
	if s.legacy {
		return []string{s.path + legacyHdr, s.path + legacyBody}
	}
	return []string{s.path + spoolExt}
}

func (s spooled) remove() error {
	for _, name := range s.files() {
		if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("changelog: spool: %w", err)
		}
	}
	return nil
}

// readSpool lists the cut segments in dir, oldest first per timeline. A
// segment whose header does not read is moved aside, not trusted and not
// deleted, and returned in aside.
func readSpool(dir string) (segs []spooled, total int64, aside []setAside, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("changelog: spool: %w", err)
	}
	var out []spooled
	for _, e := range entries {
		name := e.Name()
		var s spooled
		var ok bool
		var base string
		switch {
		case strings.HasSuffix(name, spoolExt):
			base = strings.TrimSuffix(name, spoolExt)
			s, ok, err = readSpooled(filepath.Join(dir, base))
		case strings.HasSuffix(name, legacyHdr):
			base = strings.TrimSuffix(name, legacyHdr)
			s, ok, err = readLegacy(filepath.Join(dir, base))
		default:
			continue // being written (.tmp), set aside (.bad, .orphan), or not ours
		}
		if errors.Is(err, errSetAside) {
			a := setAside{Path: filepath.Join(dir, name)}
			if t, first, ok := parseSpoolName(base); ok {
				a.Timeline, a.First = t, first
			}
			aside = append(aside, a)
			continue
		}
		if err != nil {
			return nil, 0, nil, err
		}
		if ok {
			out = append(out, s)
			total += s.size()
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Header, out[j].Header
		if a.Timeline != b.Timeline {
			return a.Timeline < b.Timeline
		}
		return a.First < b.First
	})
	return out, total, aside, nil
}

// readSpooled reads the header of the segment file path.seg; ok is false
// when it is gone (uploaded since the listing) or was set aside.
func readSpooled(path string) (spooled, bool, error) {
	s := spooled{path: path}
	f, err := os.Open(path + spoolExt)
	if errors.Is(err, os.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("changelog: spool: %w", err)
	}
	defer f.Close()
	bad := func() (spooled, bool, error) {
		if err := os.Rename(path+spoolExt, path+spoolExt+badExt); err != nil {
			return s, false, nil // another reader set it aside first
		}
		return s, false, errSetAside
	}
	st, err := f.Stat()
	if err != nil {
		return s, false, fmt.Errorf("changelog: spool: %w", err)
	}
	size := st.Size()
	if size < int64(footerSize) {
		return bad()
	}
	var foot [footerSize]byte
	if _, err := f.ReadAt(foot[:], size-int64(footerSize)); err != nil {
		return s, false, fmt.Errorf("changelog: spool: %w", err)
	}
	n := int64(binary.BigEndian.Uint32(foot[len(spoolMagic):]))
	if string(foot[:len(spoolMagic)]) != spoolMagic || n > maxHeaderSize || n > size-int64(footerSize) {
		return bad()
	}
	data := make([]byte, n)
	if _, err := f.ReadAt(data, size-int64(footerSize)-n); err != nil {
		return s, false, fmt.Errorf("changelog: spool: %w", err)
	}
	if err := json.Unmarshal(data, &s.Header); err != nil || s.Header.Validate() != nil ||
		s.Header.BodySize != size-int64(footerSize)-n {
		return bad()
	}
	return s, true, nil
}

// readLegacy reads the header of an earlier version's path.hdr.
func readLegacy(path string) (spooled, bool, error) {
	s := spooled{path: path, legacy: true}
	data, err := readBounded(path+legacyHdr, maxHeaderSize)
	if errors.Is(err, os.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, err
	}
	if json.Unmarshal(data, &s.Header) != nil || s.Header.Validate() != nil {
		if err := os.Rename(path+legacyHdr, path+legacyHdr+badExt); err != nil {
			return s, false, nil
		}
		return s, false, errSetAside
	}
	return s, true, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("changelog: spool: %w", err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("changelog: spool: %s is over %d bytes", path, limit)
	}
	return data, nil
}

// clearSpoolTemp removes the unfinished files a crash left.
func clearSpoolTemp(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("changelog: spool: %w", err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), tempExt) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("changelog: spool: %w", err)
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
	r, err := s.open()
	if err != nil {
		return s, false, err
	}
	defer r.Close()
	rd, err := NewReader(r, s.path, nil)
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
