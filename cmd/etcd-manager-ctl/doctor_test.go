package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// doctor on a store that is fine, and on one of each fault it checks:
// the check fails (or warns) with how to fix it, and the others stand.
func TestDoctor(t *testing.T) {
	binDir, err := harness.EtcdBinDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(binDir, "etcd-v3.6.16", "etcd")); err != nil {
		t.Fatalf("real etcd 3.6.16 is required (run make tools): %v", err)
	}
	// A port to find in use, held by the test.
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldPort := strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
	freeL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freePort := strconv.Itoa(freeL.Addr().(*net.TCPAddr).Port)
	freeL.Close()

	tests := []struct {
		name string
		// setup prepares the env and returns doctor's extra flags.
		setup    func(t *testing.T, e ctlEnv) []string
		clock    time.Duration // this machine's clock off by this much
		want     map[string]string
		wantFix  map[string]string
		wantCode int
	}{
		{name: "fine", setup: func(t *testing.T, e ctlEnv) []string { return nil },
			want: map[string]string{"store": checkOK, "store-write": checkOK, "store-clock": checkOK, "agent-clocks": checkSkip, "etcd": checkOK, "ports": checkOK, "disk": checkOK}},
		{name: "a store not made yet", setup: func(t *testing.T, e ctlEnv) []string {
			if err := os.RemoveAll(e.storeDir()); err != nil {
				t.Fatal(err)
			}
			return nil
		}, want: map[string]string{"store": checkWarn, "store-write": checkSkip}, wantFix: map[string]string{"store": "the agents create it"}},
		{name: "a store no one can make", setup: func(t *testing.T, e ctlEnv) []string {
			f := filepath.Join(t.TempDir(), "file")
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{"--backup-store=file://" + f + "/store"}
		}, want: map[string]string{"store": checkFail}, wantFix: map[string]string{"store": "is not a directory"}, wantCode: exitFailed},
		{name: "a store that takes no write", setup: func(t *testing.T, e ctlEnv) []string {
			if err := os.WriteFile(filepath.Join(e.storeDir(), "doctor"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return nil
		}, want: map[string]string{"store-write": checkFail}, wantFix: map[string]string{"store-write": "grant this user"}, wantCode: exitFailed},
		{name: "this clock behind the store's", clock: -time.Minute, setup: func(t *testing.T, e ctlEnv) []string { return nil },
			want: map[string]string{"store-clock": checkFail}, wantFix: map[string]string{"store-clock": "NTP"}, wantCode: exitFailed},
		{name: "an agent's clock ahead", setup: func(t *testing.T, e ctlEnv) []string {
			s := e.open(t)
			defer s.Close()
			rec := `{"nodeId":"fast","address":"127.0.0.1:8000","updated":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`
			if err := s.Write(t.Context(), "discovery/fast", []byte(rec)); err != nil {
				t.Fatal(err)
			}
			return nil
		}, want: map[string]string{"agent-clocks": checkFail}, wantFix: map[string]string{"agent-clocks": "NTP"}, wantCode: exitFailed},
		{name: "the spec's etcd not installed", setup: func(t *testing.T, e ctlEnv) []string {
			return []string{"--etcd-bin-dir=" + t.TempDir()}
		}, want: map[string]string{"etcd": checkFail}, wantFix: map[string]string{"etcd": "install etcd-v<version>/etcd"}, wantCode: exitFailed},
		{name: "a port in use", setup: func(t *testing.T, e ctlEnv) []string {
			return []string{"--ports=" + freePort + "," + heldPort}
		}, want: map[string]string{"ports": checkWarn}, wantFix: map[string]string{"ports": "expected if an agent"}},
		{name: "no room for a restore", setup: func(t *testing.T, e ctlEnv) []string {
			e.plantBackup(t, "2026-11-22T05:00:00Z-000001", []byte(`{"etcdVersion":"3.6.16","timestamp":"1795410000","size":1125899906842624}`), []byte("gz"))
			return nil
		}, want: map[string]string{"disk": checkFail}, wantFix: map[string]string{"disk": "more room"}, wantCode: exitFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCtlEnv(t)
			if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
				t.Fatal(err)
			}
			args := []string{"doctor", "-o", "json", "--etcd-bin-dir=" + binDir, "--data-dir=" + t.TempDir(), "--listen-address=127.0.0.1", "--ports=" + freePort}
			args = append(args, tt.setup(t, e)...)
			if tt.clock != 0 {
				doctorNow = func() time.Time { return time.Now().Add(tt.clock) }
				defer func() { doctorNow = time.Now }()
			}
			out, _, err := e.run(t, args...)
			if got := exitCode(err); (err == nil) != (tt.wantCode == 0) || (err != nil && got != tt.wantCode) {
				t.Errorf("exit %d (%v), want %d", got, err, tt.wantCode)
			}
			var checks []doctorCheck
			if err := json.Unmarshal([]byte(out), &checks); err != nil {
				t.Fatalf("%v:\n%s", err, out)
			}
			got := map[string]doctorCheck{}
			for _, c := range checks {
				got[c.Check] = c
			}
			if len(got) != 7 {
				t.Errorf("%d checks, want 7: %+v", len(got), checks)
			}
			for name, status := range tt.want {
				if got[name].Status != status {
					t.Errorf("%s: %+v, want %s", name, got[name], status)
				}
			}
			for name, fix := range tt.wantFix {
				if !strings.Contains(got[name].Fix+" "+got[name].Detail, fix) {
					t.Errorf("%s says %+v, want %q", name, got[name], fix)
				}
			}
			for name, c := range got {
				if _, named := tt.want[name]; !named && tt.name != "fine" && c.Status == checkFail {
					t.Errorf("%s failed too: %+v", name, c)
				}
			}
		})
	}
}
