package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestCommandQueue(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := Open(t.Context(), "file://"+dir, Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	now := time.Date(2026, 11, 22, 5, 0, 0, 0, time.UTC)

	if _, err := s.AddCommand(ctx, spec.Command{}, now); err == nil {
		t.Fatal("a command of no kind was queued")
	}

	// Concurrent adds in the same second get distinct, ordered IDs.
	const n = 5
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := s.AddCommand(ctx, spec.Command{BackupNow: &spec.BackupNowCommand{}}, now)
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, id := range ids {
		if !strings.HasPrefix(id, "2026-11-22T05:00:00Z-00000") || seen[id] {
			t.Fatalf("ids %q: want distinct <RFC3339>-<seq>", ids)
		}
		seen[id] = true
	}

	// Junk in the queue is listed with its error, never dropped; a leader
	// lock term is not a command.
	junk := filepath.Join(dir, "control", "2026-11-22T04:00:00Z-000001")
	if err := os.MkdirAll(junk, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(junk, CommandObject), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, "control/leader/00000000000000000001", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	cmds, err := s.ListCommands(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != n+1 || cmds[0].Err == nil || !strings.Contains(cmds[0].Err.Error(), "2026-11-22T04:00:00Z-000001/_command.json") {
		t.Fatalf("list: %+v", cmds)
	}
	for _, q := range cmds[1:] {
		if q.Err != nil || q.Command.Kind() != "backup-now" || q.Status.State != spec.CommandPending || q.Command.Timestamp != spec.Int64(now.UnixNano()) {
			t.Fatalf("command %+v", q)
		}
	}

	if err := s.SetCommandStatus(ctx, ids[0], spec.CommandStatus{State: spec.CommandDone, Backup: "b1"}, now); err != nil {
		t.Fatal(err)
	}
	q, err := s.ReadCommand(ctx, ids[0])
	if err != nil || q.Status.State != spec.CommandDone || q.Status.Backup != "b1" || q.Status.Updated == 0 {
		t.Fatalf("status: %+v, %v", q, err)
	}

	if err := s.DeleteCommand(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteCommand(ctx, ids[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	for _, bad := range []string{"", "leader", "../x"} {
		if err := s.DeleteCommand(ctx, bad); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete %q: %v", bad, err)
		}
	}
	if _, err := s.Read(ctx, "control/leader/00000000000000000001"); err != nil {
		t.Fatalf("the lock term was touched: %v", err)
	}
}

func TestDecodeCommandFormats(t *testing.T) {
	tests := []struct {
		name, in, kind, err string
	}{
		{"kops restore, string timestamp", `{"timestamp":"1700000000000000000","restoreBackup":{"clusterSpec":{"memberCount":3,"etcdVersion":"3.5.9"},"backup":"2023-11-14T22:13:20Z-000001"}}`, "restore-backup", ""},
		{"numeric timestamp", `{"timestamp":1700000000000000000,"backupNow":{}}`, "backup-now", ""},
		{"restore without backup", `{"restoreBackup":{}}`, "", "names no backup"},
		{"no kind", `{"timestamp":"1"}`, "", "no known kind"},
		{"two kinds", `{"backupNow":{},"restoreBackup":{"backup":"x"}}`, "", "more than one"},
		{"junk", `garbage`, "", "not valid JSON"},
		{"empty", ``, "", "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := spec.DecodeCommand([]byte(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || c.Kind() != tt.kind {
				t.Fatalf("kind %q, err %v; want %q", c.Kind(), err, tt.kind)
			}
		})
	}
}

// A command or status of a newer format is kept apart from junk: it is
// marked Newer, never failed.
func TestReadCommandNewerFormat(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, "file://"+filepath.Join(t.TempDir(), "store"), Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id, err := s.AddCommand(ctx, spec.Command{BackupNow: &spec.BackupNowCommand{}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	q, err := s.ReadCommand(ctx, id)
	if err != nil || q.Newer != nil || q.Err != nil || q.Command.Format != spec.FormatVersion {
		t.Fatalf("own command: %+v, %v", q, err)
	}
	if err := s.Write(ctx, "control/"+id+"/_status.json", []byte(`{"format":2,"state":"running"}`)); err != nil {
		t.Fatal(err)
	}
	q, err = s.ReadCommand(ctx, id)
	if err != nil || !errors.Is(q.Newer, spec.ErrNewerFormat) || q.Err != nil {
		t.Fatalf("newer status: Newer %v, Err %v, %v", q.Newer, q.Err, err)
	}
	if err := s.Write(ctx, "control/"+id+"/_command.json", []byte(`{"format":2,"rollCA":{}}`)); err != nil {
		t.Fatal(err)
	}
	q, err = s.ReadCommand(ctx, id)
	if err != nil || !errors.Is(q.Newer, spec.ErrNewerFormat) || q.Err != nil {
		t.Fatalf("newer command: Newer %v, Err %v, %v", q.Newer, q.Err, err)
	}
}
