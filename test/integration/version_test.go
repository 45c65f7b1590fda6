package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/testhook"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// writer puts keys one after another and records every acknowledged one,
// until stopped, for at most maxOps writes.
type writer struct {
	c      *clientv3.Client
	mu     sync.Mutex
	acked  []string
	failed int
	// firstErr is the first failed write's error; retried counts the
	// tries after a write's first (see startWriterRetrying).
	firstErr error
	retried  int
	// longest is the longest time between two acknowledged writes.
	longest time.Duration
	stop    chan struct{}
	done    chan struct{}
}

func startWriter(t *testing.T, agents []*harness.Agent, maxOps int) *writer {
	return startWriterRetrying(t, agents, maxOps, false)
}

// startWriterRetrying is startWriter whose writer, when retry is set,
// tries a failed write once more at once, as etcd's clients do with a
// proposal dropped during a leadership hand-over (the same key and
// value: a second try changes nothing if the first was applied after
// all); only a write that fails twice counts as failed.
func startWriterRetrying(t *testing.T, agents []*harness.Agent, maxOps int, retry bool) *writer {
	return startWriterTLS(t, agents, maxOps, retry, agents[0].TLS())
}

// startWriterTLS is startWriterRetrying with a client of TLS cfg.
func startWriterTLS(t *testing.T, agents []*harness.Agent, maxOps int, retry bool, cfg *tls.Config) *writer {
	c, err := clientv3.New(clientv3.Config{Endpoints: harness.Endpoints(agents), TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{c: c, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		last := time.Now()
		for i := 0; i < maxOps; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			k := fmt.Sprintf("/roll/%06d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, err := c.Put(ctx, k, "v")
			cancel()
			// Tried once more, as clients do; a proposal that etcd dropped
			// while leadership moved was never applied, and is tried up to
			// three times more, 50ms apart, while the transfer ends.
			for try := 0; err != nil && retry && (try == 0 || (try < 3 && strings.Contains(err.Error(), "raft proposal dropped"))); try++ {
				if try > 0 {
					time.Sleep(50 * time.Millisecond)
				}
				w.mu.Lock()
				w.retried++
				w.mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				_, err = c.Put(ctx, k, "v")
				cancel()
			}
			w.mu.Lock()
			if err != nil {
				w.failed++
				if w.firstErr == nil {
					w.firstErr = err
				}
			} else {
				w.acked = append(w.acked, k)
				if d := time.Since(last); d > w.longest {
					w.longest = d
				}
				last = time.Now()
			}
			w.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { w.halt(); c.Close() })
	return w
}

func (w *writer) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *writer) ackedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// waitAcked waits until n writes in all have been acknowledged.
func (w *writer) waitAcked(t *testing.T, n int) {
	t.Helper()
	harness.WaitFor(t, time.Minute, fmt.Sprintf("%d acknowledged writes", n), func() bool { return w.ackedCount() >= n })
}

// check verifies that every acknowledged write is present.
func (w *writer) check(t *testing.T, c *clientv3.Client) {
	t.Helper()
	w.halt()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, "/roll/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, kv := range resp.Kvs {
		have[string(kv.Key)] = true
	}
	var lost []string
	for _, k := range w.acked {
		if !have[k] {
			lost = append(lost, k)
		}
	}
	t.Logf("writer: %d writes acknowledged, %d failed (first: %v), %d tries after a first, longest gap %s", len(w.acked), w.failed, w.firstErr, w.retried, w.longest.Round(time.Millisecond))
	if len(w.acked) < 50 {
		t.Errorf("only %d writes were acknowledged during the roll", len(w.acked))
	}
	if len(lost) > 0 {
		t.Fatalf("%d acknowledged writes are lost, first %s", len(lost), lost[0])
	}
}

// waitVersion waits until every member runs version v.
func waitVersion(t *testing.T, env *harness.Env, agents []*harness.Agent, v string) {
	t.Helper()
	harness.WaitFor(t, 4*time.Minute, "every member to run etcd "+v, func() bool { return allAtVersion(agents, v) })
}

// A 3-member cluster is upgraded 3.5 -> 3.6 -> 3.7 under a steady writer:
// every acknowledged write survives, and every member ends on 3.7.
func TestRollingUpgrade(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version=3.5.35", "configure-cluster")
	// Frequent raft snapshots: the step into 3.7 waits for one past the
	// v2 entries 3.5 wrote.
	agents := env.StartAgents(3, harness.AgentOptions{ExtraArgs: []string{"--etcd-snapshot-count=200"}})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	waitVersion(t, env, agents, "3.5.35")
	w := startWriter(t, agents, 20000)

	for _, v := range []string{"3.6.16", "3.7.3"} {
		env.MustCtl("--etcd-version="+v, "configure-cluster")
		waitVersion(t, env, agents, v)
		if out := env.MustCtl("status"); !strings.Contains(out, v) {
			t.Errorf("status does not show %s:\n%s", v, out)
		}
	}
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w.check(t, clusterClient(t, agents))
	harness.WaitFor(t, time.Minute, "status to show cluster version 3.7.0", func() bool {
		out, _, err := env.Ctl("status")
		return err == nil && strings.Contains(out, "cluster version: 3.7.0")
	})
	logs := allLogs(agents)
	for _, want := range []string{"before changing etcd to 3.6.16", "before changing etcd to 3.7.3", "raft leadership handed on", "raft snapshot past the v2 entries"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the agents' logs lack %q", want)
		}
	}
}

