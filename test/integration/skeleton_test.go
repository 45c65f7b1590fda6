package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

const startTimeout = 30 * time.Second

func put(t *testing.T, c *clientv3.Client, k, v string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, k, v); err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
}

func get(t *testing.T, c *clientv3.Client, k string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, k)
	if err != nil {
		t.Fatalf("get %s: %v", k, err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %d values", k, len(resp.Kvs))
	}
	return string(resp.Kvs[0].Value)
}

func clusterID(t *testing.T, c *clientv3.Client) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.MemberList(ctx)
	if err != nil {
		t.Fatalf("member list: %v", err)
	}
	if len(resp.Members) != 1 {
		t.Fatalf("cluster has %d members, want 1", len(resp.Members))
	}
	return resp.Header.ClusterId
}

// startOne starts an agent, configures a 1-member cluster with the
// walkthrough's spelling, and waits until etcd serves.
func startOne(t *testing.T) (*harness.Env, *harness.Agent) {
	env := harness.NewEnv(t)
	a := env.StartAgent("1", harness.AgentOptions{})
	a.WaitLog("waiting for a cluster spec", 1, startTimeout)
	env.MustCtl("-member-count=1", "-etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	a.WaitHealthy(startTimeout)
	return env, a
}

func TestColdStartConfigurePutGet(t *testing.T) {
	env, a := startOne(t)
	c := a.Client()
	put(t, c, "/hello", "world")
	if got := get(t, c, "/hello"); got != "world" {
		t.Fatalf("got %q", got)
	}
	out := env.MustCtl("get")
	if out != "memberCount: 1\netcdVersion: "+harness.DefaultEtcdVersion+"\ncompaction: keep 1h of history (the default)\n" {
		t.Errorf("ctl get printed %q", out)
	}
	// The store holds the format's control objects, and the node's etcd
	// data lives under data/<cluster token>.
	for _, key := range []string{"control/etcd-cluster-spec", "control/etcd-cluster-created"} {
		if _, err := os.Stat(filepath.Join(env.StoreDir, key)); err != nil {
			t.Errorf("store lacks %s: %v", key, err)
		}
	}
	tokens, _ := os.ReadDir(filepath.Join(a.DataDir, "data"))
	if len(tokens) != 1 {
		t.Fatalf("data/ holds %d cluster folders, want 1", len(tokens))
	}
	if _, err := os.Stat(filepath.Join(a.DataDir, "data", tokens[0].Name(), "member")); err != nil {
		t.Errorf("etcd data is not under data/<token>: %v", err)
	}
}

func TestEtcdKilledIsRestarted(t *testing.T) {
	_, a := startOne(t)
	c := a.Client()
	put(t, c, "/k", "v1")
	before := clusterID(t, c)
	pid := a.EtcdPID()
	if pid == 0 {
		t.Fatal("no etcd pid file")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, startTimeout, "a new etcd child", func() bool {
		p := a.EtcdPID()
		return p != 0 && p != pid && harness.ProcessAlive(p)
	})
	a.WaitLog("etcd exited; restarting after backoff", 1, startTimeout)
	a.WaitHealthy(startTimeout)
	if got := get(t, c, "/k"); got != "v1" {
		t.Errorf("after restart got %q", got)
	}
	if after := clusterID(t, c); after != before {
		t.Errorf("cluster ID changed from %x to %x", before, after)
	}
}

func TestAgentRestartReadoptsCluster(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			env, a := startOne(t)
			c := a.Client()
			put(t, c, "/k", "kept")
			before := clusterID(t, c)
			created, err := os.ReadFile(filepath.Join(env.StoreDir, "control", "etcd-cluster-created"))
			if err != nil {
				t.Fatal(err)
			}
			etcdPID := a.EtcdPID()

			if err := a.Signal(sig, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			// etcd never outlives its agent: a graceful stop on SIGTERM,
			// the parent-death signal on SIGKILL.
			harness.WaitFor(t, 10*time.Second, "etcd to exit with its agent", func() bool { return !harness.ProcessAlive(etcdPID) })
			if sig == syscall.SIGTERM {
				if err := a.ExitErr(); err != nil {
					t.Errorf("agent exit after SIGTERM: %v", err)
				}
				if !strings.Contains(a.Log(), "etcd stopped") {
					t.Error("no graceful etcd stop in the log")
				}
			}

			a.Start()
			a.WaitHealthy(startTimeout)
			if got := get(t, c, "/k"); got != "kept" {
				t.Errorf("got %q after restart", got)
			}
			if after := clusterID(t, c); after != before {
				t.Errorf("cluster ID changed from %x to %x: a second cluster was created", before, after)
			}
			again, _ := os.ReadFile(filepath.Join(env.StoreDir, "control", "etcd-cluster-created"))
			if string(again) != string(created) {
				t.Errorf("creation marker rewritten: %s -> %s", created, again)
			}
			tokens, _ := os.ReadDir(filepath.Join(a.DataDir, "data"))
			if len(tokens) != 1 {
				t.Errorf("data/ holds %d cluster folders after restart, want 1", len(tokens))
			}
		})
	}
}

