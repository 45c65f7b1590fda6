package backup

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"

	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Reader is the part of the store that fetching a backup needs.
type Reader interface {
	Read(ctx context.Context, key string) ([]byte, error)
	Reader(ctx context.Context, key string) (io.ReadCloser, error)
}

// ReadMeta reads a backup's meta. A backup without one does not exist.
func ReadMeta(ctx context.Context, s Reader, name string) (Meta, error) {
	var meta Meta
	if !nameRE.MatchString(name) {
		return meta, fmt.Errorf("%w: %q is not a backup name (want <RFC3339 UTC>-<6 digits>, as list-backups prints)", ErrNotFound, name)
	}
	data, err := s.Read(ctx, name+"/"+MetaObject)
	if errors.Is(err, store.ErrNotFound) {
		return meta, fmt.Errorf("%w: backup %s (no %s/%s; see list-backups)", ErrNotFound, name, name, MetaObject)
	}
	if err != nil {
		return meta, fmt.Errorf("backup: read %s/%s: %w", name, MetaObject, err)
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return meta, fmt.Errorf("%w: %s/%s is not valid JSON: %v", ErrCorrupt, name, MetaObject, err)
	}
	return meta, nil
}

// Fetch downloads a backup into dir as a verified snapshot db and returns
// its path and meta. It streams: the object's sha256 is checked against
// the meta (when the meta records one, as ours do), the gzip stream must
// be whole, and the snapshot must pass verify (Verify when nil). Any
// failure names the backup and the object, and wraps ErrNotFound or
// ErrCorrupt.
func Fetch(ctx context.Context, s Reader, name, dir string, verify VerifyFunc) (string, Meta, error) {
	meta, err := ReadMeta(ctx, s, name)
	if err != nil {
		return "", meta, err
	}
	key := name + "/" + DataObject
	r, err := s.Reader(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return "", meta, fmt.Errorf("%w: backup %s has a meta but no %s", ErrCorrupt, name, key)
	}
	if err != nil {
		return "", meta, fmt.Errorf("backup: read %s: %w", key, err)
	}
	defer r.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", meta, fmt.Errorf("backup: %w", err)
	}
	path := filepath.Join(dir, "snapshot.db")
	if err := gunzipTo(path, r, meta, key); err != nil {
		os.Remove(path)
		return "", meta, err
	}
	if verify == nil {
		verify = func(_ context.Context, p string) (snapshot.Status, error) { return Verify(p) }
	}
	if _, err := verify(ctx, path); err != nil {
		os.Remove(path)
		return "", meta, fmt.Errorf("backup %s: %w", name, err)
	}
	return path, meta, nil
}

// gunzipTo writes the gunzipped stream r to path, checking the
// compressed bytes' sha256 against the meta's.
func gunzipTo(path string, r io.Reader, meta Meta, key string) error {
	h := sha256.New()
	counted := &countWriter{}
	src := &errRecorder{r: io.TeeReader(r, io.MultiWriter(h, counted))}
	corrupt := func(err error) error {
		if src.err != nil {
			return fmt.Errorf("backup: read %s: %w", key, src.err) // the store, not the data
		}
		return fmt.Errorf("%w: %s is truncated or damaged: %v", ErrCorrupt, key, err)
	}
	zr, err := gzip.NewReader(src)
	if err != nil {
		return corrupt(err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if _, err := io.Copy(f, zr); err != nil {
		f.Close()
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			return fmt.Errorf("backup: write %s: %w", path, err)
		}
		return corrupt(err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	// Whatever follows the gzip stream still counts towards the hash.
	if _, err := io.Copy(io.Discard, src); err != nil {
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
	return nil
}

// errRecorder remembers the error of the reader it wraps, other than EOF.
type errRecorder struct {
	r   io.Reader
	err error
}

func (e *errRecorder) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}