// 3.4 (Debian's build) to 3.6 steps through 3.5, each step rolling.
func TestUpgradeStepsThroughMinors(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version=3.4.23", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{ExtraArgs: []string{"--etcd-snapshot-count=200"}})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	waitVersion(t, env, agents, "3.4.23")
	w := startWriter(t, agents, 20000)
	env.MustCtl("--etcd-version=3.6.16", "configure-cluster")
	waitVersion(t, env, agents, "3.6.16")
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w.check(t, clusterClient(t, agents))
	logs := allLogs(agents)
	for _, want := range []string{"before changing etcd to 3.5.35", "before changing etcd to 3.6.16"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the agents' logs lack %q: the upgrade did not step through 3.5", want)
		}
	}
}

// The leader agent is killed right after it restarted a member on the new
// version. A new leader carries the roll on to the end.
func TestRollingUpgradeSurvivesLeaderCrash(t *testing.T) {
	env := harness.NewEnv(t)
	env.ExtraEnv = append(env.ExtraEnv, testhook.Env+"=version-member-restarted")
	env.MustCtl("--member-count=3", "--etcd-version=3.6.16", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w := startWriter(t, agents, 20000)
	env.MustCtl("--etcd-version=3.7.3", "configure-cluster")
	// Every agent started with the crash point, so each leader that
	// restarts a member dies; each is restarted without it.
	restarts := 0
	harness.WaitFor(t, 4*time.Minute, "the roll to finish after the leader agents' crashes", func() bool {
		for _, a := range agents {
			if !a.Running() {
				restarts++
				env.ExtraEnv = nil // restarted agents do not crash again
				a.Start()
			}
		}
		return restarts > 0 && allAtVersion(agents, "3.7.3")
	})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w.check(t, clusterClient(t, agents))
	if n := strings.Count(allLogs(agents), "test hook: crashing here"); n != restarts {
		t.Fatalf("the crash point was hit %d times, but %d agents were restarted", n, restarts)
	}
	t.Logf("%d leader agents crashed mid-roll; the roll finished", restarts)
}

func allAtVersion(agents []*harness.Agent, v string) bool {
	for _, a := range agents {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL}, TLS: a.TLS(), DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := cli.Status(ctx, a.ClientURL)
		cancel()
		cli.Close()
		if err != nil || st.Version != v {
			return false
		}
	}
	return true
}

