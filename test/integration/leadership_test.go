package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// raceRounds is how often the single-cluster race repeats.
const raceRounds = 20

// Five agents started at the same moment with a member count of 3 always
// end with exactly one cluster of 3 members.
func TestSingleClusterRace(t *testing.T) {
	for round := range raceRounds {
		t.Run(fmt.Sprintf("round=%d", round), func(t *testing.T) {
			_, agents, cs := startCluster(t, 3, 5, harness.AgentOptions{})
			// Every agent that ever started etcd did so for the same cluster:
			// one token across all data dirs.
			tokens := map[string]bool{}
			for _, a := range agents {
				entries, _ := os.ReadDir(filepath.Join(a.DataDir, "data"))
				for _, e := range entries {
					tokens[e.Name()] = true
				}
			}
			if len(tokens) != 1 || len(cs.ClusterIDs) != 1 {
				t.Fatalf("%d tokens %v and cluster IDs %v; want exactly one cluster", len(tokens), tokens, cs.ClusterIDs)
			}
			if n := strings.Count(allLogs(agents), "msg=\"cluster created\""); n != 1 {
				t.Errorf("%d creations succeeded, want 1", n)
			}
		})
	}
}

// memberIDs lists the member IDs through any agent's etcd.
func memberIDs(t *testing.T, agents []*harness.Agent) string {
	t.Helper()
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.MemberList(ctx)
	if err != nil {
		t.Fatalf("member list: %v", err)
	}
	var ids []string
	for _, m := range resp.Members {
		ids = append(ids, fmt.Sprintf("%x", m.ID))
	}
	sort.Strings(ids)
	return strings.Join(ids, ",")
}

// Agents cut apart on the peer API never form a second cluster and never
// change membership on a partial view.
func TestPeerAPIPartition(t *testing.T) {
	names := []string{"1", "2", "3", "4"}

	t.Run("cold-start", func(t *testing.T) {
		env := harness.NewEnv(t)
		mesh := harness.NewMesh(t, names)
		env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
		// 1 and 2 are cut off from the others and from each other, so no
		// side sees 3 agents: nothing may be created.
		mesh.Isolate("1")
		mesh.Isolate("2")
		var agents []*harness.Agent
		for _, n := range names {
			agents = append(agents, env.StartAgent(n, mesh.Options(n)))
		}
		deadline := time.Now().Add(8 * time.Second)
		for time.Now().Before(deadline) {
			for _, a := range agents {
				if a.EtcdPID() != 0 {
					t.Fatalf("agent %s started etcd without a quorum of agents in view", a.Name)
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		if _, err := os.Stat(filepath.Join(env.StoreDir, "control", "etcd-cluster-created")); err == nil {
			t.Fatal("a cluster was created during the partition")
		}
		mesh.Heal("1")
		mesh.Heal("2")
		cs := harness.WaitSettled(t, agents, 3, settleTimeout)
		if len(cs.ClusterIDs) != 1 {
			t.Fatalf("cluster IDs %v", cs.ClusterIDs)
		}
	})

	t.Run("running-cluster", func(t *testing.T) {
		env := harness.NewEnv(t)
		mesh := harness.NewMesh(t, names)
		env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
		var agents []*harness.Agent
		for _, n := range names {
			agents = append(agents, env.StartAgent(n, mesh.Options(n)))
		}
		harness.WaitSettled(t, agents, 3, settleTimeout)
		c := clusterClient(t, agents)
		put(t, c, "/p/before", "v")
		before := memberIDs(t, agents)
		logBefore := map[*harness.Agent]int{}
		for _, a := range agents {
			logBefore[a] = len(a.Log())
		}

		// Cut each agent off in turn, members and the standby alike, while
		// etcd itself stays connected.
		for _, n := range names {
			mesh.Isolate(n)
			deadline := time.Now().Add(4 * time.Second)
			for time.Now().Before(deadline) {
				cs := harness.Observe(agents)
				if len(cs.ClusterIDs) > 1 {
					t.Fatalf("a second cluster appeared while %s was cut off: %v", n, cs.ClusterIDs)
				}
				time.Sleep(250 * time.Millisecond)
			}
			if got := memberIDs(t, agents); got != before {
				t.Fatalf("membership changed while agent %s was cut off: %s -> %s", n, before, got)
			}
			mesh.Heal(n)
		}
		var logs string
		for _, a := range agents {
			logs += a.Log()[logBefore[a]:]
		}
		for _, bad := range []string{"member removed", "member added", "evict-node", "cluster created"} {
			if strings.Contains(logs, bad) {
				t.Errorf("a partial view led to %q", bad)
			}
		}
		put(t, c, "/p/after", "v")
		if got := get(t, c, "/p/before"); got != "v" {
			t.Errorf("got %q", got)
		}
	})
}
