package changelog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/proto"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/crypt/crypttest"
)

func encryptedObject(t *testing.T, s spooled, keys *crypt.Keyring) []byte {
	t.Helper()
	r, err := s.object(keys)
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

func readAllWith(data []byte, keys *crypt.Keyring) ([]Record, error) {
	rd, err := NewReader(bytes.NewReader(data), "wal/tl1/seg", keys)
	if err != nil {
		return nil, err
	}
	var out []Record
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		for i := range rec.Events {
			rec.Events[i].Value = bytes.Clone(rec.Events[i].Value)
		}
		out = append(out, rec)
	}
}

// An encrypted segment reads back as the plaintext one does; its header
// stays readable without a key and names the key, and its body is not
// in the clear.
func TestEncryptedSegmentRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := spoolSegment(t, dir, mustHex(RunStart("tl1", 9)), 10, 20, &Base{Backup: "b", Revision: 9})
	k := crypttest.Key(t)
	keys := crypt.NewKeyring(k)
	plain := objectBytes(t, s)
	obj := encryptedObject(t, s, keys)
	if bytes.Contains(obj, []byte("put ")) || bytes.Contains(obj, []byte("del")) {
		t.Fatal("the encrypted segment holds its events in the clear")
	}
	h, err := ReadHeader(bytes.NewReader(obj), "seg")
	if err != nil {
		t.Fatal(err)
	}
	if h.Format != FormatEncrypted || h.Encryption == nil || h.Encryption.KeyID != k.ID() {
		t.Fatalf("header: format %d, encryption %+v; want %d and %s", h.Format, h.Encryption, FormatEncrypted, k.ID())
	}
	// The header describes the plaintext body, as the spool's does.
	if h.SHA256 != s.Header.SHA256 || h.BodySize != s.Header.BodySize || h.Chain != s.Header.Chain {
		t.Error("the encrypted segment's header does not describe its plaintext body")
	}
	want, err := readAllWith(plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := readAllWith(obj, keys)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) || len(got) != 12 {
		t.Fatalf("decrypted records differ: %d, want %d", len(got), len(want))
	}
	// A keyring that does not encrypt uploads the spool's own form.
	if !bytes.Equal(encryptedObject(t, s, crypt.NewKeyring(nil, k)), plain) {
		t.Error("a keyring without a writing key changed the segment")
	}
}

func TestEncryptedSegmentWithoutKey(t *testing.T) {
	s := spoolSegment(t, t.TempDir(), mustHex(RunStart("tl1", 9)), 10, 20, &Base{Backup: "b", Revision: 9})
	k, other := crypttest.Key(t), crypttest.Key(t)
	obj := encryptedObject(t, s, crypt.NewKeyring(k))
	for _, keys := range []*crypt.Keyring{nil, crypt.NewKeyring(other)} {
		_, err := readAllWith(obj, keys)
		var nk *crypt.NoKeyError
		if !errors.Is(err, ErrNoKey) || !errors.As(err, &nk) || nk.KeyID != k.ID() ||
			!strings.Contains(err.Error(), "segment wal/tl1/seg is encrypted with key "+k.ID()) {
			t.Errorf("keys %v: err = %v, want ErrNoKey naming the segment and %s", keys.IDs(), err, k.ID())
		}
		if errors.Is(err, ErrCorrupt) {
			t.Error("a missing key is reported as a corrupt segment")
		}
	}
}