// 3.6 -> 3.5 through etcd's downgrade API, under a steady writer: every
// acknowledged write survives and every member ends on 3.5.
func TestDowngrade(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version=3.6.16", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w := startWriter(t, agents, 20000)
	env.MustCtl("--etcd-version=3.5.35", "configure-cluster")
	waitVersion(t, env, agents, "3.5.35")
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w.check(t, clusterClient(t, agents))
	if !strings.Contains(allLogs(agents), "etcd downgrade enabled") {
		t.Error("the downgrade did not go through etcd's downgrade API")
	}
}

// 3.5 -> 3.4 can only be done by dump and restore. Without
// --allow-dump-restore it is refused and nothing stops; with it, the
// cluster is quarantined, backed up and restored as a new 3.4 cluster.
// Every write acknowledged before the quarantine survives.
func TestDumpRestoreDowngrade(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version=3.5.35", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	waitVersion(t, env, agents, "3.5.35")
	before := harness.Observe(agents)
	w := startWriter(t, agents, 20000)

	env.MustCtl("--etcd-version=3.4.23", "configure-cluster")
	harness.WaitFor(t, time.Minute, "the leader to refuse the change without --allow-dump-restore", func() bool {
		return strings.Contains(allLogs(agents), "--allow-dump-restore, or set the spec back to 3.5.35")
	})
	if after := harness.Observe(agents); !allAtVersion(agents, "3.5.35") || fmt.Sprint(keys(after.ClusterIDs)) != fmt.Sprint(keys(before.ClusterIDs)) {
		t.Fatalf("a refused dump-restore changed the cluster: %v -> %v", before.ClusterIDs, after.ClusterIDs)
	}
	if out := env.MustCtl("get"); strings.Contains(out, "allowDumpRestore") {
		t.Fatalf("get shows a permission never given:\n%s", out)
	}

	w.waitAcked(t, 100)
	env.MustCtl("--etcd-version=3.4.23", "--allow-dump-restore", "configure-cluster")
	if out := env.MustCtl("get"); !strings.Contains(out, "allowDumpRestore: true") {
		t.Errorf("get does not show the permission:\n%s", out)
	}
	waitVersion(t, env, agents, "3.4.23")
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w.waitAcked(t, w.ackedCount()+50) // the writer carries on against the new cluster
	w.check(t, clusterClient(t, agents))
	t.Logf("clients were cut off for %s (the writer's longest gap)", w.longest.Round(time.Millisecond))

	// Clients are back once a quorum serves; the procedure lifts the last
	// quarantine and removes its command just after.
	harness.WaitFor(t, time.Minute, "the dump-restore to finish", func() bool {
		out, _, err := env.Ctl("list-commands")
		return err == nil && !strings.Contains(out, "dump-restore")
	})
	after := harness.Observe(agents)
	for id := range after.ClusterIDs {
		if _, old := before.ClusterIDs[id]; old {
			t.Errorf("the old cluster %x still runs after the dump-restore: %v", id, after.ClusterIDs)
		}
	}
	logs := allLogs(agents)
	for _, want := range []string{"dump-restore started: quarantining the cluster", "dump-restore: the quarantined cluster is backed up", "restore complete"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the agents' logs lack %q", want)
		}
	}
	if out := env.MustCtl("list-commands"); strings.Contains(out, "dump-restore") {
		t.Errorf("the finished dump-restore is still queued:\n%s", out)
	}
	// The backup it restored from is kept, from 3.5, and a fresh one from 3.4.
	out := env.MustCtl("list-backups", "-o", "json")
	if !strings.Contains(out, `"etcdVersion": "3.5.35"`) || !strings.Contains(out, `"etcdVersion": "3.4.23"`) {
		t.Errorf("list-backups lacks the 3.5 dump or the 3.4 backup after it:\n%s", out)
	}
}

