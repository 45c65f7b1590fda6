package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	kgzip "github.com/klauspost/compress/gzip"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Reader is the part of the store that fetching a backup needs.
type Reader interface {
	ReadMax(ctx context.Context, key string, max int64) ([]byte, error)
	Reader(ctx context.Context, key string) (io.ReadCloser, error)
}

// MaxMetaSize bounds a meta read from the store: ours hold a few fields
// and the cluster spec (itself at most 64 KiB).
const MaxMetaSize = 256 << 10

// ReadMeta reads a backup's meta. A backup without one does not exist.
func ReadMeta(ctx context.Context, s Reader, name string) (Meta, error) {
	var meta Meta
	if !nameRE.MatchString(name) {
		return meta, fmt.Errorf("%w: %q is not a backup name (want <RFC3339 UTC>-<6 digits>, as list-backups prints)", ErrNotFound, name)
	}
	data, err := s.ReadMax(ctx, name+"/"+MetaObject, MaxMetaSize)
	if errors.Is(err, store.ErrNotFound) {
		return meta, fmt.Errorf("%w: backup %s (no %s/%s; see list-backups)", ErrNotFound, name, name, MetaObject)
	}
	if errors.Is(err, store.ErrTooLarge) {
		return meta, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err != nil {
		return meta, fmt.Errorf("backup: read %s/%s: %w", name, MetaObject, err)
	}
	return decodeMeta(name, data)
}

// decodeMeta parses and checks the meta of backup name. A meta is read
// from the store, so what is used as a path or a bound is checked here.
func decodeMeta(name string, data []byte) (Meta, error) {
	var meta Meta
	if err := json.Unmarshal(data, &meta); err != nil {
		return meta, fmt.Errorf("%w: %s/%s is not valid JSON: %v", ErrCorrupt, name, MetaObject, err)
	}
	bad := ""
	switch {
	case meta.ClusterToken != "" && !spec.ValidClusterToken(meta.ClusterToken):
		bad = "cluster token " + spec.QuoteShort(meta.ClusterToken) + " is not of a token's form"
	case meta.Size < 0 || meta.CompressedSize < 0 || meta.Revision < 0 || meta.TotalKeys < 0:
		bad = "a size, revision or key count is negative"
	case meta.Seconds < 0:
		bad = "duration is negative"
	case len(meta.Kind) > 32:
		bad = "kind " + spec.QuoteShort(meta.Kind) + " is over 32 bytes"
	case meta.HashKV != nil && (meta.HashKV.CompactRevision < -1 || meta.HashKV.CompactRevision > meta.Revision):
		bad = fmt.Sprintf("HashKV's compact revision %d is not within -1 (none) and the revision %d", meta.HashKV.CompactRevision, meta.Revision)
	case meta.SHA256 != "" && !sha256RE.MatchString(meta.SHA256):
		bad = "sha256 " + spec.QuoteShort(meta.SHA256) + " is not 64 hex digits"
	case meta.Encryption != nil:
		if err := meta.Encryption.Validate(); err != nil {
			bad = err.Error()
		}
	}
	if bad != "" {
		return meta, fmt.Errorf("%w: %s/%s: its %s", ErrCorrupt, name, MetaObject, bad)
	}
	return meta, nil
}

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// FetchOptions bound and check what Fetch writes.
type FetchOptions struct {
	// Status reads the snapshot's status, which reads every key
	// (ReadStatus when nil); its sha256 trailer is checked as it streams
	// in.
	Status VerifyFunc
	// Hashed skips the status read when the meta records the object's
	// sha256 and the stream matched it: for a caller that knows these
	// very bytes were verified whole already (a node restoring the
	// backup its leader fetched and verified before it stopped the
	// cluster). The trailer is still checked.
	Hashed bool
	// MaxBytes caps the snapshot written, whatever its meta says (0: no
	// cap of its own).
	MaxBytes int64
	// Reserve is the space Fetch leaves free on dir's file system, for
	// whatever else uses that disk (a live etcd, say): at most a tenth of
	// that file system, so that a small disk can still hold a small
	// backup.
	Reserve int64
	// DiskSpace reports the space left on dir's file system and its size
	// (etcdproc.DiskSpace when nil).
	DiskSpace func(dir string) (free, total int64, err error)
	// Keys decrypt an encrypted backup (nil: plaintext backups only).
	Keys *crypt.Keyring
	// Meter, when set, follows the object's download.
	Meter Meter
}

// Meter follows a long transfer: Begin starts one of total bytes (0: not
// known), named what; add counts bytes done, and end ends it.
type Meter interface {
	Begin(what string, total int64) (add func(n int64), end func())
}

// meteredReader counts the bytes read through it.
type meteredReader struct {
	io.ReadCloser
	add func(int64)
}

func (r meteredReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.add(int64(n))
	return n, err
}

// Fetch downloads a backup into dir as a verified snapshot db and returns
// its path and meta. It streams: the object's sha256 is checked against
// the meta (when the meta records one, as ours do), the gzip stream must
// be whole, the snapshot's sha256 trailer must match as it is written, and
// then its status is read (unless opts.Hashed allows otherwise). The
// object is untrusted, so the snapshot written stops at the smallest of
// the meta's size, the free space less opts.Reserve and opts.MaxBytes; a
// meta that records a size larger than the space is refused before
// anything is read. An encrypted backup whose key opts.Keys lacks is
// refused before anything is read too, with a *crypt.NoKeyError naming
// the key (ErrNoKey); the bounds apply to what it decrypts and unpacks to,
// and an object that does not decrypt is ErrCorrupt. Any failure names
// the backup and the object, and wraps ErrNotFound, ErrCorrupt,
// ErrTooLarge, ErrTempFull or ErrNoKey.
func Fetch(ctx context.Context, s Reader, name, dir string, opts FetchOptions) (string, Meta, error) {
	meta, err := ReadMeta(ctx, s, name)
	if err != nil {
		return "", meta, err
	}
	key := name + "/" + DataObject
	if err := opts.Keys.Check("backup "+name, meta.Encryption); err != nil {
		return "", meta, fmt.Errorf("backup: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", meta, fmt.Errorf("backup: %w", err)
	}
	lim, err := opts.limit(dir, meta, key)
	if err != nil {
		return "", meta, err
	}
	r, err := s.Reader(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return "", meta, fmt.Errorf("%w: backup %s has a meta but no %s", ErrCorrupt, name, key)
	}
	if err != nil {
		return "", meta, fmt.Errorf("backup: read %s: %w", key, err)
	}
	defer r.Close()
	if opts.Meter != nil {
		add, end := opts.Meter.Begin("fetch "+name, meta.CompressedSize)
		defer end()
		r = meteredReader{ReadCloser: r, add: add}
	}
	path := filepath.Join(dir, "snapshot.db")
	if err := gunzipTo(path, r, meta, key, lim, opts.Keys); err != nil {
		os.Remove(path)
		return "", meta, err
	}
	if opts.Hashed && meta.SHA256 != "" {
		return path, meta, nil
	}
	status := opts.Status
	if status == nil {
		status = func(_ context.Context, p string) (snapshot.Status, error) { return ReadStatus(p) }
	}
	if _, err := status(ctx, path); err != nil {
		os.Remove(path)
		return "", meta, fmt.Errorf("backup %s: %w", name, err)
	}
	return path, meta, nil
}

// Fits checks, without reading the object, that the snapshot of the
// backup whose meta this is may be unpacked into dir: that it is within
// the maximum and leaves the reserve free. An error wraps ErrTooLarge or
// ErrTempFull and names key; a meta that records no size fits.
func (o FetchOptions) Fits(dir string, meta Meta, key string) error {
	_, err := o.limit(dir, meta, key)
	return err
}

// limit is where the snapshot's bytes stop, and what stopping there
// means.
type limit struct {
	bytes int64
	// over is the error for a snapshot past bytes.
	over func(written int64) error
}

// space is dir's free space and the part of it that must stay free.
func (o FetchOptions) space(dir string) (free, reserve int64, err error) {
	diskSpace := o.DiskSpace
	if diskSpace == nil {
		diskSpace = etcdproc.DiskSpace
	}
	free, total, err := diskSpace(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("backup: %w", err)
	}
	return free, min(o.Reserve, total/10), nil
}

// Room is the largest snapshot that may be unpacked into dir now: its
// free space less the reserve, or the maximum when that is smaller.
func (o FetchOptions) Room(dir string) (int64, error) {
	free, reserve, err := o.space(dir)
	if err != nil {
		return 0, err
	}
	room := max(free-reserve, 0)
	if o.MaxBytes > 0 {
		room = min(room, o.MaxBytes)
	}
	return room, nil
}

func (o FetchOptions) limit(dir string, meta Meta, key string) (limit, error) {
	free, reserve, err := o.space(dir)
	if err != nil {
		return limit{}, err
	}
	room := free - reserve
	if meta.Size > 0 && meta.Size > room {
		return limit{}, fmt.Errorf("%w: %s unpacks to %d bytes (its meta), but %s has %d bytes free and %d must stay free", ErrTempFull, key, meta.Size, dir, free, reserve)
	}
	if o.MaxBytes > 0 && meta.Size > o.MaxBytes {
		return limit{}, fmt.Errorf("%w: %s unpacks to %d bytes (its meta), over the agent's maximum of %d (--max-snapshot-bytes)", ErrTooLarge, key, meta.Size, o.MaxBytes)
	}
	lim := limit{bytes: room, over: func(n int64) error {
		return fmt.Errorf("%w: %s unpacked to over %d bytes, the space %s has beyond the %d that must stay free; stopped there", ErrTempFull, key, n-1, dir, reserve)
	}}
	if o.MaxBytes > 0 && o.MaxBytes < lim.bytes {
		lim = limit{bytes: o.MaxBytes, over: func(n int64) error {
			return fmt.Errorf("%w: %s unpacked to over %d bytes, the agent's maximum (--max-snapshot-bytes); stopped there", ErrTooLarge, key, n-1)
		}}
	}
	if meta.Size > 0 && meta.Size < lim.bytes {
		lim = limit{bytes: meta.Size, over: func(int64) error {
			return fmt.Errorf("%w: %s unpacks to more than the %d bytes its meta records; stopped there", ErrCorrupt, key, meta.Size)
		}}
	}
	if lim.bytes <= 0 {
		return limit{}, fmt.Errorf("%w: %s has %d bytes free and %d must stay free; no room to unpack %s", ErrTempFull, dir, free, reserve, key)
	}
	return lim, nil
}

// gunzipTo writes the gunzipped stream r, decrypted first when the meta
// says it is encrypted, to path, checking the stored bytes' sha256
// against the meta's and the snapshot's sha256 trailer, and stopping past
// lim. klauspost's inflate runs at about 2.5 times the standard
// library's on these machines, and reads the same standard gzip. Reading
// and hashing the object, decrypting it, inflating it, and hashing and
// writing the snapshot each take a goroutine of their own, a few chunks
// apart, so that the two sha256s and the inflate share the cores.
func gunzipTo(path string, r io.Reader, meta Meta, key string, lim limit, keys *crypt.Keyring) error {
	h := sha256.New()
	counted := &countWriter{}
	src := &errRecorder{r: io.TeeReader(r, io.MultiWriter(h, counted))}
	corrupt := func(err error) error {
		if serr := src.Err(); serr != nil {
			return fmt.Errorf("backup: read %s: %w", key, serr) // the store, not the data
		}
		if errors.Is(err, crypt.ErrCorrupt) {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return fmt.Errorf("%w: %s is truncated or damaged: %v", ErrCorrupt, key, err)
	}
	in := newReadAhead(src)
	defer in.Close()
	// Decrypt reads age's header now: an object not encrypted to the key
	// its meta names fails before anything is written.
	plain, err := keys.Decrypt(in, meta.Encryption, key)
	if err != nil {
		return corrupt(err)
	}
	if meta.Encryption != nil {
		// Reading and decrypting in a goroutine of its own lets unpacking
		// run beside it, on another core: ChaCha20-Poly1305 alone runs at
		// about 300 MiB/s on these machines.
		ra := newReadAhead(plain)
		defer ra.Close()
		plain = ra
	}
	zr, err := kgzip.NewReader(plain)
	if err != nil {
		return corrupt(err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	// One byte past the limit tells a stream that ends there from one
	// that goes on.
	unpacked := newReadAhead(io.LimitReader(zr, lim.bytes+1))
	defer unpacked.Close()
	trailer := &trailerHash{h: sha256.New()}
	n, err := io.Copy(io.MultiWriter(f, trailer), unpacked)
	if err != nil {
		f.Close()
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			return fmt.Errorf("backup: write %s: %w", path, err)
		}
		return corrupt(err)
	}
	if n > lim.bytes {
		f.Close()
		return lim.over(n)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	// Whatever follows the gzip stream still counts towards the hash; an
	// encrypted one must end where its last chunk authenticates.
	if _, err := io.Copy(io.Discard, plain); err != nil {
		return corrupt(err)
	}
	if _, err := io.Copy(io.Discard, in); err != nil {
		return corrupt(err)
	}
	if meta.SHA256 != "" {
		if got := hex.EncodeToString(h.Sum(nil)); got != meta.SHA256 {
			return fmt.Errorf("%w: %s has sha256 %s, but its meta records %s", ErrCorrupt, key, got, meta.SHA256)
		}
	}
	if meta.CompressedSize != 0 && counted.n != meta.CompressedSize {
		return fmt.Errorf("%w: %s is %d bytes, but its meta records %d", ErrCorrupt, key, counted.n, meta.CompressedSize)
	}
	if err := trailer.check(); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, key, err)
	}
	return nil
}

// errRecorder remembers the error of the reader it wraps, other than EOF.
// Err may be called from another goroutine than Read's.
type errRecorder struct {
	r   io.Reader
	mu  sync.Mutex
	err error
}

func (e *errRecorder) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.mu.Lock()
		e.err = err
		e.mu.Unlock()
	}
	return n, err
}

// Err is the error recorded, nil when none.
func (e *errRecorder) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// readAhead reads its source in a goroutine of its own, a few chunks
// ahead of its reader. Read is for one goroutine. Close stops the
// goroutine and waits for it to leave the source, so the source may be
// closed after it. An error of the source comes after the data read
// before it.
type readAhead struct {
	full chan aheadChunk
	free chan []byte
	stop chan struct{}
	done chan struct{}
	once sync.Once
	// buf is the chunk being read, cur what is left of it.
	buf, cur []byte
	err      error
}

type aheadChunk struct {
	b   []byte
	err error
}

func newReadAhead(r io.Reader) *readAhead {
	const size, depth = 256 << 10, 4
	ra := &readAhead{full: make(chan aheadChunk, depth), free: make(chan []byte, depth+1), stop: make(chan struct{}), done: make(chan struct{})}
	for range depth + 1 {
		ra.free <- make([]byte, size)
	}
	go ra.fill(r)
	return ra
}

func (ra *readAhead) fill(r io.Reader) {
	defer close(ra.done)
	for {
		var b []byte
		select {
		case b = <-ra.free:
		case <-ra.stop:
			return
		}
		// Fill the chunk; the source's errors pass unchanged (io.EOF
		// ends it, anything else, io.ErrUnexpectedEOF included, fails it).
		var n int
		var err error
		for n < len(b) && err == nil {
			var m int
			m, err = r.Read(b[n:])
			n += m
		}
		select {
		case ra.full <- aheadChunk{b: b[:n], err: err}:
		case <-ra.stop:
			return
		}
		if err != nil {
			return
		}
	}
}

func (ra *readAhead) Read(p []byte) (int, error) {
	for len(ra.cur) == 0 {
		if ra.err != nil {
			return 0, ra.err
		}
		if ra.buf != nil {
			ra.free <- ra.buf[:cap(ra.buf)] // never blocks: free holds every buffer
			ra.buf = nil
		}
		c := <-ra.full
		ra.buf, ra.cur, ra.err = c.b, c.b, c.err
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

// Close stops the read-ahead, once its goroutine is out of the source's
// Read; it is idempotent.
func (ra *readAhead) Close() {
	ra.once.Do(func() { close(ra.stop) })
	<-ra.done
}
