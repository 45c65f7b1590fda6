// Package bench measures etcd-manager against baselines taken in the same
// run, on real etcd with data on real disk, and reports ratios because
// these machines are noisy.
//
// make bench runs it at full scale and writes bench/results/latest.json;
// make test runs it at BENCH_SCALE=small to keep the harness working.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// Result is one line of bench/results/latest.json.
type Result struct {
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Baseline float64 `json:"baseline"`
	Ratio    float64 `json:"ratio"`
	Note     string  `json:"note"`
	Skipped  bool    `json:"skipped,omitempty"`
	Reason   string  `json:"reason,omitempty"`
}

type scale struct {
	name       string
	iterations int
}

func currentScale(t *testing.T) scale {
	switch s := os.Getenv("BENCH_SCALE"); s {
	case "", "small":
		return scale{name: "small", iterations: 1}
	case "full":
		return scale{name: "full", iterations: 5}
	default:
		t.Fatalf("BENCH_SCALE=%q: use small or full", s)
		return scale{}
	}
}

func TestBench(t *testing.T) {
	sc := currentScale(t)
	var results []Result
	results = append(results, benchBootstrap(t, sc))
	results = append(results, benchReplaceMember(t, sc))
	for _, name := range []string{"backup-file-1gib", "backup-s3-1gib", "agent-backup-peak-rss"} {
		results = append(results, Result{Name: name, Skipped: true, Reason: "backups are not built yet (issue: backups)"})
	}
	results = append(results,
		Result{Name: "restore-1gib", Skipped: true, Reason: "restore is not built yet (issue: restore)"},
		Result{Name: "rolling-upgrade", Skipped: true, Reason: "version changes are not built yet (issue: version changes)"},
		Result{Name: "agent-idle-rss", Skipped: true, Reason: "not measured yet (issue: benchmarks)"},
		Result{Name: "agent-idle-cpu", Skipped: true, Reason: "not measured yet (issue: benchmarks)"},
	)
	for _, r := range results {
		if !r.Skipped && (r.Value <= 0 || r.Baseline <= 0 || math.IsNaN(r.Ratio)) {
			t.Errorf("%s: measured nothing: %+v", r.Name, r)
		}
	}

	out := filepath.Join(t.TempDir(), "latest.json")
	if sc.name == "full" {
		out = filepath.Join("results", "latest.json")
	}
	data, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	table := markdown(results, sc)
	fmt.Println(table)
	if sc.name == "full" {
		if err := os.WriteFile(filepath.Join("results", "latest.md"), []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func markdown(rs []Result, sc scale) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "scale %s (%d iteration(s), median), %s, on %s\n\n", sc.name, sc.iterations, time.Now().UTC().Format("2006-01-02"), machine(host))
	b.WriteString("| name | value | baseline | ratio | note |\n|---|---|---|---|---|\n")
	for _, r := range rs {
		if r.Skipped {
			fmt.Fprintf(&b, "| %s | skipped | | | %s |\n", r.Name, r.Reason)
			continue
		}
		fmt.Fprintf(&b, "| %s | %.2f %s | %.2f %s | %.2f× | %s |\n", r.Name, r.Value, r.Unit, r.Baseline, r.Unit, r.Ratio, r.Note)
	}
	return b.String()
}

func machine(host string) string {
	cpu := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d cores", cpu, runtime.NumCPU())
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// untilWritable retries a put through endpoints until one succeeds.
func untilWritable(t *testing.T, endpoints []string, timeout time.Duration) {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := c.Put(ctx, "/bench/probe", "x")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not writable within %s: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// benchBootstrap: 3 agents started cold until the cluster is writable,
// against starting the same three etcd by hand.
func benchBootstrap(t *testing.T, sc scale) Result {
	var got, base []float64
	for range sc.iterations {
		t.Run("bootstrap-3", func(t *testing.T) {
			env := harness.NewEnv(t)
			start := time.Now()
			bare := env.StartBareCluster(3)
			untilWritable(t, harness.BareEndpoints(bare), time.Minute)
			base = append(base, time.Since(start).Seconds())

			env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
			start = time.Now()
			agents := env.StartAgents(3, harness.AgentOptions{Defaults: true})
			untilWritable(t, harness.Endpoints(agents), 2*time.Minute)
			got = append(got, time.Since(start).Seconds())
		})
	}
	v, b := median(got), median(base)
	return Result{Name: "bootstrap-3", Value: v, Unit: "s", Baseline: b, Ratio: v / b,
		Note: "3 agents started cold until a write succeeds, default loop interval; baseline: 3 bare etcd started by hand"}
}

// benchReplaceMember: a wiped member, until 3 healthy voters again, with a
// grace of 0, against one etcd leader election measured in the same run.
func benchReplaceMember(t *testing.T, sc scale) Result {
	var got, base []float64
	for range sc.iterations {
		t.Run("replace-member", func(t *testing.T) {
			env := harness.NewEnv(t)
			bare := env.StartBareCluster(3)
			untilWritable(t, harness.BareEndpoints(bare), time.Minute)
			leader := bareLeader(t, bare)
			start := time.Now()
			leader.Kill()
			var rest []*harness.BareEtcd
			for _, m := range bare {
				if m != leader {
					rest = append(rest, m)
				}
			}
			untilWritable(t, harness.BareEndpoints(rest), time.Minute)
			base = append(base, time.Since(start).Seconds())

			env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
			agents := env.StartAgents(3, harness.AgentOptions{Defaults: true, ExtraArgs: []string{"--member-failure-grace=0s"}})
			harness.WaitSettled(t, agents, 3, 2*time.Minute)
			victim := agents[2]
			victim.Kill()
			if err := os.RemoveAll(victim.DataDir); err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			victim.Start()
			harness.WaitSettled(t, agents, 3, 2*time.Minute)
			got = append(got, time.Since(start).Seconds())
		})
	}
	v, b := median(got), median(base)
	return Result{Name: "replace-member", Value: v, Unit: "s", Baseline: b, Ratio: v / b,
		Note: "a member's data dir wiped and its agent restarted, until 3 healthy voters; grace 0, default loop interval; baseline: one etcd leader election (kill the leader until a write succeeds)"}
}

func bareLeader(t *testing.T, ms []*harness.BareEtcd) *harness.BareEtcd {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: harness.BareEndpoints(ms), DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, m := range ms {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := c.Status(ctx, m.ClientURL)
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return m
		}
	}
	t.Fatal(errors.New("no bare etcd leader"))
	return nil
}
