package backup

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/crypt/crypttest"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// recordingStore counts what is read of data objects, to show that a
// refused fetch read nothing of them.
type recordingStore struct {
	*store.Store
	dataOpened int
}

func (r *recordingStore) Reader(ctx context.Context, key string) (io.ReadCloser, error) {
	if strings.HasSuffix(key, "/"+DataObject) {
		r.dataOpened++
	}
	return r.Store.Reader(ctx, key)
}

func newStore(t *testing.T) *recordingStore {
	t.Helper()
	s, err := store.Open(t.Context(), "file://"+filepath.Join(t.TempDir(), "s"), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &recordingStore{Store: s}
}

// fakeDB writes a snapshot db: n bytes of pages as a streamed snapshot
// holds them, with their sha256 trailer after them.
func fakeDB(t *testing.T, n int) (string, []byte) {
	t.Helper()
	db := make([]byte, n)
	rand.Read(db)
	sum := sha256.Sum256(db)
	db = append(db, sum[:]...)
	p := filepath.Join(t.TempDir(), "snapshot.db")
	if err := os.WriteFile(p, db, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, db
}

func fetchOpts(keys *crypt.Keyring) FetchOptions {
	return FetchOptions{Keys: keys, Status: func(context.Context, string) (snapshot.Status, error) { return snapshot.Status{}, nil }}
}

// An encrypted backup round-trips, its meta names the key, and what is
// stored is neither the snapshot nor a gzip of it.
func TestEncryptedRoundTrip(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	k := crypttest.Key(t)
	keys := crypt.NewKeyring(k)
	path, db := fakeDB(t, 300<<10)
	name := "2026-01-01T00:00:00Z-000001"
	meta, err := write(ctx, s, name, path, keys, Meta{EtcdVersion: "3.6.16", Timestamp: 1, Size: int64(len(db))})
	if err != nil {
		t.Fatal(err)
	}
	if meta.Encryption == nil || meta.Encryption.Scheme != "age" || meta.Encryption.KeyID != k.ID() {
		t.Fatalf("meta.Encryption = %+v, want age and %s", meta.Encryption, k.ID())
	}
	stored, err := s.ReadMax(ctx, name+"/"+DataObject, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(stored)
	if meta.SHA256 != hex.EncodeToString(sum[:]) || meta.CompressedSize != int64(len(stored)) {
		t.Error("the meta's sha256 and size are not the stored object's")
	}
	if bytes.HasPrefix(stored, []byte{0x1f, 0x8b}) || !bytes.HasPrefix(stored, []byte("age-encryption.org/v1\n")) || bytes.Contains(stored, db[:32]) {
		t.Errorf("the stored object is not an age file: starts %q", stored[:min(len(stored), 24)])
	}
	raw, _ := s.ReadMax(ctx, name+"/"+MetaObject, MaxMetaSize)
	if !strings.Contains(string(raw), `"encryption":{"scheme":"age","keyId":"`+k.ID()+`"}`) {
		t.Errorf("the meta's JSON lacks the encryption field: %s", raw)
	}
	// Readers see the key in the meta.
	got, err := ReadMeta(ctx, s, name)
	if err != nil || got.Encryption == nil || got.Encryption.KeyID != k.ID() {
		t.Fatalf("ReadMeta = %+v, %v", got.Encryption, err)
	}

	// A reader with the key as one of several, not its writing one, reads it.
	old := crypt.NewKeyring(crypttest.Key(t), k)
	fetched, _, err := Fetch(ctx, s, name, t.TempDir(), fetchOpts(old))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(fetched); !bytes.Equal(b, db) {
		t.Fatal("the fetched snapshot differs")
	}
}

// A backup whose key is not held is refused before anything of the data
// object is read or written, naming the key, both with another key and
// with none.
func TestEncryptedWithoutItsKey(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	k := crypttest.Key(t)
	path, db := fakeDB(t, 64<<10)
	name := "2026-01-01T00:00:00Z-000001"
	if _, err := write(ctx, s, name, path, crypt.NewKeyring(k), Meta{EtcdVersion: "3.6.16", Timestamp: 1, Size: int64(len(db))}); err != nil {
		t.Fatal(err)
	}
	other := crypttest.Key(t)
	for _, tt := range []struct {
		name string
		keys *crypt.Keyring
		want string
	}{
		{"wrong key", crypt.NewKeyring(other), "the keys here are [" + other.ID() + "]"},
		{"no key", nil, "no key is configured here"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s.dataOpened = 0
			_, _, err := Fetch(ctx, s, name, dir, fetchOpts(tt.keys))
			var nk *crypt.NoKeyError
			if !errors.Is(err, ErrNoKey) || !errors.As(err, &nk) || nk.KeyID != k.ID() {
				t.Fatalf("err = %v, want ErrNoKey naming %s", err, k.ID())
			}
			for _, w := range []string{"backup " + name + " is encrypted with key " + k.ID(), tt.want} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			if errors.Is(err, ErrCorrupt) {
				t.Error("a missing key is reported as a corrupt backup")
			}
			if s.dataOpened != 0 {
				t.Errorf("the data object was opened %d times before the key was found missing", s.dataOpened)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("%d files written", len(entries))
			}
		})
	}
}

// Tampering with an encrypted object is ErrCorrupt naming it, whether the
// meta's sha256 would have caught it or not (a kops-style meta has none).
func TestEncryptedTampered(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	k := crypttest.Key(t)
	keys := crypt.NewKeyring(k)
	path, db := fakeDB(t, 200<<10)
	name := "2026-01-01T00:00:00Z-000001"
	meta, err := write(ctx, s, name, path, keys, Meta{EtcdVersion: "3.6.16", Timestamp: 1, Size: int64(len(db))})
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := s.ReadMax(ctx, name+"/"+DataObject, 1<<30)
	bare := Meta{EtcdVersion: meta.EtcdVersion, Timestamp: meta.Timestamp, Encryption: meta.Encryption}
	flip := func(at int) []byte { b := bytes.Clone(stored); b[at] ^= 1; return b }
	otherKey := crypttest.Key(t)
	var reenc bytes.Buffer
	w, _, _ := crypt.NewKeyring(otherKey).Encrypt(&reenc)
	w.Write(stored) // any age file to another key
	w.Close()
	for i, tt := range []struct {
		name string
		data []byte
		meta Meta
		want string
	}{
		{"flipped byte, meta with sha256", flip(len(stored) / 2), meta, DataObject},
		{"flipped byte, meta without sha256", flip(len(stored) / 2), bare, "does not decrypt"},
		{"truncated, meta without sha256", stored[:len(stored)-50], bare, "does not decrypt"},
		{"encrypted to another key than the meta names", reenc.Bytes(), bare, "is not encrypted to key " + k.ID()},
		{"plaintext gzip under an encrypted meta", gzipOf(db), bare, "does not decrypt"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := name[:len(name)-1] + string(rune('2'+i))
			m, _ := json.Marshal(tt.meta)
			if err := s.Write(ctx, n+"/"+DataObject, tt.data); err != nil {
				t.Fatal(err)
			}
			if err := s.Write(ctx, n+"/"+MetaObject, m); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			_, _, err := Fetch(ctx, s, n, dir, fetchOpts(keys))
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), n+"/"+DataObject) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrCorrupt naming %s/%s with %q", err, n, DataObject, tt.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("a failed fetch left %d files", len(entries))
			}
		})
	}
}

