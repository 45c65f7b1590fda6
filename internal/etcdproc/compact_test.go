package etcdproc

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/server/v3/storage/schema"
)

// dumpDB reads every bucket's keys and values.
func dumpDB(t *testing.T, path string) map[string]map[string]string {
	t.Helper()
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]map[string]string{}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			kv := map[string]string{}
			out[string(name)] = kv
			return b.ForEach(func(k, v []byte) error {
				kv[string(k)] = string(v)
				return nil
			})
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCompactDB: a database with most of its keys deleted shrinks, keeps
// every bucket, key and value, passes the start-up check, and a copy left
// by an earlier crash is replaced, not kept.
func TestCompactDB(t *testing.T) {
	dir := t.TempDir()
	path := writeDB(t, dir, 20000, 4)
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(schema.Key.Name())
		c := b.Cursor()
		i := 0
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if i%5 != 4 {
				if err := c.Delete(); err != nil {
					return err
				}
			}
			i++
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	want := dumpDB(t, path)
	stale := filepath.Join(filepath.Dir(path), compactTempName)
	if err := os.WriteFile(stale, []byte("left by a crash"), 0o600); err != nil {
		t.Fatal(err)
	}

	// 64 KiB per transaction: dozens of commits for this file.
	res, err := CompactDB(context.Background(), dir, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if res.SizeAfter <= 0 || res.SizeAfter > res.SizeBefore/2 {
		t.Errorf("compacted from %d to %d bytes; want under half, with four fifths of the keys deleted", res.SizeBefore, res.SizeAfter)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != res.SizeAfter {
		t.Errorf("the database is %v (%v), the result says %d bytes", st, err, res.SizeAfter)
	}
	got := dumpDB(t, path)
	if len(got) != len(want) {
		t.Fatalf("%d buckets after compaction, want %d", len(got), len(want))
	}
	for name, kv := range want {
		if len(got[name]) != len(kv) {
			t.Errorf("bucket %q holds %d keys after compaction, want %d", name, len(got[name]), len(kv))
		}
		for k, v := range kv {
			if got[name][k] != v {
				t.Errorf("bucket %q key %x changed in compaction", name, k)
				break
			}
		}
	}
	if len(want[string(schema.Key.Name())]) != 4000 {
		t.Errorf("the key bucket held %d keys before compaction, want 4000", len(want[string(schema.Key.Name())]))
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the copy is still beside the database: %v", err)
	}
	if _, err := CheckData(context.Background(), dir); err != nil {
		t.Errorf("the compacted database fails the start-up check: %v", err)
	}
	if rev, err := ReadRevision(dir); err != nil || rev != 20000 {
		t.Errorf("revision %d (%v) after compaction, want 20000", rev, err)
	}
}

// TestCompactDBLeavesTheDatabaseOnFailure: a damaged database, or a
// caller that gave up, leaves the file byte for byte as it was and no
// copy beside it.
func TestCompactDBLeavesTheDatabaseOnFailure(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		damage  bool
		wantErr error
	}{
		{name: "damaged page headers", ctx: context.Background(), damage: true, wantErr: ErrDamagedData},
		{name: "cancelled", ctx: cancelled, wantErr: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := writeDB(t, dir, 2000, 0)
			if tc.damage {
				damagePageHeaders(t, path)
			}
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = CompactDB(tc.ctx, dir, 4<<10)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("CompactDB: %v, want %v", err, tc.wantErr)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Error("the database changed")
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(path), compactTempName)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a copy is left beside the database: %v", err)
			}
		})
	}
}
