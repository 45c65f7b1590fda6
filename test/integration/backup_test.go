package integration

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

var backupNameRE = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z-\d{6}$`)

// Every membership change is preceded by a verified full backup, in the
// store's format, that etcdutl reads back.
func TestBackupBeforeMembershipChange(t *testing.T) {
	env, agents, _ := startCluster(t, 1, 3, harness.AgentOptions{})
	c := clusterClient(t, agents)
	for i := range 50 {
		put(t, c, fmt.Sprintf("/backup/%02d", i), strings.Repeat("v", 100))
	}
	env.MustCtl("--member-count=3", "configure-cluster")
	harness.WaitSettled(t, agents, 3, settleTimeout)
	if n := strings.Count(allLogs(agents), `msg="backup taken"`); n < 2 {
		t.Errorf("%d backups for 2 additions, want one before each", n)
	}

	// An unfinished backup (data without meta) is never listed.
	partial := filepath.Join(env.StoreDir, "2000-01-01T00:00:00Z-000001")
	if err := os.MkdirAll(partial, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(partial, backup.DataObject), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}

	out := env.MustCtl("list-backups")
	names := strings.Fields(out)
	if len(names) < 2 {
		t.Fatalf("list-backups printed %q", out)
	}
	for i, n := range names {
		if !backupNameRE.MatchString(n) {
			t.Errorf("backup name %q is not <RFC3339>-<6 digits>", n)
		}
		if i > 0 && names[i-1] >= n {
			t.Errorf("not oldest first: %q before %q", names[i-1], n)
		}
		if strings.HasPrefix(n, "2000-") {
			t.Errorf("unfinished backup %s was listed", n)
		}
	}

	// Restore-readiness: the newest backup matches its meta and etcdutl's
	// snapshot status reads it.
	newest := names[len(names)-1]
	var meta backup.Meta
	raw, err := os.ReadFile(filepath.Join(env.StoreDir, newest, backup.MetaObject))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.EtcdVersion != harness.DefaultEtcdVersion || meta.Timestamp == 0 || meta.ClusterSpec == nil {
		t.Errorf("meta %s: want etcdVersion, timestamp and clusterSpec", raw)
	}
	for _, field := range []string{`"etcdVersion":"`, `"timestamp":"`, `"clusterSpec":{"memberCount":`} {
		if !strings.Contains(string(raw), field) {
			t.Errorf("meta %s lacks %s", raw, field)
		}
	}
	gz, err := os.ReadFile(filepath.Join(env.StoreDir, newest, backup.DataObject))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(gz)
	if hex.EncodeToString(sum[:]) != meta.SHA256 || int64(len(gz)) != meta.CompressedSize {
		t.Errorf("object sha256/size do not match the meta: %+v", meta)
	}
	zr, err := gzip.NewReader(strings.NewReader(string(gz)))
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(t.TempDir(), "snapshot.db")
	f, err := os.Create(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, zr); err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, err := backup.Verify(db)
	if err != nil {
		t.Fatalf("verify %s: %v", newest, err)
	}
	if st.Revision < 50 || st.Revision != meta.Revision {
		t.Errorf("snapshot revision %d, meta %d; want at least the 50 writes", st.Revision, meta.Revision)
	}

	// A corrupted snapshot is caught by verification.
	data, _ := os.ReadFile(db)
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(db, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := backup.Verify(db); err == nil {
		t.Error("a flipped byte passed verification")
	}

	out = env.MustCtl("list-backups", "-o", "json")
	var rows []struct {
		Name        string
		EtcdVersion string
		Size        int64
		Revision    int64
		AgeSeconds  float64
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != len(names) {
		t.Fatalf("list-backups -o json: %v\n%s", err, out)
	}
	if r := rows[len(rows)-1]; r.Name != newest || r.Size == 0 || r.Revision == 0 || r.EtcdVersion != harness.DefaultEtcdVersion {
		t.Errorf("json row %+v", r)
	}
}

// The retention policy prunes after each backup, always keeping the
// newest.
func TestBackupRetention(t *testing.T) {
	env, agents, _ := startCluster(t, 1, 3, harness.AgentOptions{ExtraArgs: []string{"--backup-retention=count:1"}})
	env.MustCtl("--member-count=3", "configure-cluster")
	harness.WaitSettled(t, agents, 3, settleTimeout)
	if n := strings.Count(allLogs(agents), `msg="backup taken"`); n < 2 {
		t.Fatalf("%d backups taken, want at least 2", n)
	}
	harness.WaitFor(t, settleTimeout, "retention to leave one backup", func() bool {
		out, _, err := env.Ctl("list-backups")
		return err == nil && len(strings.Fields(out)) == 1
	})
	if !strings.Contains(allLogs(agents), "expired backup deleted") {
		t.Error("no expired backup was deleted")
	}
}

// The backup metrics are served on --metrics-address.
func TestBackupMetrics(t *testing.T) {
	env, agents, _ := startCluster(t, 1, 2, harness.AgentOptions{Metrics: true})
	env.MustCtl("--member-count=2", "configure-cluster")
	harness.WaitSettled(t, agents, 2, settleTimeout)
	scrape := func(a *harness.Agent) string {
		resp, err := http.Get(a.MetricsURL)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	// A member whose etcd runs is ready, as a Kubernetes probe sees it.
	for _, a := range agents {
		resp, err := http.Get(strings.TrimSuffix(a.MetricsURL, "/metrics") + "/readyz")
		if err != nil {
			t.Fatalf("readyz: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "etcd is running" {
			t.Errorf("readyz of a settled member: %d %q", resp.StatusCode, body)
		}
	}
	// The agent that took the backup before the member was added reports it
	// (leadership may have moved since). Every agent reads the backup
	// figures from the store, so the one that took it is told by its
	// action count.
	var backupMetrics string
	harness.WaitFor(t, 20*time.Second, "the agent that took the backup reporting it in its metrics", func() bool {
		for _, a := range agents {
			m := scrape(a)
			if strings.Contains(m, "\netcd_manager_backup_last_success_timestamp_seconds ") &&
				!hasLine(m, "etcd_manager_backup_last_success_timestamp_seconds 0") &&
				strings.Contains(m, "\netcd_manager_actions_total{action=\"take-backup\",result=\"ok\"}") {
				backupMetrics = m
				return true
			}
		}
		return false
	})
	// The backup is periodic (due as soon as the cluster exists) or taken
	// before the member was added, by its kind; its size and duration are
	// not zero.
	for _, re := range []string{
		`(?m)^etcd_manager_backup_last_size_bytes\{kind="(periodic|pre-change)"\} [1-9]`,
		`(?m)^etcd_manager_backup_last_duration_seconds\{kind="(periodic|pre-change)"\} [0-9.e+-]+$`,
	} {
		if !regexp.MustCompile(re).MatchString(backupMetrics) {
			t.Errorf("metrics lack a line matching %s", re)
		}
	}
	for _, want := range []string{
		"\netcd_manager_actions_total{action=\"take-backup\",result=\"ok\"}",
	} {
		if !strings.Contains(backupMetrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	for _, want := range []string{"etcd_manager_backup_failures_total 0", "etcd_manager_etcd_healthy 1"} {
		if !hasLine(backupMetrics, want) {
			t.Errorf("metrics lack the line %q", want)
		}
	}
	harness.WaitFor(t, 20*time.Second, "exactly one agent reporting itself leader", func() bool {
		leaders := 0
		for _, a := range agents {
			if hasLine(scrape(a), "etcd_manager_leader 1") {
				leaders++
			}
		}
		return leaders == 1
	})

	// Read from the store, every agent reports the newest backup and the
	// restorable point alike; the leader alone reports the members.
	lastRE := regexp.MustCompile(`(?m)^etcd_manager_backup_last_success_timestamp_seconds (\S+)$`)
	pointRE := regexp.MustCompile(`(?m)^etcd_manager_restorable_point_timestamp_seconds (\S+)$`)
	harness.WaitFor(t, 30*time.Second, "every agent to report the store's newest backup", func() bool {
		var lasts, points []string
		for _, a := range agents {
			m := scrape(a)
			if l, p := lastRE.FindStringSubmatch(m), pointRE.FindStringSubmatch(m); l != nil && p != nil {
				lasts, points = append(lasts, l[1]), append(points, p[1])
			}
		}
		return len(lasts) == 2 && lasts[0] == lasts[1] && points[0] == points[1] && points[0] != "0"
	})
	// With continuous capture (on as shipped), the restorable point is
	// when capture saw its last durable revision: a write made after the
	// newest backup moves it past that backup, on every agent.
	time.Sleep(1100 * time.Millisecond) // the metric has a resolution of a second
	written := time.Now()
	c := clusterClient(t, agents)
	put(t, c, "/metrics/after-backup", "v")
	harness.WaitFor(t, 30*time.Second, "every agent's restorable point to reach the write after the backup", func() bool {
		for _, a := range agents {
			m := scrape(a)
			l, p := lastRE.FindStringSubmatch(m), pointRE.FindStringSubmatch(m)
			if l == nil || p == nil {
				return false
			}
			last, err1 := strconv.ParseFloat(l[1], 64)
			point, err2 := strconv.ParseFloat(p[1], 64)
			if err1 != nil || err2 != nil || point <= last || point < float64(written.Unix()) {
				return false
			}
		}
		return true
	})
	voters := 0
	for _, a := range agents {
		m := scrape(a)
		for _, want := range []string{`etcd_manager_certificate_expiry_timestamp_seconds{certificate="node"} `, `etcd_manager_certificate_expiry_timestamp_seconds{certificate="ca"} `, "etcd_manager_loop_cycles_total "} {
			if !strings.Contains(m, "\n"+want) {
				t.Errorf("agent %s: metrics lack %q", a.Name, want)
			}
		}
		if hasLine(m, `etcd_manager_cluster_members{state="voter"} 2`) {
			voters++
		}
	}
	if voters != 1 {
		t.Errorf("%d agents report 2 voters, want the leader alone", voters)
	}
}

// hasLine reports whether text has exactly this line (help text can hold
// the same words).
func hasLine(text, line string) bool {
	return slices.Contains(strings.Split(text, "\n"), line)
}

// Junk in the command queue is marked failed with its reason and kept for
// the operator; the agent neither stops nor crash-loops, and the queue
// goes on.
func TestJunkCommand(t *testing.T) {
	env, agents, _ := startCluster(t, 1, 1, harness.AgentOptions{})
	junk := filepath.Join(env.StoreDir, "control", "2026-01-01T00:00:00Z-000001")
	if err := os.MkdirAll(junk, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(junk, "_command.json"), []byte(`{"timestamp":"1","explode":{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	name := strings.TrimSpace(env.MustCtl("backup-now"))
	if !backupNameRE.MatchString(name) {
		t.Fatalf("backup-now behind a junk command printed %q", name)
	}
	out := env.MustCtl("list-commands")
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "2026-01-01T00:00:00Z-000001 ") {
			line = l
		}
	}
	for _, want := range []string{"failed", "2026-01-01T00:00:00Z-000001/_command.json", "not valid JSON"} {
		if !strings.Contains(line, want) {
			t.Errorf("list-commands line %q lacks %q\n%s", line, want, out)
		}
	}
	if !agents[0].Running() {
		t.Fatal("the agent exited")
	}
	if n := strings.Count(agents[0].Log(), `msg="queued command failed"`); n != 1 {
		t.Errorf("the junk command was failed %d times, want once", n)
	}
	env.MustCtl("delete-command", "2026-01-01T00:00:00Z-000001")
	if out := env.MustCtl("list-commands"); strings.Contains(out, "2026-01-01T00:00:00Z-000001") {
		t.Errorf("deleted command still listed:\n%s", out)
	}
	if _, errOut, err := env.Ctl("delete-command", "2026-01-01T00:00:00Z-000001"); err == nil || !strings.Contains(errOut, "no command 2026-01-01T00:00:00Z-000001") {
		t.Errorf("deleting a missing command: %v, %q", err, errOut)
	}
}

