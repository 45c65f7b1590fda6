package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// The completion scripts call the hidden __complete command: it offers the
// commands, and the backups and queued commands of the store named.
func TestCompletion(t *testing.T) {
	e := newCtlEnv(t)
	ctx := t.Context()
	s, err := store.Open(ctx, e.store, store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	names := []string{"2026-12-04T01:00:00Z-000001", "2026-12-04T02:00:00Z-000001"}
	for _, n := range names {
		if err := s.Write(ctx, n+"/"+backup.MetaObject, []byte(`{"etcdVersion":"3.6.16","timestamp":"1"}`)); err != nil {
			t.Fatal(err)
		}
	}
	id, err := s.AddCommand(ctx, spec.Command{BackupNow: &spec.BackupNowCommand{}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	complete := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run(ctx, append([]string{"__complete"}, args...), &out, &errOut); err != nil {
			t.Fatalf("__complete %v: %v: %s", args, err, errOut.String())
		}
		return out.String()
	}
	if got := complete(""); !strings.Contains(got, "restore-backup\t") || !strings.Contains(got, "list-backups\t") {
		t.Errorf("__complete \"\" offers %q, want the commands", got)
	}
	got := complete("--backup-store="+e.store, "restore-backup", "")
	if i, j := strings.Index(got, names[1]), strings.Index(got, names[0]); i < 0 || j < i {
		t.Errorf("restore-backup completes %q, want the backups newest first", got)
	}
	if got := complete("--backup-store="+e.store, "restore-backup", "2026-12-04T02"); strings.Contains(got, names[0]) || !strings.Contains(got, names[1]) {
		t.Errorf("restore-backup 2026-12-04T02 completes %q", got)
	}
	if got := complete("--backup-store="+e.store, "delete-command", ""); !strings.Contains(got, id) {
		t.Errorf("delete-command completes %q, want %s", got, id)
	}
	if err := s.Write(ctx, "discovery/kYdQ3R5u0x4mVb1p", []byte(`{"nodeId":"kYdQ3R5u0x4mVb1p","address":"127.0.0.1:1","updated":"`+time.Now().UTC().Format(time.RFC3339)+`"}`)); err != nil {
		t.Fatal(err)
	}
	if got := complete("--backup-store="+e.store, "revoke-node", "kY"); !strings.Contains(got, "kYdQ3R5u0x4mVb1p") {
		t.Errorf("revoke-node kY completes %q, want the node ID", got)
	}
}
