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

	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Errors. Check them with errors.Is.
var (
	// ErrCorrupt means a segment is damaged, truncated, tampered with or
	// out of order.
	ErrCorrupt = errors.New("changelog: segment is corrupt")
	// ErrGap means the segments do not reach a revision without a hole.
	ErrGap = errors.New("changelog: revisions are missing")
	// ErrRange means a restore target lies outside what can be reached.
	ErrRange = errors.New("changelog: target is out of range")
	// ErrNoKey means a segment is encrypted with a key this process does
	// not hold; errors.As finds the *crypt.NoKeyError with the key's ID.
	ErrNoKey = crypt.ErrNoKey
)

// FormatVersion is the format of the plaintext segments this package
// writes. Format 2 added digest records, and left the observed time out
// of the hash chain.
const FormatVersion = 2

// FormatEncrypted is the format of a segment whose body is encrypted:
// format 2 once decrypted. Readers before it refuse such a segment by its
// format rather than misread its body.
const FormatEncrypted = 3

// Bounds on what is read from a segment: far above any valid one.
const (
	maxHeaderSize = 64 << 10
	maxEventSize  = 256 << 20
	// maxRevisionBytes bounds one revision's events together: one
	// revision is one etcd request, which --max-request-bytes bounds (1.5
	// MiB by default) far below this.
	maxRevisionBytes = 512 << 20
	// readChunk is how much of an event the reader takes at a time: its
	// buffer grows with the bytes that arrive, never by what a length
	// prefix claims.
	readChunk = 64 << 10
)

// Header is a segment's first line.
type Header struct {
	Format   int    `json:"format"`
	Timeline string `json:"timeline"`
	// Level is 0 for a segment cut by capture, higher for merged ones.
	Level int `json:"level"`
	// First and Last are the revisions it holds, both included; FirstTime
	// and LastTime when capture observed them, in unix nanoseconds.
	First     int64 `json:"first"`
	Last      int64 `json:"last"`
	FirstTime int64 `json:"firstTime"`
	LastTime  int64 `json:"lastTime"`
	// Records counts the body's records, of every kind.
	Records int64 `json:"records"`
	// BodySize and SHA256 describe the body that follows the header.
	BodySize int64  `json:"bodySize"`
	SHA256   string `json:"sha256"`
	// Prev is the chain value before the first record, Chain after the
	// last.
	Prev  string `json:"prev"`
	Chain string `json:"chain"`
	// Base is set on the first segment of a run: capture started right
	// after this full backup.
	Base *Base `json:"base,omitempty"`
	// Encryption names the key the body is encrypted with (format 3);
	// BodySize and SHA256 describe the body decrypted.
	Encryption *crypt.Info `json:"encryption,omitempty"`
}

// Base is the full backup a run of segments starts from.
type Base struct {
	Backup   string `json:"backup"`
	Revision int64  `json:"revision"`
}

// RunStart is the chain value before the first record of a run that
// starts after revision rev of timeline: a run's segments cannot be
// passed off as another's.
func RunStart(timeline string, rev int64) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "etcd-manager wal run %s %d", timeline, rev))
	return hex.EncodeToString(sum[:])
}

