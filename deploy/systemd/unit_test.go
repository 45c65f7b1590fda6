// Package systemd_test checks the systemd unit and environment file
// shipped in deploy/systemd with systemd's own tools. That the agent takes
// the flags they pass is checked beside the flags, in cmd/internal/flags.
package systemd_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const unit = "etcd-manager@.service"

// analyze runs systemd-analyze, which Debian's systemd package ships;
// its absence fails the test.
func analyze(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze is needed (Debian's systemd package): %v", err)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = t.TempDir()
	err = cmd.Run()
	return out.String(), err
}

// unitCopy is the unit with its ExecStart binary replaced by an
// executable that exists here (this test's own), since verify checks it;
// nothing else changes.
func unitCopy(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte("ExecStart=/usr/local/bin/etcd-manager ")) {
		t.Fatal("the unit's ExecStart is not /usr/local/bin/etcd-manager")
	}
	data = bytes.Replace(data, []byte("ExecStart=/usr/local/bin/etcd-manager "), []byte("ExecStart="+self+" "), 1)
	path := filepath.Join(t.TempDir(), unit)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// systemd-analyze verify finds nothing to say: no unknown key, no bad
// value, a command that exists.
func TestUnitVerifies(t *testing.T) {
	out, err := analyze(t, "verify", unitCopy(t))
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The check is real: a misspelt key is reported.
	path := unitCopy(t)
	data, _ := os.ReadFile(path)
	if err := os.WriteFile(path, bytes.Replace(data, []byte("Restart=always"), []byte("Restartt=always"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := analyze(t, "verify", path); !strings.Contains(out, "Unknown key 'Restartt'") {
		t.Fatalf("verify did not report a misspelt key:\n%s", out)
	}
}

// The hardening keeps systemd's exposure level low: at most 2.0 of 10
// ("OK"), with the options the issue names.
func TestUnitHardening(t *testing.T) {
	out, err := analyze(t, "security", "--offline=true", unitCopy(t))
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for [^:]+: ([0-9.]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	level, err := strconv.ParseFloat(m[1], 64)
	if err != nil || level > 2.0 {
		t.Errorf("exposure level %s, want at most 2.0:\n%s", m[1], out)
	}
	t.Logf("systemd's exposure level for the unit: %.1f", level)
	data, _ := os.ReadFile(unit)
	for _, want := range []string{"ProtectSystem=strict", "NoNewPrivileges=yes", "Restart=always", "CapabilityBoundingSet=\n", "User=etcd-manager"} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("the unit lacks %q", strings.TrimSpace(want))
		}
	}
}
