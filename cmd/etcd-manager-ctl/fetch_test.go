package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/agent"
)

// TestMain lets the test binary act as the ctl's verify-snapshot child,
// which fetch-backup runs as its own executable.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == agent.VerifySnapshotCommand {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fetch-backup refuses what it cannot fetch whole, says why, and leaves
// --out as it was: no snapshot.db, no meta, no folder of its own.
func TestFetchBackupRefusals(t *testing.T) {
	const name = "2026-11-22T05:00:00Z-000001"
	tests := []struct {
		name     string
		meta     string
		data     string
		args     []string
		existing string // a file already in --out
		wantCode int
		wantErr  []string
	}{
		{name: "no --out", args: []string{name}, wantCode: exitUsage, wantErr: []string{"--out DIR is required"}},
		{name: "no name", args: []string{"--out=OUT"}, wantCode: exitUsage, wantErr: []string{"accepts 1 arg"}},
		{name: "not in the store", args: []string{name, "--out=OUT"}, wantCode: exitFailed, wantErr: []string{`no backup "` + name + `"`, "list-backups"}},
		{name: "encrypted, no key", meta: `{"etcdVersion":"3.6.16","timestamp":"1795410000","encryption":{"scheme":"age","keyId":"age:0123456789abcdef"}}`, data: "age-encryption.org/v1\n",
			args: []string{name, "--out=OUT"}, wantCode: exitFailed, wantErr: []string{"age:0123456789abcdef", "--backup-decryption-key-file"}},
		{name: "damaged object", meta: `{"etcdVersion":"3.6.16","timestamp":"1795410000","sha256":"` + strings.Repeat("ab", 32) + `"}`, data: "not gzip at all",
			args: []string{name, "--out=OUT"}, wantCode: exitFailed, wantErr: []string{"nothing was written to"}},
		{name: "a snapshot.db in --out", meta: `{"etcdVersion":"3.6.16","timestamp":"1795410000"}`, data: "gz", existing: "snapshot.db",
			args: []string{name, "--out=OUT"}, wantCode: exitFailed, wantErr: []string{"snapshot.db exists", "never overwrites"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCtlEnv(t)
			if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
				t.Fatal(err)
			}
			if tt.meta != "" {
				e.plantBackup(t, name, []byte(tt.meta), []byte(tt.data))
			}
			out := filepath.Join(t.TempDir(), "out")
			if tt.existing != "" {
				if err := os.MkdirAll(out, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(out, tt.existing), []byte("mine"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var args []string
			for _, a := range tt.args {
				args = append(args, strings.ReplaceAll(a, "OUT", out))
			}
			_, _, err := e.run(t, append([]string{"fetch-backup"}, args...)...)
			if err == nil || exitCode(err) != tt.wantCode {
				t.Fatalf("fetch-backup %v: %v (exit %d), want exit %d", args, err, exitCode(err), tt.wantCode)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			entries, _ := os.ReadDir(out)
			for _, de := range entries {
				if de.Name() != tt.existing {
					t.Errorf("a refused fetch left %s in --out", de.Name())
				}
			}
			if tt.existing != "" {
				if b, _ := os.ReadFile(filepath.Join(out, tt.existing)); string(b) != "mine" {
					t.Errorf("%s in --out was overwritten", tt.existing)
				}
			}
		})
	}
}
