package integration

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// The status page of a live 3-member cluster, rendered by a real
// headless Chromium (Debian's package): its DOM shows every member, the
// leader and the newest backup. Chromium runs in a network namespace of
// its own, with no interface but loopback, on the page the agent served:
// it sends nothing anywhere. With ETCD_MANAGER_STATUS_SCREENSHOT set, the
// screenshot is copied there (for the README).
func TestStatusPageInChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("Debian's chromium is needed: %v", err)
	}
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{Metrics: true})
	env.MustCtl("backup-now")
	var page string
	harness.WaitFor(t, time.Minute, "a status page showing 3 healthy members and a backup", func() bool {
		resp, err := http.Get(strings.TrimSuffix(agents[0].MetricsURL, "/metrics") + "/status")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		page = string(body)
		return resp.StatusCode == http.StatusOK && strings.Count(page, `class="ok">healthy`) == 3 && !strings.Contains(page, `id="backup">none`)
	})
	dir := t.TempDir()
	file := filepath.Join(dir, "status.html")
	if err := os.WriteFile(file, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "status.png")
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("unshare", append([]string{"--net", chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
			"--no-first-run", "--disable-background-networking", "--user-data-dir=" + filepath.Join(dir, "profile")}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
		}
		return string(out)
	}
	dom := run("--dump-dom", "file://"+file)
	if n := strings.Count(dom, `<tr class="member">`); n != 3 {
		t.Errorf("the DOM shows %d members, want 3:\n%s", n, dom)
	}
	for _, a := range agents {
		if id := a.NodeID(); !strings.Contains(dom, "<td>"+id+"</td>") {
			t.Errorf("the DOM does not show member %s", id)
		}
	}
	if strings.Contains(dom, `id="leader">none`) || !strings.Contains(dom, `<td id="backup">20`) {
		t.Errorf("the DOM shows no leader or no backup:\n%s", dom)
	}
	run("--window-size=1100,900", "--screenshot="+shot, "file://"+file)
	st, err := os.Stat(shot)
	if err != nil || st.Size() < 10_000 {
		t.Fatalf("screenshot: %v", err)
	}
	if dst := os.Getenv("ETCD_MANAGER_STATUS_SCREENSHOT"); dst != "" {
		data, _ := os.ReadFile(shot)
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
