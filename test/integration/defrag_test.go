package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// dbSizes are the database sizes each agent's etcd reports.
func dbSizes(t *testing.T, agents []*harness.Agent) []int64 {
	t.Helper()
	c := clusterClient(t, agents)
	var out []int64
	for _, a := range agents {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		st, err := c.Status(ctx, a.ClientURL)
		cancel()
		if err != nil {
			out = append(out, -1)
			continue
		}
		out = append(out, st.DbSize)
	}
	return out
}

// TestDefrag: a cluster whose databases are mostly free pages is
// defragmented by the spec's policy, one member at a time, the leader's
// own member after leadership is handed on, under a writer that loses
// nothing; then etcd-manager-ctl defrag does every member on demand,
// with the policy off.
func TestDefrag(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "--auto-defrag=false", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{Metrics: true})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// 24 MiB written, deleted and compacted away: free pages.
	value := strings.Repeat("x", 64<<10)
	for i := range 384 {
		if _, err := c.Put(ctx, fmt.Sprintf("/defrag/%d", i), value); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := c.Delete(ctx, "/defrag/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	before := dbSizes(t, agents)
	for i, s := range before {
		if s < 20<<20 {
			t.Fatalf("%s's database is %d bytes after writing 24 MiB", agents[i].Name, s)
		}
	}
	// Handing leadership on drops the proposals in flight ("raft proposal
	// dropped"); the writer tries those once more, as clients do.
	w := startWriterRetrying(t, agents, 20000, true)
	w.waitAcked(t, 20)

	env.MustCtl("--auto-defrag=true", "--defrag-min-reclaimable-bytes=4194304", "--defrag-min-reclaimable-fraction=0.3", "configure-cluster")
	harness.WaitFor(t, 3*time.Minute, "every member to be defragmented by the policy", func() bool {
		for _, s := range dbSizes(t, agents) {
			if s < 0 || s > 8<<20 {
				return false
			}
		}
		return true
	})
	t.Logf("database sizes %v before, %v after", before, dbSizes(t, agents))
	logs := allLogs(agents)
	if n := strings.Count(logs, `msg="member defragmented"`); n != 3 {
		t.Errorf("%d members defragmented, want 3", n)
	}
	// Three voters: each member is defragmented isolated, serving only
	// its quarantine client URL, so that its clients go to the others.
	if n := strings.Count(logs, `msg="etcd defragmented, and serves its clients again"`); n != 3 {
		t.Errorf("%d members defragmented isolated, want 3", n)
	}
	if !strings.Contains(logs, "before defragmenting the leader's member") {
		t.Error("leadership was not handed on before the leader's member was defragmented")
	}
	harness.WaitFor(t, time.Minute, "a leader's metrics to count the defragmentations", func() bool {
		total := 0
		for _, a := range agents {
			for _, line := range strings.Split(scrape(t, a.MetricsURL), "\n") {
				var n int
				if _, err := fmt.Sscanf(line, `etcd_manager_defrags_total{result="success"} %d`, &n); err == nil {
					total += n
				}
			}
		}
		return total == 3
	})

	// On demand, with the policy off: every member, and the command says
	// which.
	env.MustCtl("--auto-defrag=false", "configure-cluster")
	out := env.MustCtl("defrag", "--timeout=3m")
	for _, a := range agents {
		if !strings.Contains(out, "defragmented "+a.NodeID()) {
			t.Errorf("defrag printed %q; it lacks %s", out, a.NodeID())
		}
	}
	if out := env.MustCtl("list-commands"); !strings.Contains(out, "defrag") || !strings.Contains(out, "done") {
		t.Errorf("list-commands does not show the defrag done:\n%s", out)
	}
	// The leader did the last member, after handing leadership to it.
	harness.WaitFor(t, 30*time.Second, "status to show the last defragmentation", func() bool {
		out, _, err := env.Ctl("status")
		return err == nil && strings.Contains(out, "last defragmentation: ")
	})
	w.check(t, c)
	// The writer's client fails over from a member whose gRPC service
	// stops for its defragmentation.
	if w.failed > 0 {
		t.Errorf("%d writes failed twice during the defragmentations (first: %v)", w.failed, w.firstErr)
	}
}
