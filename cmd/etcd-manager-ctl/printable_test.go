package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"gocloud.dev/blob/fileblob"

	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// hostile is text a writer of the store could plant to act on the
// terminal of whoever runs the ctl: clear the screen, retitle the window
// (ending with BEL), overwrite the line, reorder it, and a C1 CSI.
const hostile = "\x1b[2J\x1b]0;pwned\a\rok\u202edesrever\u009b31m\x7f"

// checkTerminalSafe fails the test if out holds anything a terminal would
// act on rather than show, other than the line breaks and tabs the ctl
// writes itself. It is written apart from printable, so as to test it.
func checkTerminalSafe(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s is not UTF-8: %q", what, out)
	}
	for i, r := range out {
		bad := (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r <= 0x9f) ||
			(r >= 0x200b && r <= 0x200f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) ||
			r == 0x2028 || r == 0x2029 || r == 0x061c || r == 0xfeff
		if bad {
			t.Errorf("%s holds %U at byte %d: %q", what, r, i, out)
			return
		}
	}
}

func TestPrintable(t *testing.T) {
	tests := []struct {
		name, in, want, wantLines string
	}{
		{name: "plain", in: "restoring backup 2026-11-22T05:00:00Z-000001", want: "restoring backup 2026-11-22T05:00:00Z-000001"},
		{name: "letters of any script stay", in: "nœud-é 日本 ✓ \ufffd", want: "nœud-é 日本 ✓ \ufffd"},
		{name: "escape sequences", in: "\x1b[2J\x1b]0;t\a", want: `\x1b[2J\x1b]0;t\x07`},
		{name: "carriage return and backspace", in: "ok\rfailed\b", want: `ok\rfailed\x08`},
		{name: "line breaks and tabs", in: "a\nb\tc", want: `a\nb\tc`, wantLines: "a\nb\tc"},
		{name: "NUL and DEL", in: "a\x00b\x7f", want: `a\x00b\x7f`},
		{name: "C1 controls", in: "\u009b31m\u0085", want: `\x9b31m\x85`},
		{name: "bidi override and isolate", in: "a\u202eb\u2066c\u200fd", want: `a\u202eb\u2066c\u200fd`},
		{name: "zero width and BOM", in: "a\u200bb\ufeff", want: `a\u200bb\ufeff`},
		{name: "line separators", in: "a\u2028b\u2029", want: `a\u2028b\u2029`},
		{name: "bytes that are not UTF-8", in: "a\xffb\xc3", want: `a\xffb\xc3`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := printable(tt.in); got != tt.want {
				t.Errorf("printable(%q) = %q, want %q", tt.in, got, tt.want)
			}
			wantLines := tt.wantLines
			if wantLines == "" {
				wantLines = tt.want
			}
			if got := printableLines(tt.in); got != wantLines {
				t.Errorf("printableLines(%q) = %q, want %q", tt.in, got, wantLines)
			}
			checkTerminalSafe(t, "printable's result", printable(tt.in))
		})
	}
}

func TestFprintfEscapesItsArguments(t *testing.T) {
	var b bytes.Buffer
	err := fprintf(&b, "%s|%v|%s|%d|%s\n", hostile, errors.New(hostile), spec.Settings{"name": hostile}, 42, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	checkTerminalSafe(t, "fprintf's output", b.String())
	if !strings.Contains(b.String(), `\x1b[2J`) || !strings.Contains(b.String(), "|42|1.5s\n") {
		t.Errorf("fprintf printed %q", b.String())
	}
}

// JSON output escapes what encoding/json leaves raw, and means the same.
func TestWriteJSONIsTerminalSafe(t *testing.T) {
	in := cli.CommandRow{ID: hostile, Detail: "a\u0085b\u202ec\u2066d é", Phase: "\u200b"}
	var b bytes.Buffer
	if err := writeJSON(&b, in); err != nil {
		t.Fatal(err)
	}
	checkTerminalSafe(t, "writeJSON's output", b.String())
	var got cli.CommandRow
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, in) {
		t.Errorf("decoded %+v, want %+v", got, in)
	}
}

