package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// The data-safety cases: each was reproduced on the code before its fix
// (see the commit that fixed it), and is kept here.

// memberStatus asks one agent's etcd for its status; ok is false when it
// does not answer.
func memberStatus(a *harness.Agent) (*clientv3.StatusResponse, bool) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL}, TLS: a.TLS(), DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, false
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := c.Status(ctx, a.ClientURL)
	return st, err == nil
}

// follower returns a member agent whose etcd is not the raft leader.
func follower(t *testing.T, agents []*harness.Agent) *harness.Agent {
	t.Helper()
	var out *harness.Agent
	harness.WaitFor(t, 30*time.Second, "a follower", func() bool {
		for _, a := range agents {
			if st, ok := memberStatus(a); ok && st.Leader != 0 && st.Leader != st.Header.MemberId {
				out = a
				return true
			}
		}
		return false
	})
	return out
}

// One member is dead and the only standby has no etcd binary. The leader
// must not remove the member for a standby that cannot join, and a
// backup-now must still be served. Before the fix, add-member failed
// every cycle and the backup-now was never served.
func TestFailingStepDoesNotStarveLoop(t *testing.T) {
	opts := harness.AgentOptions{ExtraArgs: []string{"--member-failure-grace=2s"}}
	env, agents, _ := startCluster(t, 3, 3, opts)
	put(t, clusterClient(t, agents), "/starve/before", "v")
	noEtcd := filepath.Join(t.TempDir(), "no-etcd")
	if err := os.MkdirAll(noEtcd, 0o755); err != nil {
		t.Fatal(err)
	}
	standby := env.StartAgent("standby", harness.AgentOptions{ExtraArgs: append(opts.ExtraArgs, "--etcd-bin-dir="+noEtcd)})
	harness.WaitFor(t, 30*time.Second, "status to list the standby", func() bool {
		out, _, err := env.Ctl("status")
		return err == nil && strings.Contains(out, "standby")
	})
	victim := follower(t, agents)
	victim.Kill()
	time.Sleep(5 * time.Second) // past the grace period
	out, errOut, err := env.Ctl("backup-now", "--timeout=60s")
	if err != nil {
		t.Fatalf("backup-now was not served with a dead member and an unfit standby: %v\n%s\n%s", err, out, errOut)
	}
	if strings.Contains(standby.Log(), "joining cluster") {
		t.Error("the standby without an etcd binary was told to join")
	}
	var rest []*harness.Agent
	for _, a := range agents {
		if a != victim {
			rest = append(rest, a)
		}
	}
	if cs := harness.Observe(rest); len(cs.Voters) != 3 {
		t.Errorf("the dead member was removed with no standby able to replace it: %+v", cs)
	}
	if !strings.Contains(allLogs(rest), "no standby agent has the etcd binaries") && !strings.Contains(allLogs(rest), "keeps failing") {
		// The member count is at the spec's, so the leader need not say
		// anything about the standby; it must not have tried it either.
		if strings.Contains(allLogs(rest), "add-member") {
			t.Error("the leader tried to add the unfit standby")
		}
	}
}

// A member's data dir is deleted while its agent runs, then its etcd is
// killed. etcd must never be started again as the old member on the
// empty dir: the node comes back as a new member (a new member ID), the
// cluster heals, and no acknowledged write is lost. Before the fix, the
// agent restarted etcd on the empty dir forever (etcd 3.6 panics:
// "tocommit(N) is out of range [lastIndex(0)]").
func TestDataLostUnderRunningAgent(t *testing.T) {
	_, agents, before := startCluster(t, 3, 3, harness.AgentOptions{ExtraArgs: []string{"--member-failure-grace=3s"}})
	w := startWriter(t, agents, 1_000_000)
	w.waitAcked(t, 50)
	victim := follower(t, agents)
	st, ok := memberStatus(victim)
	if !ok {
		t.Fatal("the victim's etcd does not answer")
	}
	oldID := st.Header.MemberId
	if err := os.RemoveAll(filepath.Join(victim.DataDir, "data")); err != nil {
		t.Fatal(err)
	}
	if pid := victim.EtcdPID(); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	harness.WaitFor(t, settleTimeout, "the wiped node back as a new member, in a healed cluster", func() bool {
		st, ok := memberStatus(victim)
		return ok && st.Header.MemberId != oldID && harness.Observe(agents).Settled(3)
	})
	w.waitAcked(t, w.ackedCount()+20)
	w.check(t, clusterClient(t, agents))
	after := harness.Observe(agents)
	if len(after.ClusterIDs) != 1 || keys(after.ClusterIDs)[0] != keys(before.ClusterIDs)[0] {
		t.Errorf("cluster IDs %v, want one, the same as before (%v)", keys(after.ClusterIDs), keys(before.ClusterIDs))
	}
	if strings.Contains(victim.Log(), "is out of range") {
		t.Error("etcd was started on the empty data dir as the old member")
	}
}