func TestEncryptedSegmentTampered(t *testing.T) {
	s := spoolSegment(t, t.TempDir(), mustHex(RunStart("tl1", 9)), 10, 400, &Base{Backup: "b", Revision: 9})
	k, other := crypttest.Key(t), crypttest.Key(t)
	keys := crypt.NewKeyring(k, other)
	obj := encryptedObject(t, s, crypt.NewKeyring(k))
	nl := bytes.IndexByte(obj, '\n') + 1
	header, body := obj[:nl], obj[nl:]
	withHeader := func(edit func(*Header)) []byte {
		var h Header
		if err := json.Unmarshal(header, &h); err != nil {
			t.Fatal(err)
		}
		edit(&h)
		b, _ := json.Marshal(h)
		return append(append(b, '\n'), body...)
	}
	flip := func(at int) []byte { b := bytes.Clone(obj); b[at] ^= 1; return b }
	plain := objectBytes(t, s)
	plainBody := plain[bytes.IndexByte(plain, '\n')+1:]
	for _, tt := range []struct {
		name string
		data []byte
		want string
	}{
		{"a body byte flipped", flip(nl + len(body)/2), "does not decrypt"},
		{"the last byte flipped", flip(len(obj) - 1), "does not decrypt"},
		{"cut short", obj[:len(obj)-30], "does not decrypt"},
		{"body of another segment's key", withHeader(func(h *Header) { h.Encryption.KeyID = other.ID() }), "is not encrypted to key " + other.ID()},
		{"encrypted, yet format 2", withHeader(func(h *Header) { h.Format = FormatVersion }), "only format 3 is encrypted"},
		{"format 3 without encryption", withHeader(func(h *Header) { h.Encryption = nil }), "only format 3 is encrypted"},
		{"an unknown scheme", withHeader(func(h *Header) { h.Encryption.Scheme = "rot13" }), `scheme "rot13"`},
		{"a plaintext body under an encrypted header", append(bytes.Clone(header), plainBody...), "does not decrypt"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readAllWith(tt.data, keys)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrCorrupt with %q", err, tt.want)
			}
		})
	}
}

