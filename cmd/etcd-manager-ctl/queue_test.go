package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/storeops"
)

// A restore or recover-quorum while another is not finished is refused,
// naming it, and queues nothing; once it is deleted, or has expired
// before it started, the next is queued.
func TestSecondRestoreIsRefused(t *testing.T) {
	e := outputEnv(t)
	const name = "2026-11-22T05:00:00Z-000001"
	first, _, err := e.run(t, "restore-backup", name, "--wait=false")
	if err != nil {
		t.Fatal(err)
	}
	first = strings.TrimSpace(first)
	for _, args := range [][]string{{"restore-backup", name, "--wait=false"}, {"restore-backup", "--latest", "--wait=false"}, {"recover-quorum", "--timeout=1s"}} {
		_, _, err := e.run(t, args...)
		if err == nil || exitCode(err) != exitFailed || !strings.Contains(err.Error(), "command "+first+", a restore-backup queued") ||
			!strings.Contains(err.Error(), "delete-command "+first) || !strings.Contains(err.Error(), "nothing was queued") {
			t.Errorf("%v with restore %s pending: %v (exit %d)", args, first, err, exitCode(err))
		}
	}
	if rows := listCommands(t, e); len(rows) != 1 {
		t.Fatalf("refused commands were queued: %+v", rows)
	}
	if _, _, err := e.run(t, "delete-command", first); err != nil {
		t.Fatal(err)
	}
	// One that expired before it started does not stand in the way.
	if _, _, err := e.run(t, "restore-backup", name, "--wait=false", "--expire-after=1ns"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond)
	if _, _, err := e.run(t, "restore-backup", name, "--wait=false"); err != nil {
		t.Errorf("a restore behind one that expired: %v", err)
	}
}