// Hostile text planted in the store comes out of list-commands, get and
// the wait loops escaped, in text and JSON alike.
func TestHostileStoreTextIsEscaped(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "--quota-backend-bytes=1", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	s := e.open(t)
	ctx := t.Context()
	now := time.Now()
	// A failed backup-now, a restore of a hostile name with a hostile
	// phase, and a command under a hostile ID.
	id, err := s.AddCommand(ctx, spec.Command{BackupNow: &spec.BackupNowCommand{}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetCommandStatus(ctx, id, spec.CommandStatus{State: spec.CommandFailed, Message: hostile}, now); err != nil {
		t.Fatal(err)
	}
	restoreID, err := s.AddCommand(ctx, spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: hostile}}, now)
	if err != nil {
		t.Fatal(err)
	}
	id = restoreID
	if err := s.SetCommandStatus(ctx, id, spec.CommandStatus{State: spec.CommandRunning, Restore: &spec.RestoreProgress{Phase: hostile}}, now); err != nil {
		t.Fatal(err)
	}
	// The store writes no such key: another tool did, through the same
	// driver, which escapes it into a file name.
	other, err := fileblob.OpenBucket(e.storeDir(), &fileblob.Options{Metadata: fileblob.MetadataDontWrite})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.WriteAll(ctx, store.CommandPrefix+"9999-"+hostile+"/"+store.CommandObject, []byte(`{"backupNow":{}}`), nil); err != nil {
		t.Fatal(err)
	}
	// The spec: a setting's value.
	specPath := filepath.Join(e.storeDir(), "control", "etcd-cluster-spec")
	data, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	data = bytes.Replace(data, []byte(`"quota-backend-bytes":"1"`), []byte(`"quota-backend-bytes":"\u001b[2J\u202e"`), 1)
	if err := os.WriteFile(specPath, data, 0o600); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{{"list-commands"}, {"list-commands", "-o", "json"}, {"get"}, {"get", "-o", "json"}} {
		out, stderr, _ := e.run(t, args...)
		checkTerminalSafe(t, strings.Join(args, " ")+" stdout", out)
		checkTerminalSafe(t, strings.Join(args, " ")+" stderr", stderr)
		if !strings.Contains(out, `\x1b[2J`) && !strings.Contains(out, `\u001b[2J`) {
			t.Errorf("%v printed no escaped ESC: %q", args, out)
		}
	}
	out, _, err := e.run(t, "list-commands")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "\n"); n != 3 {
		t.Errorf("list-commands printed %d lines, want 3 (a hostile CR or LF must not make or hide one):\n%s", n, out)
	}

	// The wait loops print what the leader writes as it goes.
	answer := func(kind string, statuses ...spec.CommandStatus) {
		old := map[string]bool{}
		cmds, err := s.ListCommands(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range cmds {
			old[q.ID] = true
		}
		go func() {
			for ctx.Err() == nil {
				cmds, _ := s.ListCommands(ctx)
				for _, q := range cmds {
					if q.Command.Kind() == kind && !old[q.ID] {
						for _, st := range statuses {
							_ = s.SetCommandStatus(ctx, q.ID, st, time.Now())
							time.Sleep(600 * time.Millisecond)
						}
						return
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	answer(spec.Command{BackupNow: &spec.BackupNowCommand{}}.Kind(), spec.CommandStatus{State: spec.CommandDone, Backup: hostile})
	out, stderr, err := e.run(t, "backup-now", "--timeout=20s")
	if err != nil {
		t.Fatal(err)
	}
	checkTerminalSafe(t, "backup-now", out+stderr)

	answer(spec.Command{Defrag: &spec.DefragCommand{}}.Kind(),
		spec.CommandStatus{State: spec.CommandRunning, Defragmented: []string{hostile}},
		spec.CommandStatus{State: spec.CommandFailed, Message: hostile, Defragmented: []string{hostile}})
	out, stderr, err = e.run(t, "defrag", "--timeout=20s")
	if err == nil {
		t.Fatal("defrag whose command failed succeeded")
	}
	checkTerminalSafe(t, "defrag", out+stderr)
	if !strings.Contains(out, `defragmented \x1b[2J`) {
		t.Errorf("defrag printed %q", out)
	}
	var report bytes.Buffer
	printError(&report, err)
	checkTerminalSafe(t, "defrag's error", report.String())

	// The restore in the store would refuse another: it failed.
	if err := s.SetCommandStatus(ctx, restoreID, spec.CommandStatus{State: spec.CommandFailed, Message: hostile}, time.Now()); err != nil {
		t.Fatal(err)
	}
	const name = "2026-11-22T05:00:00Z-000001"
	e.plantBackup(t, name, []byte(`{"etcdVersion":"3.6.16","timestamp":"1795410000"}`), []byte("gz"))
	answer(spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: name}}.Kind(),
		spec.CommandStatus{State: spec.CommandRunning, Restore: &spec.RestoreProgress{Phase: hostile}},
		spec.CommandStatus{State: spec.CommandFailed, Message: hostile})
	out, stderr, err = e.run(t, "restore-backup", "--timeout=20s", name)
	if err == nil {
		t.Fatal("restore-backup whose command failed succeeded")
	}
	checkTerminalSafe(t, "restore-backup", out+stderr)
	if !strings.Contains(stderr, `: \x1b[2J`) {
		t.Errorf("restore-backup printed no phase: %q", stderr)
	}
	report.Reset()
	printError(&report, err)
	checkTerminalSafe(t, "restore-backup's error", report.String())
}

// status prints what the agents report, and the addresses of the
// discovery records, escaped.
func TestPrintStatusIsTerminalSafe(t *testing.T) {
	cs := spec.ClusterSpec{MemberCount: 1, EtcdVersion: hostile, EtcdSettings: spec.Settings{"snapshot-count": hostile}}
	st := cli.ClusterStatus{
		Spec: &cs, Leader: hostile, EtcdLeader: hostile, ClusterVersion: hostile,
		Agents: []cli.AgentStatus{{ID: hostile, Address: hostile, Role: hostile, EtcdVersion: hostile, ClientURL: hostile,
			LockRefused: hostile, Procedure: hostile, EtcdSettings: spec.Settings{"x": hostile}}},
		Unreachable: []string{hostile},
		Failing:     []string{hostile},
		Maintenance: &peer.Maintenance{Alarms: []string{hostile},
			LastDefrag:    &peer.DefragRecord{Node: hostile},
			LastHashCheck: &peer.HashCheckRecord{Outcome: hostile},
			LastDiscard:   &peer.DiscardRecord{Node: hostile, Reason: hostile}},
	}
	var b bytes.Buffer
	if err := printStatus(&b, st); err != nil {
		t.Fatal(err)
	}
	checkTerminalSafe(t, "status", b.String())
	if n := strings.Count(b.String(), `\x1b[2J`); n < 15 {
		t.Errorf("status shows the escaped text %d times, want every field:\n%s", n, b.String())
	}
}

func TestPrintErrorKeepsLinesOnly(t *testing.T) {
	var b bytes.Buffer
	printError(&b, errors.Join(errors.New("first: "+hostile), errors.New("second")))
	want := `etcd-manager-ctl: first: \x1b[2J\x1b]0;pwned\x07\rok\u202edesrever\x9b31m\x7f` + "\nsecond\n"
	if b.String() != want {
		t.Errorf("printError wrote %q, want %q", b.String(), want)
	}
}

// open opens the env's store, for a test to plant objects in.
func (e ctlEnv) open(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), e.store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// storeDir is the env's store's directory.
func (e ctlEnv) storeDir() string { return strings.TrimPrefix(e.store, "file://") }
