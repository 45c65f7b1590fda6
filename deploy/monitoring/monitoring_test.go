// Package monitoring_test checks the alert rules and the dashboard in
// deploy/monitoring with Prometheus's own packages: every rule parses and
// validates, every alert fires on series that should fire it and stays
// quiet on series that should not, and every query of the dashboard
// parses and names metrics the agent exports. It is a module of its own,
// so that the Prometheus server's packages stay out of etcd-manager's.
package monitoring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

var promql = parser.NewParser(parser.Options{})

// alertCases are, for each alert, series (in promqltest's load notation,
// one sample a minute from time 0) that must fire it within 200 minutes,
// and series that must not.
var alertCases = map[string]struct{ fire, quiet string }{
	"EtcdManagerNoRecentBackup": {
		fire:  `etcd_manager_backup_last_success_timestamp_seconds{job="main",instance="a"} 0x200`,
		quiet: `etcd_manager_backup_last_success_timestamp_seconds{job="main",instance="a"} 0+60x200`,
	},
	// The newest backup (at 6000 s) is older than a failure (at 6060 s);
	// quiet: a failure that the next attempt mends.
	"EtcdManagerBackupFailing": {
		fire: `etcd_manager_backup_last_success_timestamp_seconds{job="main",instance="a"} 0x100 6000x100
etcd_manager_backup_last_failure_timestamp_seconds{job="main",instance="b"} 0x100 6060x100`,
		quiet: `etcd_manager_backup_last_success_timestamp_seconds{job="main",instance="a"} 0x100 6000 6000 6120x98
etcd_manager_backup_last_failure_timestamp_seconds{job="main",instance="b"} 0x100 6060x100`,
	},
	"EtcdManagerRestoreDrillFailed": {
		fire: `etcd_manager_restore_drill_last_success_timestamp_seconds{job="main",instance="a"} 60x200
etcd_manager_restore_drill_last_failure_timestamp_seconds{job="main",instance="a"} 0x100 6000x100`,
		quiet: `etcd_manager_restore_drill_last_success_timestamp_seconds{job="main",instance="a"} 60x200
etcd_manager_restore_drill_last_failure_timestamp_seconds{job="main",instance="a"} 0x200`,
	},
	"EtcdManagerRPOHigh": {
		fire: `etcd_manager_restorable_point_timestamp_seconds{job="main",instance="a"} 0x200
etcd_manager_restorable_point_timestamp_seconds{job="main",instance="b"} 0x200`,
		quiet: `etcd_manager_restorable_point_timestamp_seconds{job="main",instance="a"} 0+60x200
etcd_manager_restorable_point_timestamp_seconds{job="main",instance="b"} 0x200`,
	},
	"EtcdManagerCertificateExpiring": {
		// 17 days left: a CA's warning, not a node certificate's (which
		// renews at 30 days left, and warns at 14).
		fire: `etcd_manager_certificate_expiry_timestamp_seconds{job="main",instance="a",certificate="ca"} 1500000x200
etcd_manager_certificate_expiry_timestamp_seconds{job="main",instance="a",certificate="node"} 1000000000x200`,
		quiet: `etcd_manager_certificate_expiry_timestamp_seconds{job="main",instance="a",certificate="ca"} 1000000000x200
etcd_manager_certificate_expiry_timestamp_seconds{job="main",instance="a",certificate="node"} 1500000x200`,
	},
	"EtcdManagerMemberDown": {
		fire: `etcd_manager_cluster_members{job="main",instance="a",state="unhealthy"} 1x200`,
		// A member down for two minutes, less than the rule's five.
		quiet: `etcd_manager_cluster_members{job="main",instance="a",state="unhealthy"} 1x2 0x198`,
	},
	"EtcdManagerNoLeader": {
		fire: `etcd_manager_leader{job="main",instance="a"} 0x200
etcd_manager_leader{job="main",instance="b"} 0x200`,
		quiet: `etcd_manager_leader{job="main",instance="a"} 1x200
etcd_manager_leader{job="main",instance="b"} 0x200`,
	},
	"EtcdManagerNoSpace": {
		fire:  `etcd_manager_alarms{job="main",instance="a",alarm="NOSPACE"} 0x10 1x190`,
		quiet: `etcd_manager_alarms{job="main",instance="a",alarm="NOSPACE"} 0x200`,
	},
	"EtcdManagerCorrupt": {
		fire:  `etcd_manager_alarms{job="main",instance="a",alarm="CORRUPT"} 1x200`,
		quiet: `etcd_manager_alarms{job="main",instance="a",alarm="NOSPACE"} 1x200`,
	},
	"EtcdManagerDataDisagreement": {
		fire:  `etcd_manager_data_corrupt{job="main",instance="a"} 1x200`,
		quiet: `etcd_manager_data_corrupt{job="main",instance="a"} 0x200`,
	},
	"EtcdManagerProcedureStuck": {
		fire:  `etcd_manager_procedure_phase{job="main",instance="a",procedure="restore",phase="restoring"} 1x200`,
		quiet: `etcd_manager_procedure_phase{job="main",instance="a",procedure="restore",phase="restoring"} 1x30 _x170`,
	},
	// Capture stuck at revision 500 while etcd goes on; quiet: an idle
	// cluster (etcd stays at capture's revision), and a busy one whose
	// capture follows.
	"EtcdManagerCaptureBehind": {
		fire: `etcd_manager_etcd_revision{job="main",instance="a"} 500+10x200
etcd_manager_capture_durable_revision{job="main",instance="a"} 500x200
etcd_manager_capture_enabled{job="main",instance="a"} 1x200`,
		quiet: `etcd_manager_etcd_revision{job="main",instance="a"} 500x100 500+10x100
etcd_manager_capture_durable_revision{job="main",instance="a"} 500x100 499+10x100
etcd_manager_capture_enabled{job="main",instance="a"} 1x200
etcd_manager_etcd_revision{job="off",instance="b"} 500+10x200
etcd_manager_capture_durable_revision{job="off",instance="b"} 0x200
etcd_manager_capture_enabled{job="off",instance="b"} 0x200`,
	},
	"EtcdManagerCaptureGap": {
		fire: `etcd_manager_capture_gaps{job="main",instance="a"} 0x100 1x100
etcd_manager_capture_set_aside{job="main",instance="a"} 0x200`,
		quiet: `etcd_manager_capture_gaps{job="main",instance="a"} 0x200
etcd_manager_capture_set_aside{job="main",instance="a"} 0x200`,
	},
	"EtcdManagerCaptureSpoolFull": {
		fire:  `etcd_manager_capture_spool_full{job="main",instance="a"} 0x10 1x190`,
		quiet: `etcd_manager_capture_spool_full{job="main",instance="a"} 0x10 1x2 0x188`,
	},
	"EtcdManagerCompactionOvertookCapture": {
		fire:  `etcd_manager_compaction_overtook_capture_total{job="main",instance="a"} 0x100 1x100`,
		quiet: `etcd_manager_compaction_overtook_capture_total{job="main",instance="a"} 0x200`,
	},
	// A change that keeps failing backs off (5 s doubling to 5 min), so
	// its errors are sparse; the backoff gauge holds while it does.
	"EtcdManagerActionsFailing": {
		fire: `etcd_manager_actions_backing_off{job="main",instance="a"} 0x10 1x190`,
		// One failure that backs off for a while and then succeeds.
		quiet: `etcd_manager_actions_backing_off{job="main",instance="a"} 0x10 1x20 0x170`,
	},
}