// Validate checks a header read from the store.
func (h Header) Validate() error {
	switch {
	case h.Format < 1 || h.Format > FormatEncrypted:
		return fmt.Errorf("%w: format %d, this etcd-manager reads 1 to %d", ErrCorrupt, h.Format, FormatEncrypted)
	case (h.Format == FormatEncrypted) != (h.Encryption != nil):
		return fmt.Errorf("%w: format %d with encryption %v: only format %d is encrypted, and it always is", ErrCorrupt, h.Format, h.Encryption != nil, FormatEncrypted)
	case !spec.ValidClusterToken(h.Timeline):
		return fmt.Errorf("%w: timeline %q is not a cluster token", ErrCorrupt, h.Timeline)
	case h.First < 1 || h.Last < h.First:
		return fmt.Errorf("%w: revisions %d to %d", ErrCorrupt, h.First, h.Last)
	case h.Level < 0 || h.Level > 9:
		return fmt.Errorf("%w: level %d", ErrCorrupt, h.Level)
	case h.BodySize < 0 || h.Records < 1:
		return fmt.Errorf("%w: %d records in %d bytes", ErrCorrupt, h.Records, h.BodySize)
	case len(h.SHA256) != 64 || len(h.Prev) != 64 || len(h.Chain) != 64:
		return fmt.Errorf("%w: sha256, prev and chain must be 64 hex digits", ErrCorrupt)
	case h.Base != nil && (h.Base.Revision != h.First-1 || h.Prev != RunStart(h.Timeline, h.Base.Revision)):
		return fmt.Errorf("%w: the run's base (revision %d) does not precede revision %d", ErrCorrupt, h.Base.Revision, h.First)
	}
	if h.Encryption != nil {
		if err := h.Encryption.Validate(); err != nil {
			return fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
	}
	return nil
}

// Record kinds.
const (
	KindRevision = 'R'
	KindGrant    = 'G'
	KindRevoke   = 'X'
	KindDigest   = 'H'
)

// Event is one change of a revision: the key bucket's value, and whether
// it is a tombstone (a delete).
type Event struct {
	Tombstone bool
	Value     []byte
}

// Record is one record of a body.
type Record struct {
	Kind byte
	// Revision is the revision of a KindRevision record; of a grant, the
	// revision from which the lease is known to exist; of a revoke, the
	// revision by which it was gone.
	Revision int64
	// Time is when a revision was observed, in unix nanoseconds.
	Time   int64
	Events []Event
	// Lease and TTL describe a grant or revoke.
	Lease int64
	TTL   int64
	// Digest is a digest record's: the keys live at Revision.
	Digest Digest
}

// AppendRecord appends r's encoding to b.
func AppendRecord(b []byte, r Record) []byte {
	b = append(b, r.Kind)
	b = binary.AppendUvarint(b, uint64(r.Revision))
	switch r.Kind {
	case KindRevision:
		b = binary.AppendVarint(b, r.Time)
		b = binary.AppendUvarint(b, uint64(len(r.Events)))
		for _, e := range r.Events {
			kind := byte(0)
			if e.Tombstone {
				kind = 1
			}
			b = append(b, kind)
			b = binary.AppendUvarint(b, uint64(len(e.Value)))
			b = append(b, e.Value...)
		}
	case KindGrant:
		b = binary.AppendVarint(b, r.Lease)
		b = binary.AppendVarint(b, r.TTL)
	case KindRevoke:
		b = binary.AppendVarint(b, r.Lease)
	case KindDigest:
		b = binary.AppendUvarint(b, uint64(r.Digest.Keys))
		b = binary.BigEndian.AppendUint64(b, r.Digest.Sum[0])
		b = binary.BigEndian.AppendUint64(b, r.Digest.Sum[1])
	}
	return b
}

// chainBytes appends what the hash chain covers of a revision record:
// its encoding without the time it was observed.
func chainBytes(b []byte, r Record) []byte {
	r.Time = 0
	rec := AppendRecord(b, r)
	// The time is the varint after the kind and revision: drop its one
	// byte (a zero varint).
	at := 1 + uvarintLen(uint64(r.Revision))
	return append(rec[:at], rec[at+1:]...)
}

func uvarintLen(v uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], v)
}

// NextChain is the chain value after a record whose chained bytes are
// rec.
func NextChain(prev []byte, rec []byte) []byte {
	h := sha256.New()
	h.Write(prev)
	h.Write(rec)
	return h.Sum(nil)
}

// Reader reads one segment: its header, then its records, checking the
// body's sha256, size, count and chain as it goes. Next returns io.EOF
// only once every check has passed.
type Reader struct {
	Header Header
	name   string
	r      *bufio.Reader
	body   hash.Hash
	read   int64
	n      int64
	chain  []byte
	last   int64 // the last revision record read
	buf    []byte
	// timeAt and timeEnd locate a revision record's time in buf.
	timeAt, timeEnd int
}

// countingReader feeds the bytes read into a hash and counts them.
type countingReader struct {
	r io.Reader
	h hash.Hash
	n *int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	*c.n += int64(n)
	return n, err
}

