package history

import (
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Without captured changes, the newest point is the newest backup's;
// with capture on but nothing captured yet, it is still the backup's.
func TestNewestPointOfBackups(t *testing.T) {
	s, err := store.Open(t.Context(), "file://"+t.TempDir(), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	newest := &backup.Info{Name: "2026-12-03T12:00:00Z-000001", Meta: backup.Meta{Timestamp: spec.Int64(at.Unix()), ClusterToken: "tok"}}
	tests := []struct {
		name     string
		newest   *backup.Info
		timeline string
		captured bool
		want     time.Time
	}{
		{name: "nothing", want: time.Time{}},
		{name: "a backup", newest: newest, timeline: "tok", want: at},
		{name: "capture on, nothing captured", newest: newest, timeline: "tok", captured: true, want: at},
		{name: "capture on, no timeline", newest: newest, captured: true, want: at},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewestPoint(t.Context(), s, tt.timeline, tt.newest, tt.captured)
			if err != nil || !got.Equal(tt.want) {
				t.Errorf("NewestPoint = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}
