package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// memberStatuses asks each agent's etcd for its status through c, each
// within 3 s; an entry is nil where the member did not answer.
func memberStatuses(c *clientv3.Client, agents []*harness.Agent) []*clientv3.StatusResponse {
	out := make([]*clientv3.StatusResponse, len(agents))
	for i, a := range agents {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		out[i], _ = c.Status(ctx, a.ClientURL)
		cancel()
	}
	return out
}

// dbSizes is each member's database size, -1 where it does not answer.
func dbSizes(t *testing.T, agents []*harness.Agent) []int64 {
	t.Helper()
	var out []int64
	for _, st := range memberStatuses(clusterClient(t, agents), agents) {
		if st == nil {
			out = append(out, -1)
			continue
		}
		out = append(out, st.DbSize)
	}
	return out
}

// dbSpace renders each member's database size and the part in use, as
// its etcd reports them, for a failure's message.
func dbSpace(t *testing.T, agents []*harness.Agent) string {
	t.Helper()
	var out []string
	for i, st := range memberStatuses(clusterClient(t, agents), agents) {
		if st == nil {
			out = append(out, agents[i].Name+": no answer")
			continue
		}
		out = append(out, fmt.Sprintf("%s: %d bytes, %d in use, leader %x", agents[i].Name, st.DbSize, st.DbSizeInUse, st.Leader))
	}
	return strings.Join(out, "; ")
}

// leaderSample is the leader a member reported, asked after sent and
// answering before got.
type leaderSample struct {
	sent, got time.Time
	leader    string // the leading member's name, its node ID
}

