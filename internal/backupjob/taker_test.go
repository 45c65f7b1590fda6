package backupjob

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Prune spares the newest backup and any a pending restore names.
func TestPruneSparesQueuedRestore(t *testing.T) {
	ctx := t.Context()
	dir := filepath.Join(t.TempDir(), "store")
	s, err := store.Open(ctx, "file://"+dir, store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	names := []string{"2026-11-20T12:00:00Z-000001", "2026-11-21T12:00:00Z-000001", "2026-11-22T11:00:00Z-000001"}
	for i, n := range names {
		ts := now.Add(-time.Duration(len(names)-i) * 24 * time.Hour).Unix()
		for key, data := range map[string]string{
			n + "/" + backup.DataObject: "data",
			n + "/" + backup.MetaObject: fmt.Sprintf(`{"etcdVersion":"3.6.16","timestamp":"%d"}`, ts),
		} {
			if err := s.Write(ctx, key, []byte(data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := s.AddCommand(ctx, spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: names[0]}}, now); err != nil {
		t.Fatal(err)
	}
	b := &Taker{Node: "n1", Log: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }, Retention: "count:1", RetryDelay: time.Second, MaxRetry: time.Minute}

	b.Prune(ctx, s)
	got := listNames(t, s)
	if want := []string{names[0], names[2]}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("after prune: %v, want %v (the restore's backup and the newest)", got, want)
	}
}

func listNames(t *testing.T, s *store.Store) []string {
	t.Helper()
	infos, err := backup.List(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, i := range infos {
		out = append(out, i.Name)
	}
	return out
}

func TestBackupBackoff(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		failures int
		want     time.Duration // after the last failure
	}{
		{1, 30 * time.Second},
		{2, time.Minute},
		{3, 2 * time.Minute},
		{5, 8 * time.Minute},
		{6, 15 * time.Minute}, // capped at the interval
		{40, 15 * time.Minute},
	}
	s, err := store.Open(t.Context(), "file://"+t.TempDir(), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tt := range tests {
		b := Default().NewTaker("n1", slog.New(slog.DiscardHandler), func() time.Time { return t0 }, Readers{})
		for range tt.failures {
			b.Failed(t.Context(), s, spec.BackupPeriodic, errors.New("the store is away"))
		}
		if got := b.RetryAt().Sub(t0); got != tt.want {
			t.Errorf("%d failures: retry after %s, want %s", tt.failures, got, tt.want)
		}
		if !b.FailedRecently() || b.Due(time.Minute, false) {
			t.Errorf("%d failures: a backup is allowed during the backoff", tt.failures)
		}
	}
	b := Default().NewTaker("n1", nil, func() time.Time { return t0 }, Readers{})
	if b.FailedRecently() || !b.Due(time.Minute, false) {
		t.Error("a fresh taker is not due")
	}
}

// reportProgress reports what changed every ProgressEvery, and nothing
// once stopped: a late report must not overwrite the outcome.
func TestReportProgress(t *testing.T) {
	defer func(d time.Duration) { ProgressEvery = d }(ProgressEvery)
	ProgressEvery = 10 * time.Millisecond
	var done atomic.Int64
	var mu sync.Mutex
	var reports []int64
	stop := reportProgress(func(n int64) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, n)
	}, &done)
	for i := range 5 {
		done.Store(int64(i+1) << 20)
		time.Sleep(30 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // no change: no report
	stop()
	mu.Lock()
	got := slices.Clone(reports)
	mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != len(got) {
		t.Errorf("%d reports after stop", len(reports)-len(got))
	}
	if len(got) < 3 || len(got) > 5 || got[len(got)-1] != 5<<20 {
		t.Errorf("reports %v: want one per change, the last at 5 MiB", got)
	}
	for i := 1; i < len(got); i++ {
		if got[i] == got[i-1] {
			t.Errorf("reports %v repeat a figure", got)
		}
	}
}
