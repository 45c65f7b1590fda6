package controller

import (
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/backup"
)

// The status page shows a backup this agent took as soon as it is
// recorded, and the store's newer one when the figures read it.
func TestNewestBackup(t *testing.T) {
	older := &backup.Info{Name: "2026-12-04T01:00:00Z-000001"}
	newer := &backup.Info{Name: "2026-12-04T02:00:00Z-000001"}
	tests := []struct {
		name          string
		stored, taken *backup.Info
		want          *backup.Info
	}{
		{"nothing yet", nil, nil, nil},
		{"read from the store", older, nil, older},
		{"taken here since", older, newer, newer},
		{"taken here, none read", nil, newer, newer},
		{"the store has a newer one", newer, older, newer},
	}
	for _, tt := range tests {
		lp := &loop{newestStored: tt.stored}
		if tt.taken != nil {
			lp.lastTaken.Store(tt.taken)
		}
		if got := lp.newestBackup(); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