// uploadEncrypted stores segments of size revisions from first to last as
// capture's upload does, encrypted with keys.
func uploadEncrypted(t *testing.T, st Store, keys *crypt.Keyring, first, last, size int64) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	c, err := New(Default(), dir, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c.Keys = keys
	prev := mustHex(RunStart("tl1", first-1))
	for f := first; f <= last; f += size {
		var base *Base
		if f == first {
			base = &Base{Backup: "b", Revision: first - 1}
		}
		w, err := newSegmentWriter(dir, "tl1", prev, f, base)
		if err != nil {
			t.Fatal(err)
		}
		for r := f; r < f+size && r <= last; r++ {
			kv, _ := proto.Marshal(&mvccpb.KeyValue{Key: []byte("k"), Value: []byte{byte(r)}, CreateRevision: first, ModRevision: r, Version: r - first + 1})
			if err := w.add(Record{Kind: KindRevision, Revision: r, Time: int64(time.Duration(r) * 5 * time.Second), Events: []Event{{Value: kv}}}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := w.cut(); err != nil {
			t.Fatal(err)
		}
		prev = w.chain
	}
	if err := c.UploadOnce(ctx); err != nil {
		t.Fatal(err)
	}
}

// Capture's upload encrypts; a merge decrypts its sources with any key
// it holds and encrypts what it writes with its writing key; a restore's
// Apply and a --to-time lookup decrypt, and name the key they lack.
func TestEncryptedCaptureMergeApply(t *testing.T) {
	ctx := context.Background()
	s := fileStore(t)
	oldKey, newKey := crypttest.Key(t), crypttest.Key(t)
	uploadEncrypted(t, s, crypt.NewKeyring(oldKey), 10, 69, 5)
	refs, err := List(ctx, s, "tl1")
	if err != nil || len(refs) != 12 {
		t.Fatalf("%d segments uploaded, %v", len(refs), err)
	}
	for _, r := range refs {
		h, err := ReadHeaderAt(ctx, s, r.Key)
		if err != nil || h.Encryption == nil || h.Encryption.KeyID != oldKey.ID() {
			t.Fatalf("%s: header %+v, %v; want encrypted with %s", r.Key, h.Encryption, err, oldKey.ID())
		}
	}

	// A merger without the key merges nothing, and says which key.
	m := &Merger{Store: s, Dir: t.TempDir(), Windows: []time.Duration{time.Minute}, Log: slog.New(slog.DiscardHandler), Keys: crypt.NewKeyring(newKey)}
	_, err = m.Once(ctx, "tl1", time.Unix(0, int64(time.Hour)))
	if !errors.Is(err, ErrNoKey) || !strings.Contains(err.Error(), oldKey.ID()) {
		t.Fatalf("merge without the key: %v, want ErrNoKey naming %s", err, oldKey.ID())
	}
	// After a rotation: the new key writes, the old one still reads.
	m.Keys = crypt.NewKeyring(newKey, oldKey)
	res, err := m.Once(ctx, "tl1", time.Unix(0, int64(time.Hour)))
	if err != nil || res.Merged == 0 {
		t.Fatalf("merge = %+v, %v", res, err)
	}
	refs, _ = List(ctx, s, "tl1")
	merged := 0
	for _, r := range refs {
		h, _ := ReadHeaderAt(ctx, s, r.Key)
		if h.Level > 0 {
			merged++
			if h.Encryption == nil || h.Encryption.KeyID != newKey.ID() {
				t.Errorf("merged segment %s: encryption %+v, want %s", r.Key, h.Encryption, newKey.ID())
			}
		}
	}
	if merged == 0 {
		t.Fatal("no merged segment in the store")
	}

	// A --to-time lookup reads times inside a segment.
	at := time.Unix(0, int64(37*5*time.Second))
	if _, _, err := RevisionAt(ctx, s, "tl1", at, nil); !errors.Is(err, ErrNoKey) {
		t.Errorf("RevisionAt without keys: %v, want ErrNoKey", err)
	}
	if rev, ok, err := RevisionAt(ctx, s, "tl1", at, m.Keys); err != nil || !ok || rev != 37 {
		t.Errorf("RevisionAt = %d, %v, %v; want 37", rev, ok, err)
	}

	// Apply: with only the old key, the merged segments' key is named.
	if _, err := Apply(ctx, s, snapshotAt9(t), "tl1", 69, ApplyOptions{Keys: crypt.NewKeyring(oldKey)}); !errors.Is(err, ErrNoKey) || !strings.Contains(err.Error(), newKey.ID()) {
		t.Fatalf("apply without the new key: %v, want ErrNoKey naming %s", err, newKey.ID())
	}
	applied, err := Apply(ctx, s, snapshotAt9(t), "tl1", 69, ApplyOptions{Keys: crypt.NewKeyring(nil, oldKey, newKey)})
	if err != nil {
		t.Fatal(err)
	}
	if applied.To != 69 || applied.Revisions != 60 || !slices.Contains(applied.Keys, newKey.ID()) || len(applied.Keys) > 2 {
		t.Errorf("applied = %+v; want revisions 10..69 and the keys used (new %s, old %s)", applied, newKey.ID(), oldKey.ID())
	}
}

// snapshotAt9 is a snapshot db at revision 9, with etcd's trailer.
func snapshotAt9(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "db")
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucket(schema.Key.Name())
		if err != nil {
			return err
		}
		v, _ := proto.Marshal(&mvccpb.KeyValue{Key: []byte("a"), Value: []byte("1"), CreateRevision: 9, ModRevision: 9, Version: 1})
		return b.Put(mvcc.RevToBytes(mvcc.Revision{Main: 9}, mvcc.NewRevBytes()), v)
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if err := appendTrailer(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// Bringing a snapshot forward stops, with ErrTooLarge naming the bound,
// once the file grows past its MaxBytes; within it, it goes through.
func TestApplyBound(t *testing.T) {
	ctx := context.Background()
	s := fileStore(t)
	k := crypttest.Key(t)
	uploadEncrypted(t, s, crypt.NewKeyring(k), 10, 69, 5)
	_, err := Apply(ctx, s, snapshotAt9(t), "tl1", 69, ApplyOptions{Keys: crypt.NewKeyring(k), MaxBytes: 4096})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "--max-snapshot-bytes") {
		t.Fatalf("apply past the bound: %v, want ErrTooLarge", err)
	}
	if _, err := Apply(ctx, s, snapshotAt9(t), "tl1", 69, ApplyOptions{Keys: crypt.NewKeyring(k), MaxBytes: 64 << 20}); err != nil {
		t.Fatalf("apply within the bound: %v", err)
	}
}