// A second agent on the same data dir is refused instead of corrupting it.
func TestDataDirInUse(t *testing.T) {
	env, a := startOne(t)
	out, errOut, err := env.CtlRaw("--help")
	if err != nil || !strings.Contains(out+errOut, "configure-cluster") {
		t.Fatalf("ctl --help: %v %s %s", err, out, errOut)
	}
	b := env.StartAgent("dup", harness.AgentOptions{ExtraArgs: []string{"--data-dir=" + a.DataDir}})
	harness.WaitFor(t, startTimeout, "the duplicate agent to exit", func() bool { return !b.Running() })
	if b.ExitErr() == nil || !strings.Contains(b.Log(), "data dir is in use by another etcd-manager") {
		t.Errorf("duplicate agent: exit %v, log:\n%s", b.ExitErr(), b.Log())
	}
	a.WaitHealthy(startTimeout)
}

func TestMalformedSpecKeepsEtcdRunning(t *testing.T) {
	tests := []struct {
		name, body, wantLog string
	}{
		{name: "junk", body: "{not json", wantLog: "cluster spec is invalid"},
		{name: "empty", body: "", wantLog: "cluster spec is empty"},
		{name: "zero members", body: `{"memberCount":0,"etcdVersion":"3.6.16"}`, wantLog: "member count must be at least 1"},
		{name: "v2", body: `{"memberCount":1,"etcdVersion":"2.2.1"}`, wantLog: "etcd v2 is not supported"},
		{name: "bad version", body: `{"memberCount":1,"etcdVersion":"latest"}`, wantLog: "invalid etcd version"},
	}
	env, a := startOne(t)
	c := a.Client()
	put(t, c, "/k", "v")
	pid := a.EtcdPID()
	specPath := filepath.Join(env.StoreDir, "control", "etcd-cluster-spec")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := strings.Count(a.Log(), tt.wantLog)
			if err := os.WriteFile(specPath, []byte(tt.body), 0o644); err != nil {
				t.Fatal(err)
			}
			// Logged every cycle, not once.
			a.WaitLog(tt.wantLog, n+3, startTimeout)
			if !a.Running() {
				t.Fatal("agent exited on a bad spec")
			}
			if a.EtcdPID() != pid || !harness.ProcessAlive(pid) {
				t.Fatal("etcd was restarted or stopped because of a bad spec")
			}
			if got := get(t, c, "/k"); got != "v" {
				t.Errorf("got %q", got)
			}
		})
	}
	// Fixing the spec ends the errors.
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	time.Sleep(time.Second)
	n := strings.Count(a.Log(), "cluster spec is invalid")
	time.Sleep(time.Second)
	if m := strings.Count(a.Log(), "cluster spec is invalid"); m != n {
		t.Errorf("errors go on after the spec was fixed (%d -> %d)", n, m)
	}
}

