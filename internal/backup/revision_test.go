package backup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/proto"
)

// revKey is a key revision as etcd's mvcc writes it: main, '_', sub,
// and 't' for a tombstone.
func revKey(main, sub int64, tombstone bool) []byte {
	k := mvcc.RevToBytes(mvcc.Revision{Main: main, Sub: sub}, make([]byte, 17))
	if tombstone {
		k = append(k, 't')
	}
	return k
}

// boltFile writes a bbolt file at p with a meta bucket and, unless keys
// is nil, a key bucket holding keys, each with a KeyValue.
func boltFile(t *testing.T, p string, keys [][]byte) {
	t.Helper()
	db, err := bolt.Open(p, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucket(schema.Meta.Name()); err != nil {
			return err
		}
		if keys == nil {
			return nil
		}
		b, err := tx.CreateBucket(schema.Key.Name())
		if err != nil {
			return err
		}
		for i, k := range keys {
			kv, err := proto.Marshal(&mvccpb.KeyValue{Key: []byte{'k', byte(i)}, Value: []byte("v"), CreateRevision: 2, ModRevision: 2, Version: 1})
			if err != nil {
				return err
			}
			if err := b.Put(k, kv); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReadRevision: the quick read gives the revision etcdutl's status
// gives, through a child as the agent reads it, and refuses what is no
// etcd database.
func TestReadRevision(t *testing.T) {
	tests := []struct {
		name string
		keys [][]byte // nil: no key bucket
		raw  []byte   // instead of a bbolt file
		want int64
		err  string
	}{
		{name: "one key", keys: [][]byte{revKey(2, 0, false)}, want: 2},
		{name: "newest last", keys: [][]byte{revKey(2, 0, false), revKey(7, 3, false), revKey(5, 0, false)}, want: 7},
		{name: "a tombstone newest", keys: [][]byte{revKey(2, 0, false), revKey(9, 0, true)}, want: 9},
		{name: "large", keys: [][]byte{revKey(1<<40+5, 0, false)}, want: 1<<40 + 5},
		{name: "no key yet", keys: [][]byte{}, want: 0},
		{name: "no key bucket", err: "no key bucket"},
		{name: "short key", keys: [][]byte{[]byte("short")}, err: "a key revision of 5 bytes"},
		{name: "not a database", raw: []byte(strings.Repeat("x", 8192)), err: "invalid database"},
		{name: "a key with a bad suffix", keys: [][]byte{append(revKey(3, 0, false), 'x')}, err: "a key revision of 18 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "snapshot.db")
			if tt.raw != nil {
				if err := os.WriteFile(p, tt.raw, 0o600); err != nil {
					t.Fatal(err)
				}
			} else {
				boltFile(t, p, tt.keys)
			}
			got, err := ReadRevision(p)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ReadRevision = %d, %v; want an error with %q", got, err, tt.err)
				}
			} else {
				if err != nil || got != tt.want {
					t.Fatalf("ReadRevision = %d, %v; want %d", got, err, tt.want)
				}
				if len(tt.keys) > 0 {
					st, err := status(p)
					if err != nil {
						t.Fatal(err)
					}
					if st.Revision != got {
						t.Errorf("etcdutl's status says revision %d, the quick read %d", st.Revision, got)
					}
				}
			}
			// The same through a child process, as the agent reads it.
			t.Setenv(verifyChildEnv, "1")
			got, err = RevisionCommand(os.Args[0], "--revision-only")(t.Context(), p)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), p) {
					t.Fatalf("RevisionCommand = %d, %v; want an error naming %s with %q", got, err, p, tt.err)
				}
			} else if err != nil || got != tt.want {
				t.Fatalf("RevisionCommand = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}
