package integration

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// freezeEtcd stops (SIGSTOP) or resumes (SIGCONT) the agent's etcd: a
// stalled disk, a paused VM, a long check at start.
func freezeEtcd(t *testing.T, a *harness.Agent, stop bool) {
	t.Helper()
	pid := a.EtcdPID()
	if pid == 0 {
		t.Fatalf("agent %s runs no etcd", a.Name)
	}
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("signal etcd of %s: %v", a.Name, err)
	}
}

// memberIDsOf asks each agent's etcd, on its own endpoint, for its member
// list and cluster ID: etcd's own view, member by member.
func memberViews(agents []*harness.Agent) map[string]string {
	out := map[string]string{}
	for _, a := range agents {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL}, TLS: a.TLS(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			out[a.Name] = err.Error()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		ml, err := cli.MemberList(ctx, clientv3.WithSerializable())
		cancel()
		cli.Close()
		if err != nil {
			out[a.Name] = "no answer: " + err.Error()
			continue
		}
		var names []string
		for _, m := range ml.Members {
			names = append(names, m.Name)
		}
		out[a.Name] = fmt.Sprintf("cluster %x members %v", ml.Header.ClusterId, names)
	}
	return out
}

// Two of three members' etcd freeze (SIGSTOP) for longer than
// recover-quorum takes to decide, and a recover-quorum is queued. Their
// agents answer, with their data on disk: stalled is not lost. Nothing is
// forced; once they thaw, the cluster is one, with every acknowledged
// write, checked against each member's etcd.
func TestRecoverQuorumDoesNotForkAStalledMajority(t *testing.T) {
	env, agents, before := startCluster(t, 3, 3, harness.AgentOptions{})
	w := startWriter(t, agents, 1_000_000)
	w.waitAcked(t, 50)
	survivor := follower(t, agents)
	var frozen []*harness.Agent
	for _, a := range agents {
		if a != survivor {
			frozen = append(frozen, a)
		}
	}
	for _, a := range frozen {
		freezeEtcd(t, a, true)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			for _, a := range frozen {
				freezeEtcd(t, a, false)
			}
			thawed = true
		}
	}
	t.Cleanup(thaw)
	harness.WaitFor(t, 30*time.Second, "the survivor's etcd to lose its leader", func() bool {
		st, ok := memberStatus(survivor)
		return ok && st.Leader == 0
	})
	_, _, _ = env.Ctl("recover-quorum", "--timeout=1s") // only queues it
	// Far longer than the engine takes to decide with evidence (the
	// settle time, a record's freshness, a few cycles).
	deadline := time.Now().Add(25 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Contains(survivor.Log(), "restarting etcd with --force-new-cluster") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	thaw()
	// Writes go on through the members that were frozen.
	c := clusterClient(t, frozen)
	for i := range 20 {
		put(t, c, fmt.Sprintf("/stalled/after-thaw-%02d", i), "v")
	}
	harness.WaitFor(t, 2*time.Minute, "one cluster of three", func() bool {
		views := memberViews(agents)
		first := ""
		for _, v := range views {
			if first == "" {
				first = v
			}
			if v != first || strings.Contains(v, "no answer") {
				return false
			}
		}
		return strings.Count(first, " ") >= 4 // cluster X members [a b c]
	})
	if strings.Contains(survivor.Log(), "restarting etcd with --force-new-cluster") {
		t.Errorf("the survivor was forced into a new cluster while the majority was only frozen: %v", memberViews(agents))
	}
	w.waitAcked(t, w.ackedCount()+20)
	w.check(t, clusterClient(t, agents))
	after := harness.Observe(agents)
	if len(after.ClusterIDs) != 1 || keys(after.ClusterIDs)[0] != keys(before.ClusterIDs)[0] {
		t.Errorf("cluster IDs %v, want one, the same as before (%v)", keys(after.ClusterIDs), keys(before.ClusterIDs))
	}
	for i := range 20 {
		if got := get(t, clusterClient(t, agents), fmt.Sprintf("/stalled/after-thaw-%02d", i)); got != "v" {
			t.Fatalf("a write acknowledged by the thawed majority is gone: %q", got)
		}
	}
}

