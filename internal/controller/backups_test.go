package controller

import (
	"testing"
	"time"
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
	for _, tt := range tests {
		b := DefaultBackupConfig().newBackups(nil, nil, func() time.Time { return t0 })
		b.failures, b.lastFailure = tt.failures, t0
		if got := b.retryAt().Sub(t0); got != tt.want {
			t.Errorf("%d failures: retry after %s, want %s", tt.failures, got, tt.want)
		}
		if !b.failedRecently() || b.due(time.Minute) {
			t.Errorf("%d failures: a backup is allowed during the backoff", tt.failures)
		}
	}
	b := DefaultBackupConfig().newBackups(nil, nil, func() time.Time { return t0 })
	if b.failedRecently() || !b.due(time.Minute) {
		t.Error("a fresh taker is not due")
	}
}
