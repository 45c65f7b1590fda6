package controller

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

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
		b := newBackups(backupjob.Default(), "n1", slog.New(slog.DiscardHandler), nil, func() time.Time { return t0 }, Readers{})
		for range tt.failures {
			b.Failed(t.Context(), s, spec.BackupPeriodic, errors.New("the store is away"))
		}
		if got := b.RetryAt().Sub(t0); got != tt.want {
			t.Errorf("%d failures: retry after %s, want %s", tt.failures, got, tt.want)
		}
		if !b.FailedRecently() || backupDue(b, time.Minute, false) {
			t.Errorf("%d failures: a backup is allowed during the backoff", tt.failures)
		}
	}
	b := newBackups(backupjob.Default(), "n1", nil, nil, func() time.Time { return t0 }, Readers{})
	if b.FailedRecently() || !backupDue(b, time.Minute, false) {
		t.Error("a fresh taker is not due")
	}
}