func gzipOf(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// A plaintext backup restores on an agent that has a key: encryption is
// for what is written.
func TestPlaintextBackupWithKeysConfigured(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	path, db := fakeDB(t, 64<<10)
	name := "2026-01-01T00:00:00Z-000001"
	meta, err := write(ctx, s, name, path, nil, Meta{EtcdVersion: "3.6.16", Timestamp: 1, Size: int64(len(db))})
	if err != nil {
		t.Fatal(err)
	}
	if meta.Encryption != nil {
		t.Fatalf("a backup without a key records encryption %+v", meta.Encryption)
	}
	stored, _ := s.ReadMax(ctx, name+"/"+DataObject, 1<<30)
	if !bytes.HasPrefix(stored, []byte{0x1f, 0x8b}) {
		t.Fatal("a backup without a key is not plain gzip")
	}
	fetched, _, err := Fetch(ctx, s, name, t.TempDir(), fetchOpts(crypt.NewKeyring(crypttest.Key(t))))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(fetched); !bytes.Equal(b, db) {
		t.Fatal("the fetched snapshot differs")
	}
}

// The bounds on what is unpacked apply to what is inside the encryption:
// a bomb encrypted with the agent's own key stops at the meta's size, or
// at the maximum when the meta records none.
func TestEncryptedBomb(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	k := crypttest.Key(t)
	keys := crypt.NewKeyring(k)
	var obj bytes.Buffer
	w, info, _ := keys.Encrypt(&obj)
	w.Write(gzipOf(make([]byte, 64<<20))) // 64 MiB of zeros
	w.Close()
	if obj.Len() > 1<<20 {
		t.Fatalf("the bomb is %d bytes", obj.Len())
	}
	for i, tt := range []struct {
		name    string
		meta    Meta
		opts    FetchOptions
		wantErr error
		want    string
	}{
		{"past its meta's size", Meta{EtcdVersion: "3.6.16", Timestamp: 1, Size: 256 << 10, Encryption: info}, FetchOptions{},
			ErrCorrupt, "more than the 262144 bytes its meta records"},
		{"no size, past the maximum", Meta{EtcdVersion: "3.6.16", Timestamp: 1, Encryption: info}, FetchOptions{MaxBytes: 1 << 20},
			ErrTooLarge, "over 1048576 bytes, the agent's maximum"},
		{"no size, past the free space", Meta{EtcdVersion: "3.6.16", Timestamp: 1, Encryption: info}, FetchOptions{Reserve: 1 << 20, DiskSpace: freeOf(3 << 20)},
			ErrTempFull, "over 2097152 bytes, the space"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			name := "2026-01-01T00:00:00Z-00000" + string(rune('1'+i))
			m, _ := json.Marshal(tt.meta)
			s.Write(ctx, name+"/"+DataObject, obj.Bytes())
			s.Write(ctx, name+"/"+MetaObject, m)
			dir := t.TempDir()
			opts := tt.opts
			opts.Keys, opts.Status = keys, fetchOpts(nil).Status
			_, _, err := Fetch(ctx, s, name, dir, opts)
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), name+"/"+DataObject) {
				t.Fatalf("err = %v, want %v with %q naming the object", err, tt.wantErr, tt.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("a failed fetch left %d files", len(entries))
			}
		})
	}
}

