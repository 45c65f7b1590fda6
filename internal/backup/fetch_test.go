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
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"

	"github.com/etcd-manager/etcd-manager/internal/store"
)

func TestFetch(t *testing.T) {
	ctx := t.Context()
	s, err := store.Open(ctx, "file://"+filepath.Join(t.TempDir(), "s"), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db := make([]byte, 256<<10)
	if _, err := rand.Read(db); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(db)
	zw.Close()
	good := gz.Bytes()
	sum := sha256.Sum256(good)
	meta, _ := json.Marshal(Meta{EtcdVersion: "3.6.16", Timestamp: 1, SHA256: hex.EncodeToString(sum[:]), CompressedSize: int64(len(good))})
	kopsMeta := []byte(`{"etcdVersion":"3.6.16","timestamp":"1"}`)
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x01

	tests := []struct {
		name      string
		objects   map[string][]byte // under the backup's folder
		fetch     string            // name to fetch; the backup's own when empty
		wantErr   error
		errSubstr string
	}{
		{name: "ours", objects: map[string][]byte{DataObject: good, MetaObject: meta}},
		{name: "kops meta without a sha256", objects: map[string][]byte{DataObject: good, MetaObject: kopsMeta}},
		{name: "not found", fetch: "2026-01-01T00:00:00Z-000009", wantErr: ErrNotFound, errSubstr: "2026-01-01T00:00:00Z-000009"},
		{name: "not a name", fetch: "../etc", wantErr: ErrNotFound, errSubstr: "not a backup name"},
		{name: "meta without data", objects: map[string][]byte{MetaObject: meta}, wantErr: ErrCorrupt, errSubstr: "has a meta but no"},
		{name: "junk meta", objects: map[string][]byte{DataObject: good, MetaObject: []byte("{junk")}, wantErr: ErrCorrupt, errSubstr: MetaObject},
		{name: "truncated", objects: map[string][]byte{DataObject: good[:len(good)/2], MetaObject: kopsMeta}, wantErr: ErrCorrupt, errSubstr: "truncated or damaged"},
		{name: "flipped byte", objects: map[string][]byte{DataObject: flipped, MetaObject: meta}, wantErr: ErrCorrupt, errSubstr: DataObject},
		{name: "flipped byte, kops meta", objects: map[string][]byte{DataObject: flipped, MetaObject: kopsMeta}, wantErr: ErrCorrupt, errSubstr: DataObject},
		{name: "not gzip", objects: map[string][]byte{DataObject: db, MetaObject: kopsMeta}, wantErr: ErrCorrupt, errSubstr: DataObject},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "2026-01-01T00:00:00Z-" + strings.Repeat("0", 5) + string(rune('0'+i))
			for obj, data := range tt.objects {
				if err := s.Write(ctx, name+"/"+obj, data); err != nil {
					t.Fatal(err)
				}
			}
			if tt.fetch != "" {
				name = tt.fetch
			}
			verified := ""
			verify := func(_ context.Context, p string) (snapshot.Status, error) {
				verified = p
				return snapshot.Status{Revision: 7}, nil
			}
			dir := t.TempDir()
			path, _, err := Fetch(ctx, s, name, dir, verify)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.errSubstr) {
					t.Fatalf("err %v, want %v containing %q", err, tt.wantErr, tt.errSubstr)
				}
				if entries, _ := os.ReadDir(dir); len(entries) != 0 {
					t.Errorf("a failed fetch left %d files behind", len(entries))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path)
			if !bytes.Equal(got, db) || verified != path {
				t.Fatalf("fetched %d bytes, verified %q", len(got), verified)
			}
		})
	}
}