// A dump too large for the agents' --max-snapshot-bytes is found out
// right after it is taken, from its meta: the dump-restore fails, saying
// so, the old cluster never stops, its quarantine is lifted, and it
// takes writes again on its old version.
func TestDumpRestoreTooLarge(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version=3.5.35", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{ExtraArgs: []string{"--max-snapshot-bytes=65536"}})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	value := strings.Repeat("x", 1024)
	for i := range 200 {
		put(t, c, fmt.Sprintf("/big/%03d", i), value)
	}
	before := harness.Observe(agents)

	env.MustCtl("--etcd-version=3.4.23", "--allow-dump-restore", "configure-cluster")
	var out string
	harness.WaitFor(t, 2*time.Minute, "the dump-restore to fail", func() bool {
		out, _, _ = env.Ctl("list-commands")
		return strings.Contains(out, "failed")
	})
	for _, want := range []string{"cannot restore the dump", "--max-snapshot-bytes", "the old cluster was not stopped"} {
		if !strings.Contains(out, want) {
			t.Errorf("list-commands does not say %q:\n%s", want, out)
		}
	}
	harness.WaitFor(t, time.Minute, "the quarantine to be lifted", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err := c.Put(ctx, "/big/after", "ok")
		return err == nil
	})
	// Each member's etcd restarts out of quarantine in turn.
	harness.WaitSettled(t, agents, 3, settleTimeout)
	after := harness.Observe(agents)
	if !allAtVersion(agents, "3.5.35") || fmt.Sprint(keys(after.ClusterIDs)) != fmt.Sprint(keys(before.ClusterIDs)) {
		t.Fatalf("the refused dump-restore changed the cluster: %v -> %v", before.ClusterIDs, after.ClusterIDs)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, "/big/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 201 {
		t.Fatalf("after the refused dump-restore: %v keys, %v; want 201", resp, err)
	}
	if logs := allLogs(agents); strings.Contains(logs, "dump-restore: the quarantined cluster is backed up; stopping it") {
		t.Error("the old cluster was stopped for a dump that cannot be restored")
	}
}

// The agent driving a dump-restore is killed right after it records the
// dump-restore's plan, and right after it records the dump. Another agent
// (or the restarted one) carries it on to a 3.4 cluster with the data.
func TestDumpRestoreCrashSafety(t *testing.T) {
	for _, phase := range []string{"quarantining", "stopping"} {
		t.Run(phase, func(t *testing.T) {
			env := harness.NewEnv(t)
			env.ExtraEnv = append(env.ExtraEnv, testhook.Env+"=restore-"+phase)
			env.MustCtl("--member-count=3", "--etcd-version=3.5.35", "configure-cluster")
			agents := env.StartAgents(3, harness.AgentOptions{})
			harness.WaitSettled(t, agents, 3, settleTimeout)
			put(t, clusterClient(t, agents), "/crash/key", "kept")
			env.MustCtl("--etcd-version=3.4.23", "--allow-dump-restore", "configure-cluster")
			crashed := map[string]bool{}
			harness.WaitFor(t, 4*time.Minute, "the dump-restore to finish after the crash", func() bool {
				for _, a := range agents {
					if !a.Running() {
						crashed[a.Name] = true
						env.ExtraEnv = nil // restarted agents do not crash again
						a.Start()
					}
				}
				return len(crashed) > 0 && allAtVersion(agents, "3.4.23")
			})
			if n := strings.Count(allLogs(agents), "test hook: crashing here"); n != 1 || len(crashed) != 1 {
				t.Fatalf("the crash point was hit %d times and %d agents crashed; want 1 and 1", n, len(crashed))
			}
			harness.WaitSettled(t, agents, 3, settleTimeout)
			assertOneCluster(t, agents)
			if got := get(t, clusterClient(t, agents), "/crash/key"); got != "kept" {
				t.Fatalf("/crash/key = %q after the dump-restore, want %q", got, "kept")
			}
		})
	}
}
