package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestDrillDue(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	rec := func(at time.Time) *spec.DrillRecord {
		return &spec.DrillRecord{Last: spec.DrillResult{Time: at, Node: "a", Outcome: spec.EventOK}}
	}
	notRun := func(at time.Time) *spec.DrillRecord {
		return &spec.DrillRecord{Last: spec.DrillResult{Time: at, Node: "a", Outcome: spec.DrillNotRun}}
	}
	for _, c := range []struct {
		name                   string
		now                    time.Time
		interval               time.Duration
		rec                    *spec.DrillRecord
		leadSince, lastStarted time.Time
		want                   bool
	}{
		{"off", t0.Add(10 * day), 0, nil, t0, time.Time{}, false},
		{"not leading", t0.Add(10 * day), day, nil, time.Time{}, time.Time{}, false},
		{"no record: an interval after the lead began", t0.Add(day), day, nil, t0, time.Time{}, true},
		{"no record: too soon after the lead began", t0.Add(day - time.Second), day, nil, t0, time.Time{}, false},
		{"the record is older than the interval", t0.Add(time.Hour), day, rec(t0.Add(time.Hour - day)), t0, time.Time{}, true},
		{"the record is recent, though the lead is old", t0.Add(10 * day), day, rec(t0.Add(10*day - time.Hour)), t0, time.Time{}, false},
		{"a stale record read while this agent's drill ran", t0.Add(2 * day), day, rec(t0), t0, t0.Add(2*day - time.Minute), false},
		{"a record from the future counts from the lead", t0.Add(day), day, rec(t0.Add(100 * day)), t0, time.Time{}, true},
		{"a drill that could not run is tried again sooner", t0.Add(time.Hour), day, notRun(t0), t0, t0, true},
		{"but not at once", t0.Add(time.Minute), day, notRun(t0), t0, t0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := drillDue(c.now, c.interval, c.rec, c.leadSince, c.lastStarted); got != c.want {
				t.Errorf("drillDue = %v, want %v", got, c.want)
			}
		})
	}
}

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

func TestCheckDrill(t *testing.T) {
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
			got, err := checkDrill(t.Context(), f, "https://127.0.0.1:1", c.meta, c.revision)
			if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Fatalf("checkDrill: %v, want %q", err, c.err)
			}
			if err != nil && !drillFailed(err) {
				t.Errorf("a mismatch (%v) does not count as a failed drill", err)
			}
			if calls := strings.Join(f.calls, " "); calls != c.calls {
				t.Errorf("calls %q, want %q", calls, c.calls)
			}
			if got.revision != c.revision {
				t.Errorf("revision %d, want %d", got.revision, c.revision)
			}
			if c.err == "" && c.meta.HashKV != nil && (got.hashKV == nil || *got.hashKV != c.meta.HashKV.Hash) {
				t.Errorf("hash %v, want %d", got.hashKV, c.meta.HashKV.Hash)
			}
		})
	}
}

// A drill needs room for the snapshot and its restored copy beside the
// reserve, whatever the maximum snapshot size.
func TestDrillFits(t *testing.T) {
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
			_, err := drillFits(opts, t.TempDir(), "b", backup.Meta{Size: c.size})
			if c.ok != (err == nil) {
				t.Fatalf("drillFits = %v, want ok=%v", err, c.ok)
			}
			if err != nil && c.size > 0 && !errors.Is(err, backup.ErrTempFull) {
				t.Errorf("%v does not wrap ErrTempFull", err)
			}
			if err != nil && drillFailed(err) {
				t.Errorf("no room (%v) counts as a failed drill, not one that could not run", err)
			}
		})
	}
}

// A drill steps aside for whatever needs the leader's disk.
func TestDrillBusy(t *testing.T) {
	restore := plan.Command{ID: "c", Command: spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b"}}}
	for _, c := range []struct {
		name     string
		obs      plan.Observed
		actions  []plan.Action
		activity bool
		busy     bool
	}{
		{"idle", plan.Observed{}, []plan.Action{plan.Report{Msg: "x"}}, false, false},
		{"a restore queued", plan.Observed{Commands: []plan.Command{restore}}, nil, false, true},
		{"a backup due", plan.Observed{}, []plan.Action{plan.TakeBackup{Kind: spec.BackupPeriodic}}, false, true},
		{"a defragmentation", plan.Observed{}, []plan.Action{plan.DefragMember{NodeID: "a"}}, false, true},
		{"a roll between its steps", plan.Observed{}, nil, true, true},
	} {
		if got := drillBusy(c.obs, c.actions, c.activity) != ""; got != c.busy {
			t.Errorf("%s: busy = %v, want %v", c.name, got, c.busy)
		}
	}
}

func TestDrillFailed(t *testing.T) {
	for _, c := range []struct {
		err    error
		failed bool
	}{
		{fmt.Errorf("x: %w", backup.ErrCorrupt), true},
		{fmt.Errorf("x: %w", backup.ErrNoKey), true},
		{fmt.Errorf("%w: x", errDrillRestore), true},
		{fmt.Errorf("x: %w", backup.ErrTempFull), false},
		{fmt.Errorf("x: %w", backup.ErrNotFound), false},
		{errors.New("store: connection refused"), false},
	} {
		if got := drillFailed(c.err); got != c.failed {
			t.Errorf("drillFailed(%v) = %v, want %v", c.err, got, c.failed)
		}
	}
}
