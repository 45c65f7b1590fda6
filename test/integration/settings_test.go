package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// etcdCmdline is the command line of an agent's etcd, "" when none runs.
func etcdCmdline(a *harness.Agent) string {
	pid := a.EtcdPID()
	if pid == 0 {
		return ""
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// waitCmdline waits until every agent's etcd runs with each of want and
// with none of not.
func waitCmdline(t *testing.T, agents []*harness.Agent, want, not []string) {
	t.Helper()
	harness.WaitFor(t, 4*time.Minute, fmt.Sprintf("every etcd to run with %v and without %v", want, not), func() bool {
		for _, a := range agents {
			cl := etcdCmdline(a)
			if cl == "" {
				return false
			}
			for _, w := range want {
				if !strings.Contains(cl, " "+w) {
					return false
				}
			}
			for _, n := range not {
				if strings.Contains(cl, " "+n) {
					return false
				}
			}
		}
		return true
	})
}

// TestSettingsRoll: etcd settings set with configure-cluster reach every
// member one at a time, the leader last after handing leadership on,
// under a steady writer that loses nothing; get and status show them;
// removing one goes back to etcd's default; a setting the spec's etcd
// version lacks is refused before the store is touched.
func TestSettingsRoll(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	// Handing leadership on drops the proposals in flight; the writer
	// tries those once more, as clients do.
	w := startWriterRetrying(t, agents, 20000, true)
	w.waitAcked(t, 20)

	out := env.MustCtl("--quota-backend-bytes=4294967296", "--heartbeat-interval=150", "--election-timeout=1500", "configure-cluster")
	if !strings.Contains(out, "etcdSettings=[election-timeout=1500 heartbeat-interval=150 quota-backend-bytes=4294967296]") {
		t.Errorf("configure-cluster printed %q", out)
	}
	set := []string{"--quota-backend-bytes=4294967296", "--heartbeat-interval=150", "--election-timeout=1500"}
	waitCmdline(t, agents, append(set, "--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true,StopGRPCServiceOnDefrag=true", "--corrupt-check-time=1h0m0s"), nil)
	harness.WaitSettled(t, agents, 3, settleTimeout)
	if out := env.MustCtl("get"); !strings.Contains(out, "etcdSettings: election-timeout=1500 heartbeat-interval=150 quota-backend-bytes=4294967296") {
		t.Errorf("get does not show the settings:\n%s", out)
	}
	harness.WaitFor(t, time.Minute, "status to show every member on the spec's settings", func() bool {
		out, _, err := env.Ctl("status")
		return err == nil && strings.Contains(out, "quota-backend-bytes=4294967296") && !strings.Contains(out, "other settings than the spec's")
	})
	logs := allLogs(agents)
	if n := strings.Count(logs, "restarting etcd with new settings"); n != 3 {
		t.Errorf("%d etcd restarts for the new settings, want 3 (one per member)", n)
	}
	if !strings.Contains(logs, "before restarting the leader with new etcd settings") {
		t.Error("the leader did not hand leadership on before its restart")
	}

	// Back to etcd's default quota; the timeouts stay.
	env.MustCtl("--quota-backend-bytes=", "configure-cluster")
	waitCmdline(t, agents, set[1:], set[:1])

	// Refused up front: etcd 3.5 has no --warning-apply-duration.
	_, errOut, err := env.Ctl("--etcd-version=3.5.35", "--warning-apply-duration=1s", "configure-cluster")
	if err == nil || !strings.Contains(errOut, "--warning-apply-duration is unknown to etcd 3.5.35") {
		t.Errorf("a setting etcd 3.5 lacks: %v\n%s", err, errOut)
	}
	if out := env.MustCtl("get"); !strings.Contains(out, "etcdVersion: "+harness.DefaultEtcdVersion) || strings.Contains(out, "warning-apply-duration") {
		t.Errorf("a refused change reached the store:\n%s", out)
	}
	_, errOut, err = env.Ctl("--data-dir=/tmp", "configure-cluster")
	// --data-dir is a flag of another command (doctor), not an etcd setting.
	if err == nil || !strings.Contains(errOut, "configure-cluster takes no --data-dir") {
		t.Errorf("a flag not on the allow-list: %v\n%s", err, errOut)
	}
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w.check(t, clusterClient(t, agents))
	if w.failed > 0 {
		t.Errorf("%d writes failed, retries included, while the settings rolled out (first: %v)", w.failed, w.firstErr)
	}
}

// TestSettingsKnownToEtcd: every setting the allow-list offers for a
// version is a flag of that version's etcd, and the corruption checks
// take the form that version has, for each etcd pinned. (Every other
// integration test starts etcd with those checks on.)
func TestSettingsKnownToEtcd(t *testing.T) {
	dir, err := harness.EtcdBinDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"3.4.23", "3.5.35", "3.6.16", "3.7.3"} {
		help, err := exec.Command(filepath.Join(dir, "etcd-v"+v, "etcd"), "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("etcd %s --help: %v\n%s", v, err, help)
		}
		ver, err := spec.ParseVersion(v)
		if err != nil {
			t.Fatal(err)
		}
		names := spec.SettingsFor(ver)
		for _, name := range names {
			if !regexp.MustCompile(`(?m)^\s*--` + regexp.QuoteMeta(name) + `\b`).Match(help) {
				t.Errorf("etcd %s has no --%s, which the allow-list offers for it", v, name)
			}
		}
		t.Logf("etcd %s: all %d settings offered for it are its flags", v, len(names))
		checks := etcdproc.ManagedArgs(etcdproc.ParseHelp(help), true, time.Hour)
		want := map[string]string{
			"3.4.23": "--experimental-initial-corrupt-check=true --experimental-corrupt-check-time=1h0m0s",
			"3.5.35": "--experimental-initial-corrupt-check=true --experimental-compact-hash-check-enabled=true --experimental-stop-grpc-service-on-defrag=true --experimental-corrupt-check-time=1h0m0s",
			"3.6.16": "--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true,StopGRPCServiceOnDefrag=true --corrupt-check-time=1h0m0s",
			"3.7.3":  "--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true,StopGRPCServiceOnDefrag=true --corrupt-check-time=1h0m0s",
		}[v]
		if got := strings.Join(checks, " "); got != want {
			t.Errorf("etcd %s: corruption checks %q, want %q", v, got, want)
		}
	}
}
