package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/controller"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// writer puts keys one after another and records every acknowledged one,
// until stopped, for at most maxOps writes.
type writer struct {
	c      *clientv3.Client
	mu     sync.Mutex
	acked  []string
	failed int
	// longest is the longest time between two acknowledged writes.
	longest time.Duration
	stop    chan struct{}
	done    chan struct{}
}

func startWriter(t *testing.T, endpoints []string, maxOps int) *writer {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
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
			w.mu.Lock()
			if err != nil {
				w.failed++
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
	t.Logf("writer: %d writes acknowledged, %d failed, longest gap %s", len(w.acked), w.failed, w.longest.Round(time.Millisecond))
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
	w := startWriter(t, harness.Endpoints(agents), 20000)

	for _, v := range []string{"3.6.16", "3.7.3"} {
		env.MustCtl("--etcd-version="+v, "configure-cluster")
		waitVersion(t, env, agents, v)
		if out := env.MustCtl("--insecure", "status"); !strings.Contains(out, v) {
			t.Errorf("status does not show %s:\n%s", v, out)
		}
	}
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w.check(t, clusterClient(t, agents))
	harness.WaitFor(t, time.Minute, "status to show cluster version 3.7.0", func() bool {
		out, _, err := env.Ctl("--insecure", "status")
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
	w := startWriter(t, harness.Endpoints(agents), 20000)
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
	env.ExtraEnv = append(env.ExtraEnv, controller.CrashAtEnv+"=version-member-restarted")
	env.MustCtl("--member-count=3", "--etcd-version=3.6.16", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w := startWriter(t, harness.Endpoints(agents), 20000)
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
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL}, DialTimeout: time.Second, Logger: zap.NewNop()})
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
	w := startWriter(t, harness.Endpoints(agents), 20000)
	env.MustCtl("--etcd-version=3.5.35", "configure-cluster")
	waitVersion(t, env, agents, "3.5.35")
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w.check(t, clusterClient(t, agents))
	if !strings.Contains(allLogs(agents), "etcd downgrade enabled") {
		t.Error("the downgrade did not go through etcd's downgrade API")
	}
}
