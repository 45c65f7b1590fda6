package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// A member whose data dir is wiped is removed and re-added with fresh
// data, by itself, keeping every key.
func TestWipedMemberRejoins(t *testing.T) {
	for _, whole := range []bool{false, true} {
		name := "etcd-data-only"
		if whole {
			name = "whole-data-dir"
		}
		t.Run(name, func(t *testing.T) {
			_, agents, before := startCluster(t, 3, 3, harness.AgentOptions{})
			c := clusterClient(t, agents)
			put(t, c, "/wipe/before", "kept")

			// Wipe a member that is not the raft leader's agent.
			victim := agents[2]
			victim.Kill()
			if whole {
				if err := os.RemoveAll(victim.DataDir); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := os.RemoveAll(filepath.Join(victim.DataDir, "data")); err != nil {
					t.Fatal(err)
				}
			}
			victim.Start()
			after := harness.WaitSettled(t, agents, 3, settleTimeout)
			if fmt.Sprint(keys(after.ClusterIDs)) != fmt.Sprint(keys(before.ClusterIDs)) {
				t.Errorf("cluster ID changed: %v -> %v", keys(before.ClusterIDs), keys(after.ClusterIDs))
			}
			if !strings.Contains(allLogs(agents), "member removed") {
				t.Error("no member was removed")
			}
			put(t, c, "/wipe/after", "new")
			if got := get(t, c, "/wipe/before"); got != "kept" {
				t.Errorf("got %q", got)
			}
		})
	}
}

// A node that is gone past the grace period is replaced by a standby.
func TestDeadNodeReplacedByStandby(t *testing.T) {
	_, agents, _ := startCluster(t, 3, 4, harness.AgentOptions{ExtraArgs: []string{"--member-failure-grace=3s"}})
	c := clusterClient(t, agents)
	put(t, c, "/dead/before", "kept")

	var victim *harness.Agent
	for _, a := range agents {
		if a.EtcdPID() != 0 && !strings.Contains(a.Log(), "member added") && !strings.Contains(a.Log(), "creating cluster") {
			victim = a
			break
		}
	}
	if victim == nil {
		t.Fatal("no non-leader member found")
	}
	victim.Kill()
	var rest []*harness.Agent
	for _, a := range agents {
		if a != victim {
			rest = append(rest, a)
		}
	}
	harness.WaitSettled(t, rest, 3, settleTimeout)
	if got := get(t, c, "/dead/before"); got != "kept" {
		t.Errorf("got %q", got)
	}
	if !strings.Contains(allLogs(rest), "unhealthy for") {
		t.Error("the dead member was not removed for being unhealthy")
	}
}

// The total-loss guard holds for a multi-member cluster too.
func TestTotalLossGuardMultiMember(t *testing.T) {
	_, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{})
	put(t, clusterClient(t, agents), "/k", "v")
	for _, a := range agents {
		a.Stop()
		if err := os.RemoveAll(a.DataDir); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range agents {
		a.Start()
	}
	harness.WaitFor(t, settleTimeout, "the total-loss report", func() bool {
		return strings.Contains(allLogs(agents), plan.MsgNoMembers)
	})
	time.Sleep(2 * time.Second)
	for _, a := range agents {
		if a.EtcdPID() != 0 {
			t.Errorf("agent %s started etcd over lost data", a.Name)
		}
	}
}

func keys[K comparable, V any](m map[K]V) []K {
	var out []K
	for k := range m {
		out = append(out, k)
	}
	return out
}

func allLogs(agents []*harness.Agent) string {
	var b strings.Builder
	for _, a := range agents {
		b.WriteString(a.Log())
	}
	return b.String()
}

// A wiped member is replaced as soon as its restarted agent announces
// itself, not on the leader's next tick: with a loop interval of a
// minute, each of three replacements must be done in well under one.
// The restarted agent announces only once the info it serves says what
// it is; told before, the leader could read nothing yet and wait for its
// tick, as it did in about one replacement in four.
func TestWipedMemberReplacedOnAnnouncement(t *testing.T) {
	const loopInterval = time.Minute
	_, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{ExtraArgs: []string{"--loop-interval=" + loopInterval.String(), "--member-failure-grace=0s"}})
	for round := range 3 {
		// etcd takes a member change only once every voter has been
		// connected to its leader for 5s.
		time.Sleep(6 * time.Second)
		var victim *harness.Agent
		for _, a := range agents {
			if !a.Leads() {
				victim = a
			}
		}
		if victim == nil {
			t.Fatal("no agent follows the raft leader")
		}
		victim.Kill()
		if err := os.RemoveAll(victim.DataDir); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		victim.Start()
		harness.WaitSettled(t, agents, 3, loopInterval/2)
		t.Logf("round %d: %s replaced in %s", round, victim.Name, time.Since(start).Round(time.Millisecond))
	}
}
