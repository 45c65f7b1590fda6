package drill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
)

// fakeScratch records a drill's calls on the scratch etcd: a HashKV that
// reports the compact revision it was last compacted to.
type fakeScratch struct {
	compacted int64
	hashes    map[int64]uint32 // by compact revision
	calls     []string
}

func (f *fakeScratch) HashKV(_ context.Context, _ string, rev int64) (*clientv3.HashKVResponse, error) {
	f.calls = append(f.calls, "hashkv")
	resp := &clientv3.HashKVResponse{}
	resp.Hash, resp.CompactRevision = f.hashes[f.compacted], f.compacted
	return resp, nil
}

func (f *fakeScratch) Compact(_ context.Context, rev int64, _ ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	f.calls = append(f.calls, "compact")
	f.compacted = rev
	return &clientv3.CompactResponse{}, nil
}

func TestCheck(t *testing.T) {
	meta := func(hash uint32, compact int64) backup.Meta {
		return backup.Meta{Revision: 100, HashKV: &backup.HashKV{Hash: hash, CompactRevision: compact}}
	}
	for _, c := range []struct {
		name      string
		meta      backup.Meta
		revision  int64
		compacted int64
		calls     string
		err       string
	}{
		{"the hash agrees", meta(7, 10), 100, 10, "hashkv", ""},
		{"a lease revoked since adds a revision", meta(7, 10), 101, 10, "hashkv", ""},
		{"behind the meta", meta(7, 10), 99, 10, "", "behind the meta's 100"},
		{"the hash differs", meta(8, 10), 100, 10, "hashkv", "HashKV at revision 100 is 7; the member's was 8"},
		{"a compaction after the snapshot is replayed first", meta(9, 50), 100, 10, "hashkv compact hashkv", ""},
		{"compacted further than the member", meta(7, 5), 100, 10, "hashkv", "compacted to revision 10, the member was at 5"},
		{"no HashKV recorded: the revision alone", backup.Meta{Revision: 100}, 100, 10, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeScratch{compacted: c.compacted, hashes: map[int64]uint32{10: 7, 50: 9}}
			got, err := check(t.Context(), f, "https://127.0.0.1:1", c.meta, c.revision)
			if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Fatalf("check: %v, want %q", err, c.err)
			}
			if err != nil && !Failed(err) {
				t.Errorf("a mismatch (%v) does not count as a failed drill", err)
			}
			if calls := strings.Join(f.calls, " "); calls != c.calls {
				t.Errorf("calls %q, want %q", calls, c.calls)
			}
			if got.Revision != c.revision {
				t.Errorf("revision %d, want %d", got.Revision, c.revision)
			}
			if c.err == "" && c.meta.HashKV != nil && (got.HashKV == nil || *got.HashKV != c.meta.HashKV.Hash) {
				t.Errorf("hash %v, want %d", got.HashKV, c.meta.HashKV.Hash)
			}
		})
	}
}

// A drill needs room for the snapshot and its restored copy beside the
// reserve, whatever the maximum snapshot size.
func TestFits(t *testing.T) {
	const gib = int64(1 << 30)
	for _, c := range []struct {
		name        string
		free, total int64
		size        int64
		ok          bool
	}{
		{"room for both", 10 * gib, 100 * gib, 4 * gib, true},
		{"room for the snapshot only", 6 * gib, 100 * gib, 4 * gib, false},
		{"both fit but eat into the reserve", 8*gib + gib/2, 100 * gib, 4 * gib, false},
		{"both fit with the reserve left exactly", 9 * gib, 100 * gib, 4 * gib, true},
		{"a small disk keeps a tenth", 900 << 20, 1 * gib, 300 << 20, true},
		{"a meta that records no size cannot be bounded", 100 * gib, 100 * gib, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := backup.FetchOptions{Reserve: gib, MaxBytes: 5 * gib,
				DiskSpace: func(string) (int64, int64, error) { return c.free, c.total, nil }}
			_, err := Fits(opts, t.TempDir(), "b", backup.Meta{Size: c.size})
			if c.ok != (err == nil) {
				t.Fatalf("Fits = %v, want ok=%v", err, c.ok)
			}
			if err != nil && c.size > 0 && !errors.Is(err, backup.ErrTempFull) {
				t.Errorf("%v does not wrap ErrTempFull", err)
			}
			if err != nil && Failed(err) {
				t.Errorf("no room (%v) counts as a failed drill, not one that could not run", err)
			}
		})
	}
}

func TestFailed(t *testing.T) {
	for _, c := range []struct {
		err    error
		failed bool
	}{
		{fmt.Errorf("x: %w", backup.ErrCorrupt), true},
		{fmt.Errorf("x: %w", backup.ErrNoKey), true},
		{fmt.Errorf("%w: x", ErrRestore), true},
		{fmt.Errorf("x: %w", backup.ErrTempFull), false},
		{fmt.Errorf("x: %w", backup.ErrNotFound), false},
		{errors.New("store: connection refused"), false},
	} {
		if got := Failed(c.err); got != c.failed {
			t.Errorf("Failed(%v) = %v, want %v", c.err, got, c.failed)
		}
	}
}