// A meta's encryption field is read from the store, and checked.
func TestMetaEncryptionIsChecked(t *testing.T) {
	for _, field := range []string{`{"scheme":"rot13","keyId":"age:0123456789abcdef"}`, `{"scheme":"age","keyId":"age:../../../x"}`, `{"scheme":"age"}`} {
		_, err := decodeMeta("n", []byte(`{"etcdVersion":"3.6.16","timestamp":"1","encryption":`+field+`}`))
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "n/"+MetaObject) {
			t.Errorf("encryption %s: err = %v, want ErrCorrupt naming the meta", field, err)
		}
	}
}

// The read-ahead that decrypts beside the unpacking passes every byte
// in order, then the source's error, and stops when closed early.
func TestReadAhead(t *testing.T) {
	data := make([]byte, 1<<20+12345)
	rand.Read(data)
	boom := errors.New("store gone")
	ra := newReadAhead(io.MultiReader(bytes.NewReader(data), errReader{boom}))
	got, err := io.ReadAll(ra)
	ra.Close()
	if !bytes.Equal(got, data) || !errors.Is(err, boom) {
		t.Fatalf("read %d of %d bytes, err %v; want all, then %v", len(got), len(data), err, boom)
	}
	ra = newReadAhead(bytes.NewReader(data))
	if got, err := io.ReadAll(ra); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d of %d bytes, err %v", len(got), len(data), err)
	}
	ra.Close()
	ra = newReadAhead(io.MultiReader(bytes.NewReader(data), bytes.NewReader(data), bytes.NewReader(data)))
	io.ReadFull(ra, make([]byte, 1000))
	ra.Close() // with chunks still queued
	ra.Close()
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