// pausedAgent waits for the agent that paused itself at a claimed pause
// point (testhook.PauseEnv) and returns it.
func pausedAgent(t *testing.T, agents []*harness.Agent, claim string) *harness.Agent {
	t.Helper()
	var p *harness.Agent
	harness.WaitFor(t, 3*time.Minute, "an agent to pause at the test hook", func() bool {
		b, err := os.ReadFile(claim)
		if err != nil {
			return false
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		for _, a := range agents {
			if a.Running() && a.PID() == pid && a.Paused() {
				p = a
				return true
			}
		}
		return false
	})
	return p
}

// lockHolder is the node ID holding the store lock's newest term, and
// that term.
func lockHolder(t *testing.T, env *harness.Env) (string, int64) {
	t.Helper()
	s, err := store.Open(t.Context(), env.StoreURL, store.Options{})
	if err != nil {
		return "", 0
	}
	defer s.Close()
	keys, err := s.List(t.Context(), "control/leader/", "")
	if err != nil || len(keys) == 0 {
		return "", 0
	}
	slices.Sort(keys)
	data, err := s.Read(t.Context(), keys[len(keys)-1])
	if err != nil {
		return "", 0
	}
	var rec struct {
		NodeID string `json:"nodeId"`
		Term   int64  `json:"term"`
	}
	_ = json.Unmarshal(data, &rec)
	return rec.NodeID, rec.Term
}

// takeOver waits until an agent other than p holds the store lock, lets
// it work for a while, then resumes p, whose late steps must change
// nothing. The while is longer than a record stays fresh (a lease and
// half of one: 3 s in these tests), so the new driver sees p's record go
// stale: p is then neither reachable nor fresh, only paused.
func takeOver(t *testing.T, env *harness.Env, p *harness.Agent) {
	t.Helper()
	harness.WaitFor(t, 2*time.Minute, "another agent to take the store lock from the paused one", func() bool {
		holder, _ := lockHolder(t, env)
		return holder != "" && holder != p.NodeID()
	})
	time.Sleep(6 * time.Second)
	p.Continue()
}

// waitCommandsDone waits until the queue holds no command of kind.
func waitCommandsDone(t *testing.T, env *harness.Env, kind string) {
	t.Helper()
	harness.WaitFor(t, 4*time.Minute, "the "+kind+" command to complete", func() bool {
		out, _, err := env.Ctl("list-commands")
		return err == nil && !strings.Contains(out, kind)
	})
}

// stableOneCluster checks, for a few seconds, that the agents run one
// settled cluster of n members whose ID does not change.
func stableOneCluster(t *testing.T, agents []*harness.Agent, n int) {
	t.Helper()
	cs := harness.WaitSettled(t, agents, n, settleTimeout)
	want := keys(cs.ClusterIDs)
	for range 5 {
		time.Sleep(time.Second)
		now := harness.Observe(agents)
		if len(now.ClusterIDs) != 1 || keys(now.ClusterIDs)[0] != want[0] {
			t.Fatalf("the cluster changed after the procedure: %v, then %v", cs.ClusterIDs, now.ClusterIDs)
		}
	}
}

// The agent driving a restore pauses (SIGSTOP) in each phase for longer
// than its lease; another agent takes over; then the paused one resumes.
// Exactly one cluster results, holding the backup's data, and the paused
// agent's late steps change nothing.
func TestPausedRestoreDriver(t *testing.T) {
	for _, point := range []string{"prepare", "stopping", "restoring", "verifying", "backing-up", "lifting"} {
		t.Run(point, func(t *testing.T) {
			env := harness.NewEnv(t)
			claim := filepath.Join(env.Root, "paused")
			env.ExtraEnv = append(env.ExtraEnv, testhook.PauseEnv+"=procedure-restore-"+point+"@"+claim)
			env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
			agents := env.StartAgents(4, harness.AgentOptions{})
			harness.WaitSettled(t, agents, 3, settleTimeout)
			c := clusterClient(t, agents)
			put(t, c, "/p/in-backup", "v")
			name := strings.TrimSpace(env.MustCtl("backup-now"))
			put(t, c, "/p/after-backup", "rolled back by the restore")
			env.MustCtl("restore-backup", name, "--wait=false")

			p := pausedAgent(t, agents, claim)
			takeOver(t, env, p)
			waitCommandsDone(t, env, "restore-backup")
			stableOneCluster(t, agents, 3)
			c2 := clusterClient(t, agents)
			if got := get(t, c2, "/p/in-backup"); got != "v" {
				t.Errorf("/p/in-backup = %q after the restore", got)
			}
			if n := count(t, c2, "/p/after-backup"); n != 0 {
				t.Errorf("a write made after the backup survived the restore")
			}
			if !strings.Contains(p.Log(), "test hook: resumed") {
				t.Error("the paused agent never resumed")
			}
		})
	}
}

// The agent driving a recover-quorum pauses before it chooses the
// survivor, and after it recorded the choice; another agent takes over;
// then the paused one resumes. One cluster results, holding every write
// the survivor had. The driver is the survivor itself (then the new
// driver reaches no node with data while the survivor is paused, and must
// wait for it rather than fail the command), or a standby.
func TestPausedRecoverDriver(t *testing.T) {
	for _, driver := range []string{"survivor", "standby"} {
		for _, point := range []string{"prepare", "recorded-forcing"} {
			t.Run(driver+"/"+point, func(t *testing.T) {
				env := harness.NewEnv(t)
				claim := filepath.Join(env.Root, "paused")
				env.ExtraEnv = append(env.ExtraEnv, testhook.PauseEnv+"=procedure-recover-quorum-"+point+"@"+claim)
				env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
				agents := env.StartAgents(3, harness.AgentOptions{})
				harness.WaitSettled(t, agents, 3, settleTimeout)
				c := clusterClient(t, agents)
				put(t, c, "/q/before-backup", "v")
				env.MustCtl("backup-now")
				put(t, c, "/q/after-backup", "survives")

				survivor, lost := agents[0], agents[1:]
				killAndWipe(t, lost)
				harness.WaitFor(t, 30*time.Second, "the survivor's etcd to see no leader", func() bool {
					st, ok := memberStatus(survivor)
					return ok && st.Leader == 0
				})
				waitHolder := func(what string, ok func(holder string) bool) {
					harness.WaitFor(t, time.Minute, what, func() bool {
						holder, _ := lockHolder(t, env)
						return ok(holder)
					})
				}
				// The command only gets queued (the driver pauses); the
				// store lock goes to an agent once it is. The wiped nodes
				// come back as standbys: the evidence that they serve no
				// cluster, and the other drivers.
				switch driver {
				case "survivor":
					_, _, _ = env.Ctl("recover-quorum", "--timeout=1s")
					waitHolder("the survivor to hold the store lock", func(h string) bool { return h == survivor.NodeID() })
					for _, a := range lost {
						a.Start()
					}
				case "standby":
					survivor.Pause()
					for _, a := range lost {
						a.Start()
					}
					_, _, _ = env.Ctl("recover-quorum", "--timeout=1s")
					// One of the restarted standbys, by its new ID: the
					// newest term may still be the creator's, from before.
					waitHolder("a standby to hold the store lock", func(h string) bool {
						return h != "" && (h == lost[0].NodeID() || h == lost[1].NodeID())
					})
					survivor.Continue()
				}
				p := pausedAgent(t, agents, claim)
				if (p == survivor) != (driver == "survivor") {
					t.Fatalf("agent %s paused as the driver, not the %s: the test did not exercise its case", p.Name, driver)
				}
				takeOver(t, env, p)
				waitCommandsDone(t, env, "recover-quorum")
				stableOneCluster(t, agents, 3)
				c2 := clusterClient(t, agents)
				for k, want := range map[string]string{"/q/before-backup": "v", "/q/after-backup": "survives"} {
					if got := get(t, c2, k); got != want {
						t.Errorf("%s = %q after the recovery, want %q", k, got, want)
					}
				}
				for _, a := range agents {
					if strings.Contains(a.Log(), "off this agent's") {
						t.Errorf("agent %s took the pause for a skewed clock", a.Name)
					}
				}
			})
		}
	}
}

// One agent is cut off from its peers (etcd's raft links and the agents'
// peer API), but not from the store, and a recover-quorum is queued. The
// majority's agents are frozen too, so the cut-off agent is the only one
// that can drive it. It must not force a new cluster: not reaching the
// others is no evidence that they lost quorum. The majority keeps serving
// and keeps every write. Before the fix, the cut-off agent restarted its
// etcd with --force-new-cluster: a second cluster.
func TestRecoverQuorumCannotForkLiveCluster(t *testing.T) {
	fw := harness.NewPeerFirewall(t)
	env, agents, before := startCluster(t, 3, 3, harness.AgentOptions{PeerFirewall: fw})
	w := startWriter(t, agents, 1_000_000)
	w.waitAcked(t, 50)
	x := follower(t, agents)
	st, _ := memberStatus(x)
	xID := st.Header.MemberId
	var majority []*harness.Agent
	for _, a := range agents {
		if a != x {
			majority = append(majority, a)
		}
	}
	fw.Set(x.Name, harness.LinkRule{Blackhole: true, Agents: true})
	harness.WaitFor(t, 30*time.Second, "the cut-off member's etcd to lose its leader", func() bool {
		st, ok := memberStatus(x)
		return ok && st.Leader == 0
	})
	for _, a := range majority {
		a.Pause()
	}
	_, _, _ = env.Ctl("recover-quorum", "--timeout=1s") // only queues it
	// The cut-off agent holds the store lock alone now; give it many
	// cycles, through the majority's records going stale.
	deadline := time.Now().Add(12 * time.Second)
	for time.Now().Before(deadline) {
		if st, ok := memberStatus(x); ok && (st.Leader == st.Header.MemberId || st.Header.MemberId != xID) {
			t.Fatalf("the cut-off member leads a cluster of its own (leader %x, member %x)", st.Leader, st.Header.MemberId)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if holder, _ := lockHolder(t, env); holder != x.NodeID() {
		t.Fatalf("the store lock is held by %q, not the cut-off agent %s: the test did not exercise it", holder, x.NodeID())
	}
	if !strings.Contains(x.Log(), "recover-quorum waits") {
		t.Error("the cut-off agent did not say why it waits")
	}
	for _, a := range majority {
		a.Continue()
	}
	fw.Heal()
	harness.WaitFor(t, 2*time.Minute, "the recover-quorum to be refused", func() bool {
		out, _, err := env.Ctl("list-commands")
		return err == nil && strings.Contains(out, "recover-quorum") && strings.Contains(out, "failed") && strings.Contains(out, "quorum is not lost")
	})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w.waitAcked(t, w.ackedCount()+20)
	w.check(t, clusterClient(t, agents))
	after := harness.Observe(agents)
	if len(after.ClusterIDs) != 1 || keys(after.ClusterIDs)[0] != keys(before.ClusterIDs)[0] {
		t.Errorf("cluster IDs %v, want one, the same as before (%v)", keys(after.ClusterIDs), keys(before.ClusterIDs))
	}
	if strings.Contains(x.Log(), "restarting etcd with --force-new-cluster") {
		t.Error("the cut-off agent restarted etcd with --force-new-cluster")
	}
}