// ReadPosition reads, from a stopped etcd's database, the applied index,
// the revision and the members that etcd itself reported while it ran.
func TestReadPositionMatchesEtcd(t *testing.T) {
	env := harness.NewEnv(t)
	ms := env.StartBareCluster(3)
	cli, err := clientv3.New(clientv3.Config{Endpoints: harness.BareEndpoints(ms), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for i := range 200 {
		put(t, cli, fmt.Sprintf("/pos/%03d", i), "v")
	}
	m := ms[0]
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	ml, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Stop a follower's peers first, so that nothing moves its data
	// between the status and the stop.
	for _, o := range ms[1:] {
		o.Stop()
	}
	st, err := cli.Status(ctx, m.ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	m.Stop()
	pos, err := etcdproc.ReadPosition(m.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	if pos.ConsistentIndex != st.RaftAppliedIndex || pos.Revision != st.Header.Revision {
		t.Errorf("from the database: index %d, revision %d; etcd reported applied index %d, revision %d",
			pos.ConsistentIndex, pos.Revision, st.RaftAppliedIndex, st.Header.Revision)
	}
	want := map[string]bool{}
	for _, mm := range ml.Members {
		want[fmt.Sprintf("%x %s %v", mm.ID, mm.Name, mm.PeerURLs)] = true
	}
	got := map[string]bool{}
	for _, mm := range pos.Members {
		got[fmt.Sprintf("%x %s %v", mm.ID, mm.Name, mm.PeerURLs)] = true
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("members from the database %v, etcd listed %v", got, want)
	}
}

// A driver chooses a survivor, records forcing, and pauses before it
// forces; meanwhile the majority comes back, and another agent takes the
// store lock. The paused driver resumes: its lease is over, every node
// was fenced by the newer term, and nothing is forced.
func TestPausedForcingAfterMajorityHeals(t *testing.T) {
	env := harness.NewEnv(t)
	claim := filepath.Join(env.Root, "paused")
	env.ExtraEnv = append(env.ExtraEnv, testhook.PauseEnv+"=procedure-recover-quorum-recorded-forcing@"+claim)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	before := harness.WaitSettled(t, agents, 3, settleTimeout)
	w := startWriter(t, agents, 1_000_000)
	w.waitAcked(t, 50)
	survivor := follower(t, agents)
	var majority []*harness.Agent
	for _, a := range agents {
		if a != survivor {
			majority = append(majority, a)
		}
	}
	// The majority stalls whole (agents and etcd): silent, as lost.
	for _, a := range majority {
		freezeEtcd(t, a, true)
		a.Pause()
	}
	resumed := false
	resume := func() {
		if resumed {
			return
		}
		resumed = true
		for _, a := range majority {
			a.Continue()
			freezeEtcd(t, a, false)
		}
	}
	t.Cleanup(resume)
	harness.WaitFor(t, 30*time.Second, "the survivor's etcd to lose its leader", func() bool {
		st, ok := memberStatus(survivor)
		return ok && st.Leader == 0
	})
	var lost []string
	for _, a := range majority {
		lost = append(lost, a.NodeID())
	}
	_, _, _ = env.Ctl("recover-quorum", "--timeout=1s", "--lost="+strings.Join(lost, ","))
	p := pausedAgent(t, agents, claim)
	if p != survivor {
		t.Fatalf("agent %s paused at forcing, not the survivor %s", p.Name, survivor.Name)
	}
	// The majority heals; the command is refused by a new driver.
	resume()
	harness.WaitFor(t, 2*time.Minute, "another agent to hold the store lock", func() bool {
		holder, _ := lockHolder(t, env)
		return holder != "" && holder != p.NodeID()
	})
	harness.WaitFor(t, 2*time.Minute, "the recover-quorum refused", func() bool {
		out, _, err := env.Ctl("list-commands")
		return err == nil && strings.Contains(out, "failed") && (strings.Contains(out, "quorum came back") || strings.Contains(out, "quorum is not lost"))
	})
	p.Continue()
	time.Sleep(10 * time.Second) // the resumed driver's late step
	if strings.Contains(survivor.Log(), "restarting etcd with --force-new-cluster") {
		t.Fatalf("the resumed driver forced the survivor after the majority had healed: %v", memberViews(agents))
	}
	stableOneCluster(t, agents, 3)
	w.waitAcked(t, w.ackedCount()+20)
	w.check(t, clusterClient(t, agents))
	after := harness.Observe(agents)
	if len(after.ClusterIDs) != 1 || keys(after.ClusterIDs)[0] != keys(before.ClusterIDs)[0] {
		t.Errorf("cluster IDs %v, want one, the same as before (%v)", keys(after.ClusterIDs), keys(before.ClusterIDs))
	}
}

// HashOffline computes, from a stopped etcd's database, the HashKV etcd
// itself answered at each revision asked: with deletes, a compaction,
// and a tombstone at the compaction revision.
func TestHashOfflineMatchesEtcd(t *testing.T) {
	env := harness.NewEnv(t)
	ms := env.StartBareCluster(1)
	m := ms[0]
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for i := range 100 {
		put(t, cli, fmt.Sprintf("/h/%03d", i%40), fmt.Sprintf("v%d", i))
	}
	for i := range 10 {
		if _, err := cli.Delete(ctx, fmt.Sprintf("/h/%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Delete(ctx, "/h/010") // a tombstone at the compaction revision
	if err != nil {
		t.Fatal(err)
	}
	compactAt := resp.Header.Revision
	if _, err := cli.Compact(ctx, compactAt, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		put(t, cli, fmt.Sprintf("/h/%03d", i), "after")
	}
	st, err := cli.Status(ctx, m.ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	head := st.Header.Revision
	want := map[int64]*clientv3.HashKVResponse{}
	revs := []int64{0}
	for r := compactAt + 1; r <= head; r++ {
		revs = append(revs, r)
	}
	for _, rev := range revs {
		h, err := cli.HashKV(ctx, m.ClientURL, rev)
		if err != nil {
			t.Fatal(err)
		}
		want[rev] = h
	}
	m.Stop()
	for rev, w := range want {
		got, err := etcdproc.HashOffline(m.DataDir, rev)
		if err != nil {
			t.Fatalf("HashOffline at %d: %v", rev, err)
		}
		if got.Hash != w.Hash || got.CompactRevision != w.CompactRevision {
			t.Errorf("at revision %d: offline hash %08x (compacted at %d), etcd said %08x (compacted at %d)", rev, got.Hash, got.CompactRevision, w.Hash, w.CompactRevision)
		}
	}
	if _, err := etcdproc.HashOffline(m.DataDir, compactAt); !errors.Is(err, etcdproc.ErrHashUnknown) {
		t.Errorf("the compaction's own revision, which etcd answers from before it compacted: %v, want ErrHashUnknown", err)
	}
	if _, err := etcdproc.HashOffline(m.DataDir, compactAt-1); !errors.Is(err, etcdproc.ErrHashUnknown) {
		t.Errorf("a revision before the compaction: %v, want ErrHashUnknown", err)
	}
	if _, err := etcdproc.HashOffline(m.DataDir, head+1); !errors.Is(err, etcdproc.ErrHashUnknown) {
		t.Errorf("a revision beyond the data: %v, want ErrHashUnknown", err)
	}
}

// A chosen member killed for good right after the restore lifted its
// quarantine: clients are back, so the restore does not wait for it. It
// finishes with the two members left, whose fresh backup holds a write
// made after the kill, and membership repair then deals with the dead
// member like any other.
func TestRestoreFinishesWithoutAMemberLostAfterTheLift(t *testing.T) {
	env := harness.NewEnv(t)
	claim := filepath.Join(env.Root, "paused")
	env.ExtraEnv = append(env.ExtraEnv, testhook.PauseEnv+"=procedure-restore-recorded-"+spec.RestoreBackingUp+"@"+claim)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	// A lease longer than the write after the kill can take (etcd's
	// request timeout, if the victim led): with the tests' 2 s, another
	// agent took the paused driver's procedure over and backed up
	// before the write was made.
	agents := env.StartAgents(3, harness.AgentOptions{ExtraArgs: []string{"--leader-lease=30s"}})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	put(t, c, "/lost/in-backup", "v")
	name := strings.TrimSpace(env.MustCtl("backup-now"))
	put(t, c, "/lost/after-backup", "rolled back by the restore")
	env.MustCtl("restore-backup", name, "--wait=false")

	// The driver pauses once the quarantine is lifted everywhere; a
	// chosen member other than the driver then dies for good.
	driver := pausedAgent(t, agents, claim)
	var victim *harness.Agent
	var survivors []*harness.Agent
	for _, a := range agents {
		switch {
		case a != driver && victim == nil:
			victim = a
		default:
			survivors = append(survivors, a)
		}
	}
	victim.Kill()
	start := time.Now()

	// The victim may have led: the write is retried while the other two
	// elect a leader. The driver stays paused until the write is made, so
	// that its fresh backup, taken after it goes on, must hold it.
	c2 := clusterClient(t, survivors)
	var after int64
	harness.WaitFor(t, time.Minute, "a write to the restored cluster after the kill", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		resp, err := c2.Put(ctx, "/lost/after-kill", "v")
		if err != nil {
			t.Logf("a write after the kill: %v", err)
			return false
		}
		after = resp.Header.Revision
		return true
	})
	driver.Continue()
	harness.WaitFor(t, 5*time.Minute, "the restore to finish without the dead member", func() bool {
		out, _, err := env.Ctl("list-commands")
		return err == nil && !strings.Contains(out, "restore-backup")
	})
	fresh := restoredBackups(t, env)
	if len(fresh) == 0 {
		t.Fatal("the restore finished without a fresh backup of the restored cluster")
	}
	if last := fresh[len(fresh)-1]; last.Revision < after {
		t.Errorf("the fresh backup %s is at revision %d, before the write made at %d after the kill", last.Name, last.Revision, after)
	}
	t.Logf("restore finished %s after the kill; fresh backup %s", time.Since(start).Round(time.Second), fresh[len(fresh)-1].Name)
	// etcd itself: the restored data, the write after the kill, and the
	// dead member still in its member list until repair removes it.
	if got := get(t, c2, "/lost/in-backup"); got != "v" {
		t.Errorf("/lost/in-backup = %q after the restore", got)
	}
	if n := count(t, c2, "/lost/after-backup"); n != 0 {
		t.Error("the cluster serving clients is not the restored one")
	}
	if got := get(t, c2, "/lost/after-kill"); got != "v" {
		t.Errorf("/lost/after-kill = %q after the restore", got)
	}
	if !strings.Contains(allLogs(survivors), "restore goes on without the chosen members that are missing") {
		t.Error("no agent said the restore went on without the dead member")
	}
}
