package testhook_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/testhook"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// build builds the probe and the agent, as a release (without the
// testhooks tag) or not.
func build(t *testing.T, release bool) (probe, agent string) {
	t.Helper()
	dir := t.TempDir()
	for _, pkg := range []string{"./internal/testhook/probe", "./cmd/etcd-manager"} {
		cmd := exec.Command("go", "build", "-tags="+harness.Tags(release), "-o", dir+"/", pkg)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return filepath.Join(dir, "probe"), filepath.Join(dir, "etcd-manager")
}

// A release build ignores every test hook's variable: it neither
// crashes, nor pauses, nor moves its clock, and the agent's binary holds
// none of their names. A testhooks build obeys them.
func TestReleaseIgnoresHooks(t *testing.T) {
	clockFile := filepath.Join(t.TempDir(), "clock")
	if err := os.WriteFile(clockFile, []byte("-30s"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), testhook.Env+"=probe", testhook.PauseEnv+"=probe", testhook.ClockFileEnv+"="+clockFile)

	probe, agent := build(t, true)
	cmd := exec.Command(probe)
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != "0s" {
		t.Errorf("the release probe with every hook set: %q, %v; want it to run on with its clock as is (0s)", out, err)
	}
	bin, err := os.ReadFile(agent)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{testhook.Env, testhook.PauseEnv, testhook.ClockFileEnv} {
		if strings.Contains(string(bin), name) {
			t.Errorf("the release agent's binary holds %s", name)
		}
	}

	hooked, _ := build(t, false)
	cmd = exec.Command(hooked)
	cmd.Env = env
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the testhooks probe at its crash point: %v; want it killed", err)
	}
	cmd = exec.Command(hooked)
	cmd.Env = append(os.Environ(), testhook.ClockFileEnv+"="+clockFile)
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != "-30s" {
		t.Errorf("the testhooks probe with its clock set back: %q, %v; want -30s", out, err)
	}
}
