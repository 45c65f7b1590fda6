package changelog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/proto"
)

func TestDigestRecordRoundTrip(t *testing.T) {
	dir := t.TempDir()
	w, err := newSegmentWriter(dir, "tl1", mustHex(RunStart("tl1", 9)), 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := Digest{Keys: 3, Sum: [2]uint64{1 << 63, 42}}
	for _, r := range []Record{
		{Kind: KindRevision, Revision: 10, Time: 1, Events: []Event{{Value: []byte("v")}}},
		{Kind: KindDigest, Revision: 10, Digest: d},
	} {
		if err := w.add(r); err != nil {
			t.Fatal(err)
		}
	}
	h, err := w.cut()
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := readAll(objectBytes(t, spooled{Header: h, path: filepath.Join(dir, spoolName("tl1", 10))}))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[1].Kind != KindDigest || recs[1].Digest != d || recs[1].Revision != 10 {
		t.Errorf("read back %+v", recs)
	}
}

// TestCheckDigest builds a key bucket by hand: puts, an overwrite, a
// delete, and a revision after the digest's.
func TestCheckDigest(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	kvs := []struct {
		rev  int64
		tomb bool
		kv   *mvccpb.KeyValue
	}{
		{2, false, &mvccpb.KeyValue{Key: []byte("a"), Value: []byte("1"), CreateRevision: 2, ModRevision: 2, Version: 1}},
		{3, false, &mvccpb.KeyValue{Key: []byte("b"), Value: []byte("1"), CreateRevision: 3, ModRevision: 3, Version: 1, Lease: 7}},
		{4, false, &mvccpb.KeyValue{Key: []byte("a"), Value: []byte("2"), CreateRevision: 2, ModRevision: 4, Version: 2}},
		{5, true, &mvccpb.KeyValue{Key: []byte("b")}},
		{6, false, &mvccpb.KeyValue{Key: []byte("c"), Value: []byte("1"), CreateRevision: 6, ModRevision: 6, Version: 1}},
		{7, false, &mvccpb.KeyValue{}}, // what etcdutl's --bump-revision writes
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(schema.Key.Name())
		if err != nil {
			return err
		}
		for _, e := range kvs {
			k := mvcc.RevToBytes(mvcc.Revision{Main: e.rev}, mvcc.NewRevBytes())
			if e.tomb {
				k = append(k, 't')
			}
			v, _ := proto.Marshal(e.kv)
			if err := b.Put(k, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// At revision 5 only a=2 is live.
	var want Digest
	want.add(kvHash(kvs[2].kv))
	a := &applier{db: db}
	if err := a.checkDigest(Record{Revision: 5, Digest: want}); err != nil {
		t.Errorf("the right digest: %v", err)
	}
	wrong := want
	wrong.Sum[1]++
	if err := a.checkDigest(Record{Revision: 5, Digest: wrong}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a wrong digest: %v, want ErrCorrupt", err)
	}
	// The bump's mark is no key.
	var at7 Digest
	at7.add(kvHash(kvs[2].kv))
	at7.add(kvHash(kvs[4].kv))
	if err := a.checkDigest(Record{Revision: 7, Digest: at7}); err != nil {
		t.Errorf("the digest at 7, after a bump's mark: %v", err)
	}
	// At revision 3, a=1 and b=1 (with its lease).
	var at3 Digest
	at3.add(kvHash(kvs[0].kv))
	at3.add(kvHash(kvs[1].kv))
	if err := a.checkDigest(Record{Revision: 3, Digest: at3}); err != nil {
		t.Errorf("the digest at 3: %v", err)
	}
	lease := &mvccpb.KeyValue{Key: []byte("b"), Value: []byte("1"), CreateRevision: 3, ModRevision: 3, Version: 1, Lease: 8}
	var other Digest
	other.add(kvHash(kvs[0].kv))
	other.add(kvHash(lease))
	if err := a.checkDigest(Record{Revision: 3, Digest: other}); err == nil || !bytes.Contains([]byte(err.Error()), []byte("revision 3")) {
		t.Errorf("a digest with another lease: %v, want a mismatch at revision 3", err)
	}
}

// An apply that fails midway, with revisions written but not committed,
// returns its error: it used to wait forever in bbolt's Close.
func TestApplyFailureReturns(t *testing.T) {
	ctx := context.Background()
	s := fileStore(t)
	at := func(r int64) time.Duration { return time.Duration(r) * time.Second }
	segs, _ := storeSegments(t, s, mustHex(RunStart("tl1", 9)), &Base{Backup: "b", Revision: 9}, 10, 29, 10, at)
	// The second segment is replaced by one that does not chain on.
	w, err := newSegmentWriter(t.TempDir(), "tl1", mustHex(RunStart("tl1", 99)), 20, nil)
	if err != nil {
		t.Fatal(err)
	}
	for r := int64(20); r <= 29; r++ {
		if err := w.add(Record{Kind: KindRevision, Revision: r, Time: 1, Events: []Event{{Value: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
	}
	h, err := w.cut()
	if err != nil {
		t.Fatal(err)
	}
	rd, _ := spooled{Header: h, path: filepath.Join(w.dir, spoolName("tl1", 20))}.open()
	if err := s.Delete(ctx, KeyOf(segs[1])); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateFrom(ctx, KeyOf(h), rd); err != nil {
		t.Fatal(err)
	}
	rd.Close()

	// A snapshot at revision 9.
	path := filepath.Join(t.TempDir(), "db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
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
	done := make(chan error, 1)
	go func() {
		_, err := Apply(ctx, s, path, "tl1", 29, ApplyOptions{})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("apply across a broken chain: %v, want ErrCorrupt", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("apply did not return after failing midway")
	}
}

// pagedRanger serves a sorted keyspace a page at a time, as etcd does,
// and records each request's limit.
type pagedRanger struct {
	kvs    []*mvccpb.KeyValue
	limits []int64
}

func (r *pagedRanger) Get(_ context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	op := clientv3.OpGet(key, opts...)
	limit := op.Limit()
	r.limits = append(r.limits, limit)
	resp := &clientv3.GetResponse{}
	for _, kv := range r.kvs {
		if string(kv.Key) < key {
			continue
		}
		if int64(len(resp.Kvs)) == limit {
			resp.More = true
			break
		}
		resp.Kvs = append(resp.Kvs, kv)
	}
	return resp, nil
}

// A digest's pages bring back about digestPageBytes whatever the values'
// size, and the digest is the same whatever the pages.
func TestDigestPagesBoundedInBytes(t *testing.T) {
	for _, tt := range []struct {
		name      string
		keys      int
		valueSize int
		maxLimit  int64
	}{
		{"small values", 3000, 100, digestPage},
		{"512 KiB values", 40, 512 << 10, digestPageBytes / (512 << 10)},
		{"values over the page", 5, digestPageBytes * 2, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &pagedRanger{}
			var want Digest
			for i := range tt.keys {
				kv := &mvccpb.KeyValue{Key: fmt.Appendf(nil, "k%06d", i), Value: make([]byte, tt.valueSize), ModRevision: int64(i + 1)}
				r.kvs = append(r.kvs, kv)
				want.add(kvHash(kv))
			}
			got, err := DigestAt(t.Context(), r, 1)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("digest %+v, want %+v", got, want)
			}
			if r.limits[0] != digestFirstPage {
				t.Errorf("first page %d keys, want %d", r.limits[0], digestFirstPage)
			}
			for _, l := range r.limits[1:] {
				if l < 1 || l > tt.maxLimit {
					t.Fatalf("pages of %v keys, want 1..%d", r.limits, tt.maxLimit)
				}
			}
		})
	}
}