// A queued command is taken up at once, not on the leader's next loop
// tick: etcd-manager-ctl announces the change to the agents through the
// peer API, with a client certificate it makes from the store's CA. The
// agents here cycle every 5 minutes.
func TestQueuedCommandTakenUpAtOnce(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(1, harness.AgentOptions{ExtraArgs: []string{"--loop-interval=5m", "--backup-interval=24h"}})
	harness.WaitSettled(t, agents, 1, 2*time.Minute)
	// The cycles that follow a change (every 250ms, for at most about 10s)
	// are over well before the next tick, 5 minutes after the agent
	// started.
	time.Sleep(12 * time.Second)
	backups := func() int { return strings.Count(agents[0].Log(), `msg="backup taken"`) }
	before := backups()
	name := strings.TrimSpace(env.MustCtl("backup-now", "--timeout=90s"))
	if !backupNameRE.MatchString(name) {
		t.Fatalf("backup-now printed %q", name)
	}
	if got := backups(); got != before+1 {
		t.Fatalf("the agent logged %d backups, want %d", got, before+1)
	}
	// The same for a command queued without waiting: the leader takes
	// the defrag up while its tick is still minutes away.
	id := strings.TrimSpace(env.MustCtl("defrag", "--wait=false"))
	var line string
	harness.WaitFor(t, 90*time.Second, "the defrag command to finish", func() bool {
		out, _, err := env.Ctl("list-commands")
		if err != nil {
			return false
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, id+" ") {
				line = l
			}
		}
		return strings.Contains(line, " done ") || strings.Contains(line, " failed ")
	})
	if !strings.Contains(line, " done ") {
		t.Fatalf("the defrag command did not succeed: %s", line)
	}
}
