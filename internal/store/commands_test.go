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
	if err != nil || q.Newer != nil || q.Err != nil || q.Command.Format != spec.FormatBase {
		t.Fatalf("own command: %+v, %v", q, err)
	}
	if err := s.Write(ctx, "control/"+id+"/_status.json", []byte(`{"format":9,"state":"running"}`)); err != nil {
		t.Fatal(err)
	}
	q, err = s.ReadCommand(ctx, id)
	if err != nil || !errors.Is(q.Newer, spec.ErrNewerFormat) || q.Err != nil {
		t.Fatalf("newer status: Newer %v, Err %v, %v", q.Newer, q.Err, err)
	}
	if err := s.Write(ctx, "control/"+id+"/_command.json", []byte(`{"format":9,"rollCA":{}}`)); err != nil {
		t.Fatal(err)
	}
	q, err = s.ReadCommand(ctx, id)
	if err != nil || !errors.Is(q.Newer, spec.ErrNewerFormat) || q.Err != nil {
		t.Fatalf("newer command: Newer %v, Err %v, %v", q.Newer, q.Err, err)
	}
}

// One object under control/ that cannot be used makes its command fail;
// the queue stays readable.
func TestListCommandsUnreadableObject(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, "file://"+filepath.Join(t.TempDir(), "store"), Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	var ids []string
	for range 3 {
		id, err := s.AddCommand(ctx, spec.Command{BackupNow: &spec.BackupNowCommand{}}, now)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	huge := make([]byte, MaxCommandSize+1)
	if err := s.Write(ctx, "control/"+ids[0]+"/_command.json", huge); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, "control/"+ids[1]+"/_status.json", []byte(`{"state":"runn`)); err != nil {
		t.Fatal(err)
	}
	cmds, err := s.ListCommands(ctx)
	if err != nil {
		t.Fatalf("one bad object made the whole queue unreadable: %v", err)
	}
	if len(cmds) != 3 {
		t.Fatalf("%d commands listed, want 3", len(cmds))
	}
	if !errors.Is(cmds[0].Err, ErrTooLarge) || !strings.Contains(cmds[0].Err.Error(), ids[0]+"/_command.json") {
		t.Errorf("oversized command: Err %v, want ErrTooLarge naming the object", cmds[0].Err)
	}
	if cmds[1].Err == nil || !strings.Contains(cmds[1].Err.Error(), ids[1]+"/_status.json") {
		t.Errorf("truncated status: Err %v, want an error naming the object", cmds[1].Err)
	}
	if cmds[2].Err != nil {
		t.Errorf("a good command has Err %v", cmds[2].Err)
	}
	if err := s.Write(ctx, KeySpec, make([]byte, MaxSpecSize+1)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadSpec(ctx); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized spec: %v, want ErrTooLarge", err)
	}
}

// A status of an older term, written late by a stale driver, changes
// nothing; the choice is made once; deleting a command removes it all.
func TestCommandStatusTermsAndChoice(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, "file://"+filepath.Join(t.TempDir(), "store"), Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	id, err := s.AddCommand(ctx, spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b1"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	status := func(phase, token string) spec.CommandStatus {
		return spec.CommandStatus{State: spec.CommandRunning, Restore: &spec.RestoreProgress{Phase: phase, Token: token, Members: []string{"a"}}}
	}
	if err := s.SetCommandStatusAt(ctx, id, 7, status("restoring", "t7"), now); err != nil {
		t.Fatal(err)
	}
	// Late writes of older terms, and of no term.
	if err := s.SetCommandStatusAt(ctx, id, 6, status("stopping", "t6"), now); err != nil {
		t.Fatal(err)
	}
	if err := s.SetCommandStatus(ctx, id, status("stopping", "t0"), now); err != nil {
		t.Fatal(err)
	}
	q, err := s.ReadCommand(ctx, id)
	if err != nil || q.Err != nil {
		t.Fatalf("ReadCommand: %v, %v", err, q.Err)
	}
	if q.Status.Term != 7 || q.Status.Restore.Phase != "restoring" || q.Status.Restore.Token != "t7" {
		t.Fatalf("status %+v (%+v), want term 7's", q.Status, q.Status.Restore)
	}

	first := spec.Choice{Term: 7, Restore: &spec.RestoreProgress{Token: "chosen", Members: []string{"a", "b"}, EtcdVersion: "3.6.16"}}
	got, err := s.CreateChoice(ctx, id, first)
	if err != nil || got.Restore.Token != "chosen" {
		t.Fatalf("first choice: %+v, %v", got, err)
	}
	second := spec.Choice{Term: 8, Restore: &spec.RestoreProgress{Token: "other", Members: []string{"c"}}}
	got, err = s.CreateChoice(ctx, id, second)
	if err != nil || got.Restore.Token != "chosen" || got.Term != 7 {
		t.Fatalf("second choice: %+v, %v; want the first one back", got, err)
	}
	q, err = s.ReadCommand(ctx, id)
	if err != nil || q.Choice == nil {
		t.Fatalf("ReadCommand with a choice: %+v, %v", q, err)
	}
	if p := q.Status.Restore; p.Token != "chosen" || strings.Join(p.Members, ",") != "a,b" || p.Phase != "restoring" {
		t.Errorf("status with the choice applied: %+v, want token chosen, members a,b, phase restoring", p)
	}

	// A status that claims another term than its name is damaged.
	if err := s.Write(ctx, "control/"+id+"/_status-00000000000000000009.json", []byte(`{"format":1,"term":3,"state":"running"}`)); err != nil {
		t.Fatal(err)
	}
	if q, err := s.ReadCommand(ctx, id); err != nil || q.Err == nil {
		t.Errorf("a status whose term does not match its name: Err %v, %v", q.Err, err)
	}

	// A status named for a term beyond any agent's is not a status: it
	// cannot raise the term floor to where the lock would overflow.
	if err := s.Write(ctx, "control/"+id+"/_status-9223372036854775806.json", []byte(`{"format":1,"term":9223372036854775806,"state":"running"}`)); err != nil {
		t.Fatal(err)
	}
	if q, err := s.ReadCommand(ctx, id); err != nil || q.StatusTerm != 9 {
		t.Errorf("with a status of a huge term: the status term read is %d, %v; want 9", q.StatusTerm, err)
	}

	if err := s.DeleteCommand(ctx, id); err != nil {
		t.Fatal(err)
	}
	left, err := s.List(ctx, "control/"+id+"/", "")
	if err != nil || len(left) != 0 {
		t.Errorf("left after delete-command: %v, %v", left, err)
	}
}
