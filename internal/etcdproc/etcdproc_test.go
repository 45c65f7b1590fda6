package etcdproc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// writeScript writes an executable shell script standing in for etcd.
// Unit tests use it for process mechanics only; etcd's behaviour is
// covered by the integration tests with the real binary.
func writeScript(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustVersion(t *testing.T, s string) spec.Version {
	t.Helper()
	v, err := spec.ParseVersion(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestFindBinaries(t *testing.T) {
	dir := t.TempDir()
	writeScript(t, filepath.Join(dir, "etcd-v3.6.16", "etcd"), "echo 'etcd Version: 3.6.16'")
	writeScript(t, filepath.Join(dir, "etcd-v3.5.35-linux-"+runtime.GOARCH, "etcd"), "echo 'etcd Version: 3.5.35'")
	if err := os.MkdirAll(filepath.Join(dir, "etcd-v3.4.23"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etcd-v3.4.23", "etcd"), []byte("not executable"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		version string
		wantDir string
		wantErr bool
	}{
		{name: "plain folder", version: "3.6.16", wantDir: "etcd-v3.6.16"},
		{name: "release tarball folder", version: "3.5.35", wantDir: "etcd-v3.5.35-linux-" + runtime.GOARCH},
		{name: "not executable", version: "3.4.23", wantErr: true},
		{name: "missing", version: "3.6.99", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := FindBinaries(dir, mustVersion(t, tt.version))
			if tt.wantErr {
				if !errors.Is(err, ErrNoBinary) {
					t.Fatalf("err = %v, want ErrNoBinary", err)
				}
				// The error names the folder and every path looked at.
				for _, want := range append([]string{dir}, CandidateDirs(dir, mustVersion(t, tt.version))...) {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not name %s", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.Dir != filepath.Join(dir, tt.wantDir) || b.Etcdctl != filepath.Join(dir, tt.wantDir, "etcdctl") {
				t.Errorf("got %+v", b)
			}
		})
	}
}

func TestCheckVersion(t *testing.T) {
	dir := t.TempDir()
	writeScript(t, filepath.Join(dir, "etcd-v3.6.16", "etcd"), "echo 'etcd Version: 3.6.16'; echo 'Git SHA: x'")
	writeScript(t, filepath.Join(dir, "etcd-v3.6.15", "etcd"), "echo 'etcd Version: 3.6.16'")
	writeScript(t, filepath.Join(dir, "etcd-v3.6.14", "etcd"), "echo garbage")

	ok, _ := FindBinaries(dir, mustVersion(t, "3.6.16"))
	if err := ok.CheckVersion(t.Context()); err != nil {
		t.Errorf("matching binary: %v", err)
	}
	wrong, _ := FindBinaries(dir, mustVersion(t, "3.6.15"))
	if err := wrong.CheckVersion(t.Context()); err == nil || !strings.Contains(err.Error(), "reports version 3.6.16") {
		t.Errorf("mismatched binary: %v", err)
	}
	junk, _ := FindBinaries(dir, mustVersion(t, "3.6.14"))
	if err := junk.CheckVersion(t.Context()); err == nil {
		t.Error("binary without a version line: no error")
	}
}

func TestStatePersistsAndLocks(t *testing.T) {
	l := Layout{Root: filepath.Join(t.TempDir(), "node")}
	unlock, err := l.Lock()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(); !errors.Is(err, ErrDataDirLocked) {
		t.Errorf("second Lock: %v, want ErrDataDirLocked", err)
	}
	st, err := l.LoadState("")
	if err != nil || st.NodeID == "" {
		t.Fatalf("LoadState = %+v, %v", st, err)
	}
	st.Member = &MemberState{ClusterToken: "tok", EtcdVersion: "3.6.16", InitialCluster: "a=http://127.0.0.1:2380", NewCluster: true, PeerURLs: []string{"http://127.0.0.1:2380"}}
	if err := l.SaveState(st); err != nil {
		t.Fatal(err)
	}
	// A name given later does not rename a node: its data dir keeps the
	// ID it was created with.
	again, err := l.LoadState("etcd-0")
	if err != nil || again.NodeID != st.NodeID || !reflect.DeepEqual(*again.Member, *st.Member) {
		t.Fatalf("reloaded %+v, %v", again, err)
	}
	named, err := Layout{Root: t.TempDir()}.LoadState("etcd-0")
	if err != nil || named.NodeID != "etcd-0" {
		t.Fatalf("a fresh data dir with a name: %+v, %v", named, err)
	}
	unlock()
	unlock2, err := l.Lock()
	if err != nil {
		t.Fatalf("Lock after unlock: %v", err)
	}
	unlock2()

	if err := os.WriteFile(filepath.Join(l.Root, "state.json"), []byte("{bad"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.LoadState(""); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("corrupt state: %v", err)
	}
}

func TestTrashMovesNeverDeletes(t *testing.T) {
	l := Layout{Root: t.TempDir()}
	if got, err := l.Trash("none", time.Now()); err != nil || got != "" {
		t.Fatalf("Trash of missing data: %q, %v", got, err)
	}
	member := filepath.Join(l.Root, "data", "tok", "member")
	if err := os.MkdirAll(member, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(member, "db"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !l.HasEtcdData("tok") {
		t.Fatal("HasEtcdData = false")
	}
	dst, err := l.Trash("tok", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if l.HasEtcdData("tok") {
		t.Error("data still in place after Trash")
	}
	if b, err := os.ReadFile(filepath.Join(dst, "member", "db")); err != nil || string(b) != "data" {
		t.Errorf("trashed data: %q, %v", b, err)
	}
}

// A token that is not of the token's form never becomes a path: a
// traversal such as ../../victim leaves the folder it names untouched.
func TestLayoutRefusesHostileTokens(t *testing.T) {
	root := t.TempDir()
	l := Layout{Root: filepath.Join(root, "agent")}
	victim := filepath.Join(root, "victim")
	if err := os.MkdirAll(filepath.Join(victim, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"../../victim", "../victim", "/etc", "a/b", ".", "..", "", "x\x00y", strings.Repeat("a", 65)} {
		if dir, err := l.EtcdDataDir(token); err == nil {
			t.Errorf("EtcdDataDir(%q) = %s", token, dir)
		}
		if l.HasEtcdData(token) {
			t.Errorf("HasEtcdData(%q) = true", token)
		}
		if _, err := l.Trash(token, time.Now()); !errors.Is(err, spec.ErrInvalidToken) {
			t.Errorf("Trash(%q): %v, want ErrInvalidToken", token, err)
		}
	}
	if !HasData(victim) {
		t.Fatal("the folder outside the data dir was moved")
	}
	// A state file carrying such a token is refused, naming the file.
	if err := os.MkdirAll(l.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.statePath(), []byte(`{"format":1,"nodeId":"n1","member":{"clusterToken":"../../victim"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.LoadState(""); !errors.Is(err, spec.ErrInvalidToken) || !strings.Contains(err.Error(), l.statePath()) {
		t.Errorf("LoadState with a hostile token: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSupervisorRestartsAndStops(t *testing.T) {
	dir := t.TempDir()
	// The stand-in records each start and then sleeps like a server.
	starts := filepath.Join(dir, "starts")
	etcd := filepath.Join(dir, "etcd-v3.6.16", "etcd")
	writeScript(t, etcd, "echo started >> "+starts+"\nexec sleep 60")
	pidFile := filepath.Join(dir, "etcd.pid")
	sup := NewSupervisor(SupervisorConfig{
		PIDFile: pidFile, Output: io.Discard, StopTimeout: 2 * time.Second,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	sp := Spec{Binaries: Binaries{Etcd: etcd}, Name: "n", DataDir: filepath.Join(dir, "data", "tok")}
	if err := sup.Start(t.Context(), sp); err != nil {
		t.Fatal(err)
	}
	started := func(n int) func() bool {
		return func() bool {
			b, _ := os.ReadFile(starts)
			return strings.Count(string(b), "started") == n
		}
	}
	waitFor(t, "first start", func() bool { return sup.Status().PID != 0 })
	waitFor(t, "first start recorded", started(1))
	first := sup.Status().PID
	if b, _ := os.ReadFile(pidFile); strings.TrimSpace(string(b)) == "" {
		t.Error("pid file is empty")
	}

	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "restart", func() bool { st := sup.Status(); return st.PID != 0 && st.PID != first })
	// The stand-in records its start as its first step; wait for it.
	waitFor(t, "second start recorded", started(2))
	if got := sup.Status().Starts; got != 2 {
		t.Errorf("Starts = %d, want 2", got)
	}
	second := sup.Status().PID

	if err := sup.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if syscall.Kill(second, 0) == nil {
		// Reaped children are gone; a live pid means Stop left it running.
		t.Errorf("child %d still running after Stop", second)
	}
	if st := sup.Status(); st.Wanted || st.PID != 0 {
		t.Errorf("status after Stop: %+v", st)
	}
	if _, err := os.Stat(pidFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pid file left after Stop: %v", err)
	}
	b, _ := os.ReadFile(starts)
	if n := strings.Count(string(b), "started"); n != 2 {
		t.Errorf("child started %d times, want 2", n)
	}
}

// A Stop that gives up waiting (its context ends) still stops etcd, and
// the next Start waits for it to exit: two etcds never share a data dir.
func TestSupervisorNeverOverlaps(t *testing.T) {
	dir := t.TempDir()
	starts, pids := filepath.Join(dir, "starts"), filepath.Join(dir, "pids")
	etcd := filepath.Join(dir, "etcd-v3.6.16", "etcd")
	// The stand-in says whether an earlier one still runs, then ignores
	// SIGTERM, like an etcd slow to shut down.
	writeScript(t, etcd, "for p in $(cat "+pids+" 2>/dev/null); do kill -0 $p 2>/dev/null && echo overlap >> "+starts+"; done\n"+
		"echo $$ >> "+pids+"\necho started >> "+starts+"\ntrap '' TERM\nexec sleep 60")
	sup := NewSupervisor(SupervisorConfig{
		PIDFile: filepath.Join(dir, "etcd.pid"), Output: io.Discard, StopTimeout: 500 * time.Millisecond,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	sp := Spec{Binaries: Binaries{Etcd: etcd}, Name: "n", DataDir: filepath.Join(dir, "data", "tok")}
	if err := sup.Start(t.Context(), sp); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first start recorded", func() bool { b, _ := os.ReadFile(starts); return strings.Contains(string(b), "started") })
	first := sup.Status().PID
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := sup.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a Stop whose context ends before etcd exits: %v", err)
	}
	if err := sup.Start(t.Context(), sp); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second start recorded", func() bool { b, _ := os.ReadFile(starts); return strings.Count(string(b), "started") == 2 })
	if b, _ := os.ReadFile(starts); strings.Contains(string(b), "overlap") {
		t.Errorf("the second etcd started while the first (pid %d) still ran", first)
	}
	if err := sup.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestSupervisorStartFailure(t *testing.T) {
	sup := NewSupervisor(SupervisorConfig{Output: io.Discard, MinBackoff: time.Hour}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	err := sup.Start(t.Context(), Spec{Binaries: Binaries{Etcd: filepath.Join(t.TempDir(), "missing")}})
	if err == nil {
		t.Fatal("start of a missing binary: no error")
	}
	if err := sup.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestSpecArgs(t *testing.T) {
	sp := Spec{
		Name: "n1", DataDir: "/d/data/tok",
		ClientURLs: []string{"http://127.0.0.1:4001"}, QuarantineClientURLs: []string{"http://127.0.0.1:8001"},
		PeerURLs: []string{"http://127.0.0.1:2380"}, InitialCluster: "n1=http://127.0.0.1:2380",
		NewCluster: true, ClusterToken: "tok",
	}
	args := strings.Join(sp.Args(), " ")
	for _, want := range []string{"--listen-client-urls=http://127.0.0.1:4001", "--initial-cluster-state=new", "--initial-cluster-token=tok", "--data-dir=/d/data/tok"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	sp.Quarantined, sp.NewCluster = true, false
	args = strings.Join(sp.Args(), " ")
	for _, want := range []string{"--listen-client-urls=http://127.0.0.1:8001", "--advertise-client-urls=http://127.0.0.1:8001", "--initial-cluster-state=existing"} {
		if !strings.Contains(args, want) {
			t.Errorf("quarantined args %q lack %q", args, want)
		}
	}
	if strings.Contains(args, ":4001") {
		t.Errorf("quarantined etcd still serves the client URL: %q", args)
	}
	// With listen client URLs, etcd binds them and advertises the client
	// URLs, except in quarantine, where it binds the quarantine URLs only.
	sp.Quarantined = false
	sp.ListenClientURLs = []string{"http://0.0.0.0:4001"}
	args = strings.Join(sp.Args(), " ")
	for _, want := range []string{"--listen-client-urls=http://0.0.0.0:4001", "--advertise-client-urls=http://127.0.0.1:4001"} {
		if !strings.Contains(args, want) {
			t.Errorf("args with listen client URLs %q lack %q", args, want)
		}
	}
	sp.Quarantined = true
	if args = strings.Join(sp.Args(), " "); strings.Contains(args, ":4001") {
		t.Errorf("quarantined etcd with listen client URLs still serves the client port: %q", args)
	}
	// Behind a proxy, etcd binds one address and advertises another.
	sp.ListenPeerURLs = []string{"http://127.0.0.1:2381"}
	args = strings.Join(sp.Args(), " ")
	for _, want := range []string{"--listen-peer-urls=http://127.0.0.1:2381", "--initial-advertise-peer-urls=http://127.0.0.1:2380"} {
		if !strings.Contains(args, want) {
			t.Errorf("args with listen peer URLs %q lack %q", args, want)
		}
	}
}

// A peer certificate name is required only over TLS, as one
// --peer-cert-allowed-hostname.
func TestSpecArgsPeerCertHostname(t *testing.T) {
	sp := Spec{Name: "n1", DataDir: "/d", ClientURLs: []string{"https://127.0.0.1:4001"}, PeerURLs: []string{"https://127.0.0.1:2380"}}
	tls := &TLSFiles{CA: "/p/ca.crt", Cert: "/p/node.crt", Key: "/p/node.key"}
	const flag = "--peer-cert-allowed-hostname"
	for _, tt := range []struct {
		name     string
		tls      *TLSFiles
		hostname string
		want     string
	}{
		{"TLS, no name: any certificate from the CA", tls, "", ""},
		{"TLS and a name", tls, "node.main.etcd-manager.internal", flag + "=node.main.etcd-manager.internal"},
		{"plain http: nothing to check", nil, "node.main.etcd-manager.internal", ""},
	} {
		sp.TLS, sp.PeerCertHostname = tt.tls, tt.hostname
		var got []string
		for _, a := range sp.Args() {
			if strings.HasPrefix(a, flag) {
				got = append(got, a)
			}
		}
		if want := []string{tt.want}; (tt.want == "" && len(got) != 0) || (tt.want != "" && !slices.Equal(got, want)) {
			t.Errorf("%s: %v, want %q", tt.name, got, tt.want)
		}
	}
}

// The spec's settings follow etcd-manager's own flags; a snapshot count
// among them wins over the agent's --etcd-snapshot-count.
func TestSpecArgsSettings(t *testing.T) {
	sp := Spec{Name: "n1", DataDir: "/d", ClientURLs: []string{"http://127.0.0.1:4001"}, PeerURLs: []string{"http://127.0.0.1:2380"}, SnapshotCount: 10000}
	tests := []struct {
		settings spec.Settings
		want     []string
		not      string
	}{
		{nil, []string{"--snapshot-count=10000"}, "--quota-backend-bytes"},
		{spec.Settings{"quota-backend-bytes": "4294967296"}, []string{"--snapshot-count=10000", "--quota-backend-bytes=4294967296"}, ""},
		{spec.Settings{"snapshot-count": "500", "election-timeout": "2000"}, []string{"--election-timeout=2000", "--snapshot-count=500"}, "--snapshot-count=10000"},
	}
	for _, tt := range tests {
		sp.Settings = tt.settings
		args := sp.Args()
		for _, w := range tt.want {
			if !slices.Contains(args, w) {
				t.Errorf("settings %v: args %q lack %q", tt.settings, args, w)
			}
		}
		if tt.not != "" && strings.Contains(strings.Join(args, " "), tt.not) {
			t.Errorf("settings %v: args %q hold %q", tt.settings, args, tt.not)
		}
	}
}

func TestInstalledVersions(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"etcd-v3.6.16", "etcd-v3.5.35-linux-amd64", "etcd-v3.6.16-linux-amd64", "etcd-v3.4.23", "etcd-v3.7.0-rc.1", "etcd-vjunk", "other"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if d == "etcd-v3.4.23" {
			continue // no binary inside
		}
		if err := os.WriteFile(filepath.Join(dir, d, "etcd"), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got := strings.Join(InstalledVersions(dir), " ")
	if want := "3.5.35 3.6.16 3.7.0-rc.1"; got != want {
		t.Fatalf("InstalledVersions = %q, want %q", got, want)
	}
	if v := InstalledVersions(filepath.Join(dir, "missing")); v != nil {
		t.Fatalf("missing dir: %v", v)
	}
}

// A member whose data is gone is never started again on its spec: not at
// the first start, and not by the restart loop after the data vanished
// under a running etcd.
func TestSupervisorRequiresData(t *testing.T) {
	dir := t.TempDir()
	starts := filepath.Join(dir, "starts")
	etcd := filepath.Join(dir, "etcd-v3.6.16", "etcd")
	writeScript(t, etcd, "echo started >> "+starts+"\nexec sleep 60")
	dataDir := filepath.Join(dir, "data", "tok")
	newSup := func() *Supervisor {
		return NewSupervisor(SupervisorConfig{Output: io.Discard, StopTimeout: 2 * time.Second,
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	sp := Spec{Binaries: Binaries{Etcd: etcd}, Name: "n", DataDir: dataDir, RequireData: true}

	sup := newSup()
	if err := sup.Start(t.Context(), sp); !errors.Is(err, ErrDataLost) {
		t.Fatalf("start on an empty data dir: %v, want ErrDataLost", err)
	}
	waitFor(t, "the supervisor to give up", func() bool { return !sup.Status().Wanted })
	if st := sup.Status(); !st.DataLost {
		t.Errorf("status %+v: DataLost not set", st)
	}
	if _, err := os.Stat(starts); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("etcd was started on an empty data dir")
	}

	if err := os.MkdirAll(filepath.Join(dataDir, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	sup = newSup()
	if err := sup.Start(t.Context(), sp); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "etcd to run", func() bool {
		b, _ := os.ReadFile(starts)
		return sup.Status().PID != 0 && strings.Count(string(b), "started") == 1
	})
	pid := sup.Status().PID
	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the supervisor to give up after the data vanished", func() bool { st := sup.Status(); return !st.Wanted && st.DataLost })
	time.Sleep(100 * time.Millisecond)
	b, _ := os.ReadFile(starts)
	if n := strings.Count(string(b), "started"); n != 1 {
		t.Errorf("etcd started %d times, want 1 (never again once its data was gone)", n)
	}
	if err := sup.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A state file from before HasRun was recorded counts members past their
// creation as having run.
func TestLoadStateMigratesHasRun(t *testing.T) {
	l := Layout{Root: t.TempDir()}
	if err := os.WriteFile(filepath.Join(l.Root, "state.json"),
		[]byte(`{"nodeId":"n1","member":{"clusterToken":"tok","etcdVersion":"3.6.16","initialCluster":"n1=http://a:2380","newCluster":false}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := l.LoadState("")
	if err != nil {
		t.Fatal(err)
	}
	if st.Format != StateFormat || st.Member == nil || !st.Member.HasRun {
		t.Fatalf("migrated state %+v (member %+v): want format %d and HasRun", st, st.Member, StateFormat)
	}
	again, err := l.LoadState("")
	if err != nil || !again.Member.HasRun {
		t.Fatalf("the migration was not saved: %+v, %v", again.Member, err)
	}
}

func TestTrashPolicy(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	entry := func(name string, age time.Duration, size int64) TrashEntry {
		return TrashEntry{Name: name, Moved: t0.Add(30*day - age), Size: size}
	}
	now := t0.Add(30 * day)
	since := now.Add(-time.Hour) // the live membership began an hour ago
	three := []TrashEntry{entry("a", 20*day, 100), entry("b", 10*day, 100), entry("c", 2*day, 100)}
	tests := []struct {
		name    string
		policy  TrashPolicy
		entries []TrashEntry
		since   time.Time
		want    string
	}{
		{"older than the age go, the newest stays", TrashPolicy{MaxAge: 7 * day}, three, since, "a,b"},
		{"the newest stays even when old", TrashPolicy{MaxAge: day}, []TrashEntry{entry("a", 20*day, 100)}, since, ""},
		{"past the size, oldest first", TrashPolicy{MaxBytes: 150}, three, since, "a,b"},
		{"under the size", TrashPolicy{MaxBytes: 300}, three, since, ""},
		{"not superseded by live data: kept", TrashPolicy{MaxAge: 7 * day}, three, now.Add(-15 * day), "a"},
		{"no live membership: nothing goes", TrashPolicy{MaxAge: 7 * day}, three, time.Time{}, ""},
		{"no policy: nothing goes", TrashPolicy{}, three, since, ""},
	}
	for _, tt := range tests {
		var names []string
		for _, e := range tt.policy.Expired(tt.entries, now, tt.since) {
			names = append(names, e.Name)
		}
		if got := strings.Join(names, ","); got != tt.want {
			t.Errorf("%s: expired %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestTrashEntriesAndTidy(t *testing.T) {
	l := Layout{Root: t.TempDir()}
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	for i, token := range []string{"old", "new"} {
		if err := os.MkdirAll(filepath.Join(l.Root, "data", token, "member"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(l.Root, "data", token, "member", "db"), make([]byte, 10*(i+1)), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Trash(token, now.Add(time.Duration(i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := l.TrashEntries()
	if err != nil || len(entries) != 2 || !strings.HasPrefix(entries[0].Name, "old-") || entries[1].Size != 20 {
		t.Fatalf("entries %+v, %v", entries, err)
	}
	if err := l.RemoveTrash("../state.json"); err == nil {
		t.Error("a path outside the trash was accepted")
	}
	if err := l.RemoveTrash(entries[0].Name); err != nil {
		t.Fatal(err)
	}
	if entries, _ := l.TrashEntries(); len(entries) != 1 {
		t.Errorf("after removing one: %+v", entries)
	}
	tmp := filepath.Join(l.Root, "tmp", "restore-123")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if removed, err := l.TidyTmp(time.Now(), time.Hour); err != nil || len(removed) != 0 {
		t.Errorf("a fresh tmp entry was removed: %v, %v", removed, err)
	}
	if removed, err := l.TidyTmp(time.Now(), 0); err != nil || len(removed) != 1 {
		t.Errorf("tidy at start: %v, %v", removed, err)
	}
}

// StopWithin kills an etcd that ignores SIGTERM after its own grace, not
// after StopTimeout, and only the next start on the data dir it killed
// follows an unclean exit.
func TestSupervisorStopWithin(t *testing.T) {
	dir := t.TempDir()
	etcd := filepath.Join(dir, "etcd-v3.6.16", "etcd")
	ready := filepath.Join(dir, "ready")
	writeScript(t, etcd, "trap '' TERM\necho x >> "+ready+"\nexec sleep 60")
	starts := 0
	// running waits for the next start to ignore SIGTERM.
	running := func() {
		starts++
		waitFor(t, "etcd to run", func() bool { b, _ := os.ReadFile(ready); return strings.Count(string(b), "x") == starts })
	}
	var checked []string
	var mu sync.Mutex
	sup := NewSupervisor(SupervisorConfig{
		Output: io.Discard, StopTimeout: time.Minute, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		AfterUncleanExit: func(_ context.Context, sp Spec) error {
			mu.Lock()
			defer mu.Unlock()
			checked = append(checked, filepath.Base(sp.DataDir))
			return nil
		},
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	spec := func(token string) Spec {
		d := filepath.Join(dir, "data", token)
		if err := os.MkdirAll(filepath.Join(d, "member"), 0o700); err != nil {
			t.Fatal(err)
		}
		return Spec{Binaries: Binaries{Etcd: etcd}, Name: "n", DataDir: d, RequireData: true}
	}
	for _, tt := range []struct {
		stopped, next string
		wantCheck     bool
	}{
		{"old", "new", false}, // a replaced cluster's data is not started again
		{"new", "new", true},
	} {
		if err := sup.Start(t.Context(), spec(tt.stopped)); err != nil {
			t.Fatal(err)
		}
		running()
		// Well inside StopTimeout: only the grace can end the stop in time.
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		err := sup.StopWithin(ctx, 100*time.Millisecond)
		cancel()
		if err != nil {
			t.Fatalf("StopWithin of an etcd that ignores SIGTERM: %v", err)
		}
		mu.Lock()
		checked = nil
		mu.Unlock()
		if err := sup.Start(t.Context(), spec(tt.next)); err != nil {
			t.Fatal(err)
		}
		running()
		mu.Lock()
		got := slices.Contains(checked, tt.next)
		mu.Unlock()
		if got != tt.wantCheck {
			t.Errorf("killed on %s, started on %s: data checked %v, want %v", tt.stopped, tt.next, got, tt.wantCheck)
		}
		if err := sup.StopWithin(t.Context(), 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
}