// NewReader reads the header of the segment in r; name labels errors.
// An encrypted body is decrypted with keys (nil: none held): a key not
// held is a *crypt.NoKeyError (ErrNoKey) before the body is read, and a
// body that does not decrypt is ErrCorrupt.
func NewReader(r io.Reader, name string, keys *crypt.Keyring) (*Reader, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	h, err := readHeader(br, name)
	if err != nil {
		return nil, err
	}
	body, err := keys.Decrypt(br, h.Encryption, "segment "+name)
	if errors.Is(err, crypt.ErrCorrupt) {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err != nil {
		return nil, fmt.Errorf("changelog: %w", err)
	}
	prev, _ := hex.DecodeString(h.Prev)
	sr := &Reader{Header: h, name: name, body: sha256.New(), chain: prev, last: h.First - 1}
	// The body is read no further than its declared size, and one byte
	// more to tell a longer one (see finish).
	sr.r = bufio.NewReaderSize(countingReader{r: io.LimitReader(body, h.BodySize+1), h: sr.body, n: &sr.read}, 64<<10)
	return sr, nil
}

// ReadHeader reads only the header of a segment.
func ReadHeader(r io.Reader, name string) (Header, error) {
	return readHeader(bufio.NewReaderSize(r, 4<<10), name)
}

func readHeader(br *bufio.Reader, name string) (Header, error) {
	var h Header
	line, err := br.ReadSlice('\n')
	for errors.Is(err, bufio.ErrBufferFull) && len(line) <= maxHeaderSize {
		var more []byte
		more, err = br.ReadSlice('\n')
		line = append(append([]byte(nil), line...), more...)
	}
	switch {
	case len(line) > maxHeaderSize:
		return h, fmt.Errorf("%w: %s: header is over %d bytes", ErrCorrupt, name, maxHeaderSize)
	case err != nil && !errors.Is(err, io.EOF):
		return h, fmt.Errorf("changelog: read %s: %w", name, err)
	case err != nil:
		return h, fmt.Errorf("%w: %s: no header line (the object is empty or truncated)", ErrCorrupt, name)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&h); err != nil {
		return h, fmt.Errorf("%w: %s: header is not valid JSON: %v", ErrCorrupt, name, err)
	}
	if err := h.Validate(); err != nil {
		return h, fmt.Errorf("%s: %w", name, err)
	}
	return h, nil
}

// Chain is the chain value after the revisions read so far.
func (s *Reader) Chain() []byte { return s.chain }

// Next returns the next record. The returned record's events share
// memory with the reader until the next call.
func (s *Reader) Next() (Record, error) {
	var r Record
	kind, err := s.r.ReadByte()
	if errors.Is(err, io.EOF) {
		return r, s.finish()
	}
	if err != nil {
		return r, s.readErr(err)
	}
	s.buf = append(s.buf[:0], kind)
	r.Kind = kind
	rev, err := s.uvarint()
	if err != nil {
		return r, err
	}
	r.Revision = int64(rev)
	switch kind {
	case KindRevision:
		if r.Revision != s.last+1 {
			return r, fmt.Errorf("%w: %s: revision %d follows %d", ErrCorrupt, s.name, r.Revision, s.last)
		}
		s.last = r.Revision
		s.timeAt = len(s.buf)
		if r.Time, err = s.varint(); err != nil {
			return r, err
		}
		s.timeEnd = len(s.buf)
		n, err := s.uvarint()
		if err != nil {
			return r, err
		}
		if n == 0 || n > uint64(s.Header.BodySize) {
			return r, fmt.Errorf("%w: %s: revision %d has %d events", ErrCorrupt, s.name, r.Revision, n)
		}
		// Positions into buf, turned into slices once buf stops growing.
		type span struct {
			tomb     bool
			from, to int
		}
		spans := make([]span, 0, min(n, 1024))
		for range n {
			k, err := s.r.ReadByte()
			if err != nil {
				return r, s.readErr(err)
			}
			if k > 1 {
				return r, fmt.Errorf("%w: %s: revision %d has an event of kind %d", ErrCorrupt, s.name, r.Revision, k)
			}
			s.buf = append(s.buf, k)
			size, err := s.uvarint()
			if err != nil {
				return r, err
			}
			if size > maxEventSize || int64(size) > s.Header.BodySize || len(s.buf)+int(size) > maxRevisionBytes {
				return r, fmt.Errorf("%w: %s: revision %d has an event of %d bytes", ErrCorrupt, s.name, r.Revision, size)
			}
			from := len(s.buf)
			for left := int(size); left > 0; {
				n := min(left, readChunk)
				at := len(s.buf)
				s.buf = append(s.buf, make([]byte, n)...)
				if _, err := io.ReadFull(s.r, s.buf[at:]); err != nil {
					return r, s.readErr(err)
				}
				left -= n
			}
			spans = append(spans, span{tomb: k == 1, from: from, to: len(s.buf)})
		}
		r.Events = make([]Event, len(spans))
		for i, sp := range spans {
			r.Events[i] = Event{Tombstone: sp.tomb, Value: s.buf[sp.from:sp.to]}
		}
	case KindGrant:
		if r.Lease, err = s.varint(); err != nil {
			return r, err
		}
		if r.TTL, err = s.varint(); err != nil {
			return r, err
		}
	case KindRevoke:
		if r.Lease, err = s.varint(); err != nil {
			return r, err
		}
	case KindDigest:
		if s.Header.Format < 2 {
			return r, fmt.Errorf("%w: %s: a digest record in a format %d segment", ErrCorrupt, s.name, s.Header.Format)
		}
		keys, err := s.uvarint()
		if err != nil {
			return r, err
		}
		r.Digest.Keys = int64(keys)
		var sum [16]byte
		if _, err := io.ReadFull(s.r, sum[:]); err != nil {
			return r, s.readErr(err)
		}
		s.buf = append(s.buf, sum[:]...)
		r.Digest.Sum = [2]uint64{binary.BigEndian.Uint64(sum[:8]), binary.BigEndian.Uint64(sum[8:])}
	default:
		return r, fmt.Errorf("%w: %s: unknown record kind %q after revision %d", ErrCorrupt, s.name, kind, s.last)
	}
	s.n++
	if kind == KindRevision {
		chained := s.buf
		if s.Header.Format >= 2 {
			chained = append(s.buf[:s.timeAt:s.timeAt], s.buf[s.timeEnd:]...)
		}
		s.chain = NextChain(s.chain, chained)
	}
	return r, nil
}

func (s *Reader) readErr(err error) error {
	if errors.Is(err, crypt.ErrCorrupt) {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %s is truncated after revision %d", ErrCorrupt, s.name, s.last)
	}
	return fmt.Errorf("changelog: read %s: %w", s.name, err)
}

func (s *Reader) uvarint() (uint64, error) {
	v, err := binary.ReadUvarint(s.r)
	if err != nil {
		return 0, s.readErr(err)
	}
	s.buf = binary.AppendUvarint(s.buf, v)
	return v, nil
}

func (s *Reader) varint() (int64, error) {
	v, err := binary.ReadVarint(s.r)
	if err != nil {
		return 0, s.readErr(err)
	}
	s.buf = binary.AppendVarint(s.buf, v)
	return v, nil
}

// finish checks the body as a whole once it is read.
func (s *Reader) finish() error {
	h := s.Header
	switch {
	case s.read != h.BodySize:
		return fmt.Errorf("%w: %s: body is %d bytes, its header says %d", ErrCorrupt, s.name, s.read, h.BodySize)
	case hex.EncodeToString(s.body.Sum(nil)) != h.SHA256:
		return fmt.Errorf("%w: %s: body does not match its sha256", ErrCorrupt, s.name)
	case s.n != h.Records:
		return fmt.Errorf("%w: %s: %d records, its header says %d", ErrCorrupt, s.name, s.n, h.Records)
	case s.last != h.Last:
		return fmt.Errorf("%w: %s: ends at revision %d, its header says %d", ErrCorrupt, s.name, s.last, h.Last)
	case hex.EncodeToString(s.chain) != h.Chain:
		return fmt.Errorf("%w: %s: its records do not hash to its chain value", ErrCorrupt, s.name)
	}
	return io.EOF
}