// --expire-after is recorded as the command's expiry (1h by default for
// a restore, none for a backup), shown by list-commands, and read back
// as expired once it passes.
func TestExpireAfter(t *testing.T) {
	e := outputEnv(t)
	start := time.Now()
	if _, _, err := e.run(t, "restore-backup", "2026-11-22T05:00:00Z-000001", "--wait=false"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.run(t, "backup-now", "--wait=false"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.run(t, "defrag", "--wait=false", "--expire-after=-1s"); err == nil || exitCode(err) != exitUsage {
		t.Errorf("a negative --expire-after: %v (exit %d), want a usage error", err, exitCode(err))
	}
	rows := listCommands(t, e)
	if len(rows) != 2 {
		t.Fatalf("list-commands = %+v", rows)
	}
	exp, err := time.Parse(time.RFC3339Nano, rows[0].Expires)
	if err != nil || exp.Before(start.Add(time.Hour-time.Second)) || exp.After(time.Now().Add(time.Hour)) {
		t.Errorf("restore expires %q (%v), want an hour from its queueing", rows[0].Expires, err)
	}
	if rows[1].Expires != "" {
		t.Errorf("backup-now expires %q, want never", rows[1].Expires)
	}
	text, _, _ := e.run(t, "list-commands")
	if !strings.Contains(text, "expires "+rows[0].Expires) {
		t.Errorf("list-commands shows no expiry:\n%s", text)
	}
	s := e.open(t)
	defer s.Close()
	for at, want := range map[time.Time]bool{time.Now(): false, time.Now().Add(2 * time.Hour): true} {
		cmds, err := storeops.ReadCommands(t.Context(), s, at)
		if err != nil {
			t.Fatal(err)
		}
		if cmds[0].Expired != want || cmds[1].Expired {
			t.Errorf("at %s: expired %v and %v, want %v and false", at, cmds[0].Expired, cmds[1].Expired, want)
		}
	}
}

type commandRow struct {
	ID, Kind, State, Expires string
}

func listCommands(t *testing.T, e ctlEnv) []commandRow {
	t.Helper()
	out, _, err := e.run(t, "list-commands", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []commandRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return rows
}

// The dry runs check as the real commands do, say what would happen,
// and write nothing: the spec stays, no command is queued.
func TestDryRuns(t *testing.T) {
	e := outputEnv(t)
	out, _, err := e.run(t, "configure-cluster", "--member-count=5", "--quota-backend-bytes=8589934592", "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dry run: configure-cluster would set the cluster spec", "nothing was written",
		"memberCount 1 -> 5: the leader adds 4 member(s) one at a time", "etcdSettings.quota-backend-bytes (etcd's default) -> 8589934592: each member's etcd restarts"} {
		if !strings.Contains(out, want) {
			t.Errorf("configure-cluster --dry-run printed no %q:\n%s", want, out)
		}
	}
	if got, _, _ := e.run(t, "get", "-o", "json"); !strings.Contains(got, `"memberCount": 1`) || strings.Contains(got, "quota") {
		t.Errorf("a dry run changed the spec: %s", got)
	}
	// What the agents would refuse fails the dry run, after saying so.
	out, _, err = e.run(t, "configure-cluster", "--etcd-version=3.4.23", "--dry-run")
	if err == nil || exitCode(err) != exitFailed || !strings.Contains(out, "REFUSED by the agents: going from 3.6.16 down to 3.4.23 needs dump and restore") {
		t.Errorf("a refused change's dry run: %v (exit %d):\n%s", err, exitCode(err), out)
	}
	out, _, err = e.run(t, "configure-cluster", "--etcd-version=3.4.23", "--allow-dump-restore", "--dry-run", "-o", "json")
	var sp struct {
		DryRun  bool
		Changes []struct{ Field, How string }
	}
	if err != nil || json.Unmarshal([]byte(out), &sp) != nil || !sp.DryRun || len(sp.Changes) != 1 || !strings.Contains(sp.Changes[0].How, "clients are cut off") {
		t.Errorf("dump-restore's dry run: %v\n%s", err, out)
	}

	const name = "2026-11-22T05:00:00Z-000001"
	out, _, err = e.run(t, "restore-backup", name, "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dry run: restore-backup would restore backup " + name + " (revision 5, taken 2026-11-22T05:00:00Z, etcd 3.6.16) as a new cluster of 1 member(s)",
		"every write after revision 5 would be lost; nothing was queued"} {
		if !strings.Contains(out, want) {
			t.Errorf("restore-backup --dry-run printed no %q:\n%s", want, out)
		}
	}
	if rows := listCommands(t, e); len(rows) != 0 {
		t.Errorf("a dry run queued %+v", rows)
	}
	// The refusals a restore makes, a dry run makes too.
	if _, _, err := e.run(t, "restore-backup", "2026-11-22T06:00:00Z-000001", "--dry-run"); err == nil || !strings.Contains(err.Error(), "nothing was queued") {
		t.Errorf("a dry run of a missing backup: %v", err)
	}
	if _, _, err := e.run(t, "restore-backup", name, "--wait=false"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.run(t, "restore-backup", name, "--dry-run"); err == nil || !strings.Contains(err.Error(), "is pending") {
		t.Errorf("a dry run behind a pending restore: %v", err)
	}
}

// backup-now shows how far the leader's snapshot stream has gone, on
// stderr, while stdout takes the backup's name alone.
func TestBackupNowShowsProgress(t *testing.T) {
	defer func(d time.Duration) { lineInterval = d }(lineInterval)
	lineInterval = 50 * time.Millisecond
	e := outputEnv(t)
	s := e.open(t)
	defer s.Close()
	started := spec.Int64(time.Now().UnixNano())
	go func() {
		for t.Context().Err() == nil {
			cmds, _ := s.ListCommands(t.Context())
			for _, q := range cmds {
				if q.Command.BackupNow == nil {
					continue
				}
				for _, st := range []spec.CommandStatus{
					{State: spec.CommandRunning, Transfer: &spec.Transfer{Done: 12 << 20, Total: 24 << 20, Started: started}},
					{State: spec.CommandDone, Backup: "2026-12-04T05:00:00Z-000001"},
				} {
					_ = s.SetCommandStatus(t.Context(), q.ID, st, time.Now())
					time.Sleep(600 * time.Millisecond)
				}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	out, stderr, err := e.run(t, "backup-now", "--timeout=20s")
	if err != nil {
		t.Fatal(err)
	}
	if out != "2026-12-04T05:00:00Z-000001\n" {
		t.Errorf("stdout %q, want the backup's name alone", out)
	}
	for _, want := range []string{": streamed: 12.0 MiB of 24.0 MiB (50%)", ": streamed: 24.0 MiB of 24.0 MiB (100%)"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr has no %q:\n%s", want, stderr)
		}
	}
}