// A spec naming a version with no binary is refused by the agent too (for
// specs written by other tools, or before any agent reported), naming the
// folder it looked in. Once the agent has published its installed
// versions in its discovery record, the ctl refuses the version itself,
// naming the node, with no etcd of its own.
func TestSpecVersionWithoutBinary(t *testing.T) {
	env := harness.NewEnv(t)
	_, errOut, err := env.Ctl("--member-count=1", "--etcd-version=3.6.99", "configure-cluster")
	if err != nil || !strings.Contains(errOut, "warning: no node has reported its installed etcd versions") {
		t.Fatalf("configure-cluster before any agent ran: %v; stderr %q", err, errOut)
	}
	a := env.StartAgent("1", harness.AgentOptions{})
	a.WaitLog("no etcd binary for etcd 3.6.99 in "+env.BinDir, 3, startTimeout)
	if a.EtcdPID() != 0 {
		t.Error("etcd was started without a binary for the spec's version")
	}
	if _, err := os.Stat(filepath.Join(env.StoreDir, "control", "etcd-cluster-created")); err == nil {
		t.Error("cluster marked created although nothing could start")
	}
	// The agent's record lists what its --etcd-bin-dir holds.
	var rec peer.Record
	harness.WaitFor(t, startTimeout, "the agent's record with its etcd versions", func() bool {
		s, err := store.Open(t.Context(), env.StoreURL, store.Options{})
		if err != nil {
			return false
		}
		defer s.Close()
		recs, _ := peer.StoreRecords(t.Context(), s, peer.ReadLimits{})
		for _, r := range recs {
			if r.Address == a.PeerAPI && len(r.EtcdVersions) > 0 {
				rec = r
				return true
			}
		}
		return false
	})
	if !slices.Contains(rec.EtcdVersions, harness.DefaultEtcdVersion) || slices.Contains(rec.EtcdVersions, "3.6.99") {
		t.Errorf("the agent reports %v installed", rec.EtcdVersions)
	}
	// A node that is no member yet only cannot become one: the version
	// it lacks is not refused for it.
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "--etcd-bin-dir=/nonexistent", "configure-cluster")
	a.WaitHealthy(startTimeout)
	// Once it is a member, the ctl, given a bin dir with no etcd at all,
	// refuses a version its node lacks by its record, naming the node,
	// and leaves the spec as it was.
	harness.WaitFor(t, startTimeout, "the ctl to refuse etcd 3.6.99 by the member's record", func() bool {
		_, errOut, err = env.Ctl("--etcd-version=3.6.99", "--etcd-bin-dir=/nonexistent", "configure-cluster")
		return err != nil && strings.Contains(errOut, "no etcd 3.6.99 on node "+rec.NodeID+" (has ")
	})
	if out := env.MustCtl("get"); !strings.Contains(out, "etcdVersion: "+harness.DefaultEtcdVersion) {
		t.Errorf("the refused version was written:\n%s", out)
	}
}

// An agent whose store is unreachable at start keeps retrying, and carries
// on once it is back. In secure mode it first needs the store for the CA.
func TestUnreachableStoreIsRetried(t *testing.T) {
	for _, tt := range []struct {
		name     string
		insecure bool
		want     string
	}{
		{"insecure", true, "backup store unreachable; will retry"},
		{"secure", false, "cannot issue the node certificate; retrying"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := harness.NewEnv(t)
			env.Insecure = tt.insecure
			blocker := filepath.Join(env.Root, "blocker")
			if err := os.WriteFile(blocker, []byte("a file where the store's parent folder should be"), 0o644); err != nil {
				t.Fatal(err)
			}
			storeDir := filepath.Join(blocker, "backups")
			env.UseStore(harness.FileURL(storeDir), nil)
			a := env.StartAgent("1", harness.AgentOptions{})
			a.WaitLog(tt.want, 3, startTimeout)
			if !a.Running() {
				t.Fatal("agent exited on an unreachable store")
			}
			if !tt.insecure && !strings.Contains(a.Log(), "store unreachable") {
				t.Error("the agent's certificate error does not say the store is unreachable")
			}
			// ctl gives a clear error after its retries.
			_, _, err := env.CtlRaw("--backup-store="+harness.FileURL(storeDir), "--store-attempts=2", "get")
			if err == nil {
				t.Fatal("ctl get on an unreachable store succeeded")
			}
			// Once the store is reachable, the agent carries on by itself.
			if err := os.Remove(blocker); err != nil {
				t.Fatal(err)
			}
			env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
			a.WaitHealthy(startTimeout)
		})
	}
}

// Total loss: the store says a cluster was created, but no node has data.
// The agent must not create a new empty cluster.
func TestTotalLossGuard(t *testing.T) {
	env, a := startOne(t)
	put(t, a.Client(), "/k", "v")
	a.Stop()
	if err := os.RemoveAll(a.DataDir); err != nil {
		t.Fatal(err)
	}
	a.Start()
	a.WaitLog(plan.MsgNoMembers, 3, startTimeout)
	if a.EtcdPID() != 0 {
		t.Error("an etcd was started over lost data")
	}
	if _, err := os.Stat(filepath.Join(a.DataDir, "data")); err == nil {
		entries, _ := os.ReadDir(filepath.Join(a.DataDir, "data"))
		if len(entries) > 0 {
			t.Errorf("a new cluster's data appeared: %v", entries)
		}
	}
	_ = env
}