func loadRules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	groups, errs := rulefmt.ParseFile("alerts.yaml", false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("alerts.yaml: %v", errs)
	}
	var out []rulefmt.Rule
	for _, g := range groups.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// fires reports whether the alerting rule r fires at some evaluation,
// once a minute, over 200 minutes of series.
func fires(t *testing.T, r rulefmt.Rule, series string) bool {
	t.Helper()
	storage := promqltest.LoadedStorage(t, "load 1m\n"+indent(series))
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, 1_000_000)
	expr, err := promql.ParseExpr(r.Expr)
	if err != nil {
		t.Fatal(err)
	}
	rule := rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), 0, labels.FromMap(r.Labels), labels.FromMap(r.Annotations),
		labels.EmptyLabels(), "", false, slog.New(slog.DiscardHandler))
	query := rules.EngineQueryFunc(engine, storage)
	for m := 0; m <= 200; m++ {
		if _, err := rule.Eval(context.Background(), 0, time.Unix(int64(m)*60, 0), query, nil, 0); err != nil {
			t.Fatalf("%s at %dm: %v", r.Alert, m, err)
		}
		for _, a := range rule.ActiveAlerts() {
			if a.State == rules.StateFiring {
				return true
			}
		}
	}
	return false
}

func indent(s string) string {
	lines := strings.Split(s, "\n")
	for i := range lines {
		lines[i] = "  " + lines[i]
	}
	return strings.Join(lines, "\n")
}

