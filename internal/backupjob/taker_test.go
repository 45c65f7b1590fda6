package backupjob

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
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