// sampleLeaders asks every member for the raft leader every 50ms, each
// over a connection of its own, until stop is called, which returns what
// they said. A member that does not answer (restarting, isolated) is
// skipped.
func sampleLeaders(t *testing.T, agents []*harness.Agent) (stop func() []leaderSample) {
	t.Helper()
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	ml, err := c.MemberList(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	names := map[uint64]string{}
	for _, m := range ml.Members {
		names[m.ID] = m.Name
	}
	var members []pb.MaintenanceClient
	for _, a := range agents {
		// Maintenance.Status dials anew for every call; a member's own
		// client keeps one connection.
		members = append(members, pb.NewMaintenanceClient(a.Client().ActiveConnection()))
	}
	done, out := make(chan struct{}), make(chan []leaderSample)
	go func() {
		var samples []leaderSample
		for i := 0; i < 20000; i++ { // 1000 s at most
			select {
			case <-done:
				out <- samples
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, m := range members {
				sent := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				st, err := m.Status(ctx, &pb.StatusRequest{})
				cancel()
				if err == nil && st.Leader != 0 {
					samples = append(samples, leaderSample{sent: sent, got: time.Now(), leader: names[st.Leader]})
				}
			}
		}
		<-done
		out <- samples
	}()
	return func() []leaderSample { close(done); return <-out }
}

// defragWindow is when the leader's agent defragmented a member, from
// its "defragmenting a member" to its "member defragmented".
type defragWindow struct {
	node       string
	start, end time.Time
}

var defragLogRE = regexp.MustCompile(`(?m)^time=(\S+) level=INFO msg="(defragmenting a member|member defragmented)" node=(\S+)`)

func defragWindows(t *testing.T, logs string) []defragWindow {
	t.Helper()
	var out []defragWindow
	open := map[string]time.Time{}
	for _, m := range defragLogRE.FindAllStringSubmatch(logs, -1) {
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatalf("log time %q: %v", m[1], err)
		}
		if m[2] == "defragmenting a member" {
			open[m[3]] = at
		} else if start, ok := open[m[3]]; ok {
			out = append(out, defragWindow{node: m[3], start: start, end: at})
			delete(open, m[3])
		}
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
	stopSampling := sampleLeaders(t, agents)

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
	// Three voters: each member is defragmented isolated, its etcd
	// stopped while its agent copies the database offline, so that its
	// clients go to the others.
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
	// The writer's client fails over from a member whose etcd is stopped
	// for its defragmentation.
	if w.failed > 0 {
		t.Errorf("%d writes failed, retries included, during the defragmentations (first: %v)", w.failed, w.firstErr)
	}
	// No member led while it was defragmented: the members' own word,
	// asked every 50ms, against the leader's log of each defragmentation
	// (the first 100ms of each window, while the others learn of a
	// hand-over that just ended, do not count).
	samples := stopSampling()
	windows := defragWindows(t, allLogs(agents))
	if len(windows) != 6 {
		t.Fatalf("%d defragmentations in the logs, want 6 (3 by the policy, 3 on demand)", len(windows))
	}
	inside := 0
	for _, win := range windows {
		for _, s := range samples {
			if s.sent.Before(win.start.Add(100*time.Millisecond)) || s.got.After(win.end) {
				continue
			}
			inside++
			if s.leader == win.node {
				t.Errorf("%s led between %s and %s while it was defragmented (%s to %s)", win.node, s.sent.Format(time.RFC3339Nano), s.got.Format(time.RFC3339Nano), win.start.Format(time.RFC3339Nano), win.end.Format(time.RFC3339Nano))
				break
			}
		}
	}
	if inside == 0 {
		t.Errorf("no leader sample fell inside the %d defragmentations: the check saw nothing", len(windows))
	}
	t.Logf("%d leader samples, %d of them during the %d defragmentations", len(samples), inside, len(windows))
}

// fillAndFree writes n values of 512 KiB under prefix, each to a key of
// its own, deletes the first free of them and compacts them away
// physically: the database keeps their pages, free. It returns the keys
// left, each holding spaceValue of its index.
func fillAndFree(t *testing.T, c *clientv3.Client, prefix string, n, free int) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	left := map[string]string{}
	for i := range n {
		key := fmt.Sprintf("%s%03d", prefix, i)
		if _, err := c.Put(ctx, key, spaceValue(i)); err != nil {
			t.Fatal(err)
		}
		if i >= free {
			left[key] = spaceValue(i)
		}
	}
	var rev int64
	for i := range free {
		resp, err := c.Delete(ctx, fmt.Sprintf("%s%03d", prefix, i))
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	if _, err := c.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	waitFreeReported(t, c, int64(free)*int64(len(spaceValue(0)))/2)
	return left
}

// waitFreeReported waits until every member's etcd reports at least
// minFree bytes of its database free. etcd works out the part in use when
// it begins a write batch, and pages the last batch freed are not free yet
// while a reader is open, so after a compaction an idle member may report
// the freed space only after its next write: each round writes one small
// key outside every prefix the tests read.
func waitFreeReported(t *testing.T, c *clientv3.Client, minFree int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for round := 0; ; round++ {
		var short []string
		for _, ep := range c.Endpoints() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			st, err := c.Status(ctx, ep)
			cancel()
			switch {
			case err != nil:
				short = append(short, fmt.Sprintf("%s: %v", ep, err))
			case st.DbSize-st.DbSizeInUse < minFree:
				short = append(short, fmt.Sprintf("%s: %d of %d bytes free", ep, st.DbSize-st.DbSizeInUse, st.DbSize))
			}
		}
		if len(short) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d rounds, not every member reports %d bytes free: %s", round, minFree, strings.Join(short, "; "))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Put(ctx, "/fill-and-free/nudge", strconv.Itoa(round))
		cancel()
		if err != nil {
			t.Logf("nudge write: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// checkKeys fails unless every key holds its value.
func checkKeys(t *testing.T, c *clientv3.Client, want map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for k, v := range want {
		resp, err := c.Get(ctx, k)
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != v {
			t.Errorf("%s lost its value (%d keys read)", k, len(resp.Kvs))
		}
	}
}

// TestDefragByQuotaInItsWindow: a database at the policy's share of the
// quota, with too few free pages for the fraction rule, is due by the
// quota rule; while the maintenance window is shut the leader says so and
// waits, and once it opens both members of a two-member cluster are
// defragmented in place (the other alone has no quorum), the follower
// first, each with etcd reporting its gRPC service stopped meanwhile so
// that health-checking clients go elsewhere.
func TestDefragByQuotaInItsWindow(t *testing.T) {
	env := harness.NewEnv(t)
	// A window of one minute, half an hour from now: shut for this test.
	shut := fmt.Sprintf("%d * * * *", (time.Now().UTC().Minute()+30)%60)
	env.MustCtl("--member-count=2", "--etcd-version="+harness.DefaultEtcdVersion, "--quota-backend-bytes=33554432",
		"--defrag-min-reclaimable-bytes=1048576", "--defrag-min-reclaimable-fraction=0.9", "--defrag-quota-percent=40",
		"--defrag-window="+shut, "--defrag-window-duration=1m", "configure-cluster")
	if out := env.MustCtl("get"); !strings.Contains(out, fmt.Sprintf("within 1m of %q (UTC)", shut)) {
		t.Fatalf("get does not show the window:\n%s", out)
	}
	agents := env.StartAgents(2, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 2, settleTimeout)
	c := clusterClient(t, agents)

	defer func() {
		if t.Failed() { // a member the policy did not find due says why
			t.Logf("the members' databases at the end: %s", dbSpace(t, agents))
		}
	}()
	// 14 MiB, 3 of them freed: over 40% of the 32 MiB quota, far under
	// 90% free.
	left := fillAndFree(t, c, "/quota/", 28, 6)
	// A member's etcd counts the pages a compaction freed as free only
	// once its backend has committed twice more (bbolt keeps them pending
	// while a read transaction older than the freeing one is open, and
	// etcd opens one at every commit). An idle cluster may not commit for
	// a while: one member once reported 1 MiB free of the 3, under the
	// policy's minimum, and was never due. A few writes settle it.
	harness.WaitFor(t, 30*time.Second, "every member to report its 3 freed MiB as free", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if _, err := c.Put(ctx, "/quota-settle", time.Now().String()); err != nil {
			return false
		}
		for _, st := range memberStatuses(c, agents) {
			if st == nil || st.DbSize-st.DbSizeInUse < 2<<20 {
				return false
			}
		}
		return true
	})
	before := dbSizes(t, agents)
	for i, s := range before {
		if s < 14<<20 {
			t.Fatalf("%s's database is %d bytes after writing 14 MiB", agents[i].Name, s)
		}
	}
	harness.WaitFor(t, time.Minute, "the leader to say that defragmentation waits for its window", func() bool {
		return strings.Contains(allLogs(agents), `msg="defragmentation is due and waits for its maintenance window" members=`) &&
			strings.Contains(allLogs(agents), `window="`+shut+`"`)
	})
	// Five more loop ticks, and still nothing defragmented.
	time.Sleep(10 * time.Second)
	if logs := allLogs(agents); strings.Contains(logs, `msg="defragmenting a member"`) {
		t.Fatalf("a member was defragmented outside the window:\n%s", grepLines(logs, "defrag", 20))
	}

	env.MustCtl("--defrag-window=* * * * *", "configure-cluster")
	harness.WaitFor(t, 2*time.Minute, "both members to be defragmented in the window", func() bool {
		return strings.Count(allLogs(agents), `msg="member defragmented"`) >= 2
	})
	after := dbSizes(t, agents)
	t.Logf("database sizes %v before, %v after", before, after)
	for i := range agents {
		if after[i] < 0 || after[i] > before[i]-2<<20 {
			t.Errorf("%s's database went from %d to %d bytes: its free 3 MiB were not given back", agents[i].Name, before[i], after[i])
		}
	}
	logs := allLogs(agents)
	if n := strings.Count(logs, `msg="defragmenting a member" node=`); n != 2 {
		t.Errorf("%d defragmentations began, want 2", n)
	}
	if n := strings.Count(logs, `msg="member defragmented"`); n != 2 {
		t.Errorf("%d defragmentations, want 2", n)
	}
	for _, line := range strings.Split(grepLines(logs, `msg="defragmenting a member"`, 10), "\n") {
		if line != "" && (!strings.Contains(line, `mode="in place"`) || !strings.Contains(line, "of the quota")) {
			t.Errorf("not in place by the quota rule: %s", line)
		}
	}
	if !strings.Contains(logs, "before defragmenting the leader's member") {
		t.Error("leadership was not handed on before the leader's member was defragmented")
	}
	// Each member's etcd, defragmented in place, stopped its gRPC
	// service for the duration.
	for _, a := range agents {
		if !strings.Contains(a.Log(), `"reason":"defrag is active"`) {
			t.Errorf("%s's etcd did not report its gRPC service stopped while it was defragmented:\n%s", a.Name, grepLines(a.Log(), "grpc service status", 10))
		}
	}
	checkKeys(t, c, left)
}

// TestDefragWaitsForEveryMember: with one member's agent and etcd down,
// a due defragmentation waits and says why; when the member is back, every
// member is defragmented.
func TestDefragWaitsForEveryMember(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "--auto-defrag=false", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	left := fillAndFree(t, c, "/degraded/", 24, 18)

	// Not the leader: the other two keep quorum, and the leader's agent
	// plans.
	down := agents[0]
	for _, a := range agents {
		if !a.Leads() {
			down = a
			break
		}
	}
	down.Stop()
	env.MustCtl("--auto-defrag=true", "--defrag-min-reclaimable-bytes=4194304", "--defrag-min-reclaimable-fraction=0.5", "configure-cluster")
	harness.WaitFor(t, time.Minute, "the leader to say that defragmentation waits for the member", func() bool {
		return strings.Contains(allLogs(agents), `msg="defragmentation waits: a member's agent is unreachable, or a member is a learner"`)
	})
	time.Sleep(10 * time.Second)
	if logs := allLogs(agents); strings.Contains(logs, `msg="defragmenting a member"`) {
		t.Fatalf("a member was defragmented while another was down:\n%s", grepLines(logs, "defrag", 20))
	}

	down.Start()
	harness.WaitFor(t, 3*time.Minute, "every member to be defragmented once all are back", func() bool {
		return strings.Count(allLogs(agents), `msg="member defragmented"`) >= 3
	})
	if n := strings.Count(allLogs(agents), `msg="member defragmented"`); n != 3 {
		t.Errorf("%d defragmentations, want one per member", n)
	}
	for i, s := range dbSizes(t, agents) {
		if s < 0 || s > 8<<20 {
			t.Errorf("%s's database is %d bytes after its defragmentation", agents[i].Name, s)
		}
	}
	checkKeys(t, c, left)
}

// TestDefragOfflineOnOldestAndNewestEtcd: the offline copy an isolated
// defragmentation makes (bbolt's compaction, by this build's bbolt) is a
// database that the oldest and the newest etcd this release runs open
// and serve: every key reads back, the members' HashKV agree, and each
// database gave its free pages back.
func TestDefragOfflineOnOldestAndNewestEtcd(t *testing.T) {
	for _, version := range []string{"3.4.23", "3.7.3"} {
		t.Run(version, func(t *testing.T) {
			env := harness.NewEnv(t)
			env.MustCtl("--member-count=3", "--etcd-version="+version, "--auto-defrag=false", "configure-cluster")
			agents := env.StartAgents(3, harness.AgentOptions{})
			harness.WaitSettled(t, agents, 3, settleTimeout)
			c := clusterClient(t, agents)
			// 20 MiB, 15 of them freed.
			left := fillAndFree(t, c, "/offline/", 40, 30)
			before := dbSizes(t, agents)
			out := env.MustCtl("defrag", "--timeout=3m")
			for _, a := range agents {
				if !strings.Contains(out, "defragmented "+a.NodeID()) {
					t.Errorf("defrag printed %q; it lacks %s", out, a.NodeID())
				}
			}
			if n := strings.Count(allLogs(agents), `msg="etcd defragmented, and serves its clients again"`); n != 3 {
				t.Errorf("%d members defragmented offline, want 3", n)
			}
			var after []int64
			harness.WaitFor(t, time.Minute, "every member to serve again", func() bool {
				after = dbSizes(t, agents)
				for _, s := range after {
					if s < 0 {
						return false
					}
				}
				return true
			})
			t.Logf("database sizes %v before, %v after", before, after)
			for i := range agents {
				if after[i] > before[i]-10<<20 {
					t.Errorf("%s's database went from %d to %d bytes: its free 15 MiB were not given back", agents[i].Name, before[i], after[i])
				}
			}
			checkKeys(t, c, left)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resp, err := c.Put(ctx, "/offline/last", "x")
			if err != nil {
				t.Fatal(err)
			}
			rev := resp.Header.Revision
			harness.WaitFor(t, 30*time.Second, "every member's HashKV at the last write to agree", func() bool {
				var hashes []uint32
				for _, a := range agents {
					h, err := c.HashKV(ctx, a.ClientURL, rev)
					if err != nil {
						return false
					}
					hashes = append(hashes, h.Hash)
				}
				return hashes[0] == hashes[1] && hashes[1] == hashes[2]
			})
		})
	}
}

// TestDefragStopsWhenTheClusterDegrades: an isolated defragmentation
// leaves the cluster a voter short while the member's database is copied
// offline. When another member dies meanwhile, the leader stops it: the
// copy is killed and deleted, the member's etcd starts again on its
// database as it was, and the two of three members left keep quorum. The
// defrag command finishes once the dead member is back.
func TestDefragStopsWhenTheClusterDegrades(t *testing.T) {
	env := harness.NewEnv(t)
	claim := filepath.Join(t.TempDir(), "pause-claim")
	// The first copy pauses once written, before its rename.
	env.ExtraEnv = append(env.ExtraEnv, testhook.PauseEnv+"="+etcdproc.CompactPausePoint+"@"+claim)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "--auto-defrag=false", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	left := fillAndFree(t, c, "/degrade/", 40, 30)
	before := dbSizes(t, agents)

	type ctlResult struct {
		out, errOut string
		err         error
	}
	done := make(chan ctlResult, 1)
	go func() {
		out, errOut, err := env.Ctl("defrag", "--timeout=5m")
		done <- ctlResult{out, errOut, err}
	}()

	// The paused copy, and the agent whose child it is.
	var copier int
	harness.WaitFor(t, 3*time.Minute, "a member's offline copy to pause before its rename", func() bool {
		b, err := os.ReadFile(claim)
		if err != nil {
			return false
		}
		copier, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return copier > 0 && procState(copier) == 'T'
	})
	var member, other *harness.Agent
	parent := procPPid(t, copier)
	for _, a := range agents {
		switch {
		case a.PID() == parent:
			member = a
		case !a.Leads() && other == nil:
			other = a
		}
	}
	if member == nil || other == nil || member == other {
		t.Fatalf("the paused copy %d has parent %d: no agent's, or no other follower to stop", copier, parent)
	}
	copies, _ := filepath.Glob(filepath.Join(member.DataDir, "data", "*", "member", "snap", "db.tmp.etcd-manager"))
	if len(copies) != 1 {
		t.Fatalf("%s's copy beside its database: %v; want one while the copy is paused", member.Name, copies)
	}

	// The other follower dies: without the member being defragmented, the
	// leader's etcd alone has no quorum.
	t.Logf("%s's copy (pid %d) is paused; killing %s", member.Name, copier, other.Name)
	killed := time.Now()
	other.Kill()
	harness.WaitFor(t, time.Minute, "the leader to stop the defragmentation", func() bool {
		return strings.Contains(allLogs(agents), `msg="isolated defragmentation stopped: another member stopped answering`)
	})
	stopped := time.Since(killed)
	harness.WaitFor(t, time.Minute, "a write to succeed on the two members left", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.Put(ctx, "/degrade/after", "x")
		return err == nil
	})
	t.Logf("after the kill: the defragmentation stopped within %s, a write succeeded after %s", stopped.Round(100*time.Millisecond), time.Since(killed).Round(100*time.Millisecond))
	if procState(copier) != 0 {
		t.Errorf("the copy %d still runs after the defragmentation was stopped", copier)
	}
	if copies, _ := filepath.Glob(filepath.Join(member.DataDir, "data", "*", "member", "snap", "db.tmp.etcd-manager")); len(copies) != 0 {
		t.Errorf("the stopped copy is left beside the database: %v", copies)
	}
	for i, a := range agents {
		if a != member {
			continue
		}
		if s := dbSizes(t, []*harness.Agent{a})[0]; s < before[i]-10<<20 {
			t.Errorf("%s's database is %d bytes after the stopped defragmentation, was %d: the stopped copy replaced it", a.Name, s, before[i])
		}
	}

	// The dead member returns, and the command finishes every member.
	other.Start()
	var res ctlResult
	select {
	case res = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("etcd-manager-ctl defrag did not return within 5 minutes")
	}
	if res.err != nil {
		t.Fatalf("etcd-manager-ctl defrag: %v\n%s%s", res.err, res.out, res.errOut)
	}
	for _, a := range agents {
		if !strings.Contains(res.out, "defragmented "+a.NodeID()) {
			t.Errorf("defrag printed %q; it lacks %s", res.out, a.NodeID())
		}
	}
	after := dbSizes(t, agents)
	t.Logf("database sizes %v before, %v after", before, after)
	for i := range agents {
		if after[i] < 0 || after[i] > before[i]-10<<20 {
			t.Errorf("%s's database went from %d to %d bytes: its free 15 MiB were not given back", agents[i].Name, before[i], after[i])
		}
	}
	left["/degrade/after"] = "x"
	checkKeys(t, c, left)
}

// procState is the state letter of process pid (R, S, T, ...), 0 when
// it is gone (or a zombie, whose parent has not reaped it).
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) || s[i+2] == 'Z' {
		return 0
	}
	return s[i+2]
}

// procPPid is the parent of process pid.
func procPPid(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no PPid", pid)
	return 0
}