// Every alert fires on its firing series and stays quiet on its quiet
// ones; every alert has a case, and every case an alert.
func TestAlertRules(t *testing.T) {
	rs := loadRules(t)
	var names []string
	for _, r := range rs {
		if r.Alert == "" {
			continue
		}
		names = append(names, r.Alert)
		c, ok := alertCases[r.Alert]
		if !ok {
			t.Errorf("alert %s has no test case", r.Alert)
			continue
		}
		for _, k := range []string{"severity"} {
			if r.Labels[k] == "" {
				t.Errorf("alert %s has no %s label", r.Alert, k)
			}
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("alert %s lacks a summary or a description", r.Alert)
		}
		t.Run(r.Alert, func(t *testing.T) {
			if !fires(t, r, c.fire) {
				t.Errorf("does not fire on:\n%s", c.fire)
			}
			if fires(t, r, c.quiet) {
				t.Errorf("fires on:\n%s", c.quiet)
			}
		})
	}
	for name := range alertCases {
		if !slices.Contains(names, name) {
			t.Errorf("a test case for %s, which alerts.yaml lacks", name)
		}
	}
	if len(names) < 8 {
		t.Errorf("%d alerts, want the issue's eight kinds at least", len(names))
	}
}

// documented are the metric names docs/metrics.md lists, which a test of
// the agent's checks against every metric its code defines.
func documented(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(etcd_manager_[a-z_]+)`").FindAllStringSubmatch(string(data), -1) {
		out = append(out, m[1])
	}
	if len(out) < 30 {
		t.Fatalf("docs/metrics.md lists %d metrics", len(out))
	}
	return out
}

// metricNames are the metric names an expression selects.
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	var out []string
	for _, sel := range parser.ExtractSelectors(e) {
		for _, m := range sel {
			if m.Name == model.MetricNameLabel {
				out = append(out, m.Value)
			}
		}
	}
	return out
}

// query is a PromQL expression of a rule, a panel or a variable.
type query struct{ where, expr string }

// queries are every rule's and every dashboard query's expressions.
func queries(t *testing.T) []query {
	t.Helper()
	var out []query
	for _, r := range loadRules(t) {
		out = append(out, query{"alert " + r.Alert, r.Expr})
	}
	data, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if len(dash.Panels) < 10 {
		t.Errorf("%d panels", len(dash.Panels))
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			// Grafana puts the chosen jobs in $job.
			out = append(out, query{"panel " + p.Title, strings.ReplaceAll(tg.Expr, "$job", ".*")})
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok && strings.HasPrefix(q, "label_values(") {
			metric, _, _ := strings.Cut(strings.TrimPrefix(q, "label_values("), ",")
			out = append(out, query{"variable " + v.Name, metric})
		}
	}
	return out
}

// docs/metrics.md's alert table lists every rule, and only those.
func TestAlertsDocumented(t *testing.T) {
	data, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(EtcdManager[A-Za-z]+)`").FindAllStringSubmatch(string(data), -1) {
		listed = append(listed, m[1])
	}
	var rules []string
	for _, r := range loadRules(t) {
		rules = append(rules, r.Alert)
	}
	slices.Sort(listed)
	slices.Sort(rules)
	if !slices.Equal(listed, rules) {
		t.Errorf("docs/metrics.md lists the alerts %v, alerts.yaml has %v", listed, rules)
	}
}

// Every rule and every dashboard query parses, and names only metrics
// docs/metrics.md lists.
func TestDashboardAndRulesUseExportedMetrics(t *testing.T) {
	known := documented(t)
	for _, q := range queries(t) {
		names := metricNames(t, q.expr)
		if len(names) == 0 {
			t.Errorf("%s: %q selects no metric", q.where, q.expr)
		}
		for _, n := range names {
			if !slices.Contains(known, n) {
				t.Errorf("%s: %q uses %s, which docs/metrics.md does not list", q.where, q.expr, n)
			}
		}
	}
}

// eventOnly are metrics the rules or the dashboard use that an agent
// serves only while what they count happens: a vector with no series yet
// has no lines in a scrape.
var eventOnly = map[string]string{
	"etcd_manager_procedure_phase": "a series while a restore, recovery, roll or defragmentation runs",
}

// A managed cluster's agent (one member, real etcd, TLS as shipped, one
// backup taken) serves every metric the rules and the dashboard use, but
// for those listed in eventOnly, and only metrics docs/metrics.md lists.
func TestScrapeOfAManagedCluster(t *testing.T) {
	dir := t.TempDir()
	for _, cmd := range []string{"etcd-manager", "etcd-manager-ctl"} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, cmd), "./cmd/"+cmd)
		build.Dir = "../.."
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", cmd, err, out)
		}
	}
	binDir, err := filepath.Abs("../../bin")
	if err != nil {
		t.Fatal(err)
	}
	const etcdVersion = "3.6.16"
	if _, err := os.Stat(filepath.Join(binDir, "etcd-v"+etcdVersion, "etcd")); err != nil {
		t.Fatalf("real etcd %s is required (run make tools): %v", etcdVersion, err)
	}
	// Loopback addresses of the test's own, with free ports.
	const ip = "127.77.0.1"
	port := func() int {
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	store := "file://" + filepath.Join(dir, "store")
	ctl := exec.Command(filepath.Join(dir, "etcd-manager-ctl"), "--backup-store="+store, "--member-count=1",
		"--etcd-version="+etcdVersion, "configure-cluster")
	if out, err := ctl.CombinedOutput(); err != nil {
		t.Fatalf("configure-cluster: %v\n%s", err, out)
	}
	metricsAddr := fmt.Sprintf("%s:%d", ip, port())
	agent := exec.Command(filepath.Join(dir, "etcd-manager"), "--cluster-name=monitoring", "--backup-store="+store,
		"--data-dir="+filepath.Join(dir, "data"), "--address="+ip, "--etcd-address="+ip,
		fmt.Sprintf("--peer-port=%d", port()),
		fmt.Sprintf("--client-urls=https://%s:%d", ip, port()),
		fmt.Sprintf("--quarantine-client-urls=https://%s:%d", ip, port()),
		fmt.Sprintf("--peer-urls=https://%s:%d", ip, port()),
		"--metrics-address="+metricsAddr, "--etcd-bin-dir="+binDir)
	var logs strings.Builder
	agent.Stdout, agent.Stderr = &logs, &logs
	agent.SysProcAttr = agentProcAttr()
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = agent.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = agent.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = agent.Process.Kill()
			<-done
		}
	})
	// Until the agent leads a cluster whose first backup is in the store.
	ready := regexp.MustCompile(`(?m)^etcd_manager_backup_last_success_timestamp_seconds [1-9]`)
	var body string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err == nil {
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(data)
			if strings.Contains(body, "\netcd_manager_leader 1") && ready.MatchString(body) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not lead a backed-up cluster in 2 minutes: %v\nscrape:\n%s\nlog:\n%s", err, body, logs.String())
		}
		time.Sleep(500 * time.Millisecond)
	}

	known := documented(t)
	served := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^(etcd_manager_[a-z_]+?)(?:_bucket|_sum|_count)?(?:\{[^}]*\})? `).FindAllStringSubmatch(body, -1) {
		served[m[1]] = true
	}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (etcd_manager_[a-z_]+) `).FindAllStringSubmatch(body, -1) {
		if !slices.Contains(known, m[1]) {
			t.Errorf("the agent serves %s, which docs/metrics.md does not list", m[1])
		}
	}
	for _, q := range queries(t) {
		for _, n := range metricNames(t, q.expr) {
			_, later := eventOnly[n]
			if !served[n] && !later {
				t.Errorf("%s: %q uses %s, which a managed cluster's agent does not serve", q.where, q.expr, n)
			}
			if served[n] && later {
				t.Errorf("%s is served already, though eventOnly says it is served only once what it counts happens", n)
			}
		}
	}
	t.Logf("the scrape has %d etcd_manager metrics with series", len(served))
}
