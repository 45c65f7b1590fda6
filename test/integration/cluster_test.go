package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

const settleTimeout = 90 * time.Second

// startCluster configures a cluster of members and starts agents for it,
// then waits until it has settled and returns what it settled as.
func startCluster(t *testing.T, members, agents int, opts harness.AgentOptions) (*harness.Env, []*harness.Agent, harness.ClusterState) {
	t.Helper()
	env := harness.NewEnv(t)
	env.MustCtl(fmt.Sprintf("--member-count=%d", members), "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	as := env.StartAgents(agents, opts)
	cs := harness.WaitSettled(t, as, members, settleTimeout)
	return env, as, cs
}

func clusterClient(t *testing.T, agents []*harness.Agent) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: harness.Endpoints(agents), TLS: agents[0].TLS(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestFormation(t *testing.T) {
	for _, tt := range []struct {
		n        int
		insecure bool
	}{{1, false}, {3, false}, {5, false}, {3, true}} {
		name := fmt.Sprintf("members=%d", tt.n)
		if tt.insecure {
			name += "-insecure"
		}
		t.Run(name, func(t *testing.T) {
			env := harness.NewEnv(t)
			env.Insecure = tt.insecure
			env.MustCtl(fmt.Sprintf("--member-count=%d", tt.n), "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
			agents := env.StartAgents(tt.n, harness.AgentOptions{})
			cs := harness.WaitSettled(t, agents, tt.n, settleTimeout)
			t.Logf("formed: %+v", cs)
			c := clusterClient(t, agents)
			put(t, c, "/formed", "yes")
			if got := get(t, c, "/formed"); got != "yes" {
				t.Fatalf("got %q", got)
			}
			// status shows each agent as of its last cycle.
			harness.WaitFor(t, 20*time.Second, "status to show every member healthy", func() bool {
				out, _, err := env.Ctl("status")
				return err == nil && strings.Count(out, " healthy ") == tt.n
			})
			wantScheme := "https://"
			if tt.insecure {
				wantScheme = "http://"
			}
			if !strings.HasPrefix(agents[0].ClientURL, wantScheme) {
				t.Errorf("client URL %s, want %s", agents[0].ClientURL, wantScheme)
			}
		})
	}
}

// Extra agents beyond the member count stay on standby and say so.
func TestStandby(t *testing.T) {
	env, agents, _ := startCluster(t, 3, 4, harness.AgentOptions{})
	standby := 0
	for _, a := range agents {
		if a.EtcdPID() == 0 {
			standby++
			a.WaitLog("standby: not an etcd member", 1, 10*time.Second)
		}
	}
	if standby != 1 {
		t.Errorf("%d agents without etcd, want 1 standby", standby)
	}

	// status shows every agent's role, with the spec and the leader.
	harness.WaitFor(t, 20*time.Second, "status to show a leader, 2 members and a standby", func() bool {
		out, _, err := env.Ctl("status")
		return err == nil && strings.Count(out, " leader ") == 1 && strings.Count(out, " member ") == 2 &&
			strings.Count(out, " standby ") == 1 && strings.Contains(out, "spec:   memberCount=3 etcdVersion=3.6.16")
	})
	// Health is reported as of each agent's last cycle, so a member that has
	// just started may show as unhealthy for a moment.
	var st cli.ClusterStatus
	harness.WaitFor(t, 20*time.Second, "status -o json to show 4 agents, healthy members and the etcd leader", func() bool {
		out, _, err := env.Ctl("status", "-o", "json")
		if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.Leader == "" || st.EtcdLeader == "" || len(st.Agents) != 4 {
			return false
		}
		for _, a := range st.Agents {
			if a.Role != "standby" && (!a.Healthy || a.EtcdVersion != harness.DefaultEtcdVersion || a.DBSize == 0) {
				return false
			}
		}
		return true
	})
	// The etcd leader is the member etcd itself names, whichever agent
	// leads the manager.
	var leaderID string
	for _, a := range st.Agents {
		if a.EtcdLeader {
			if leaderID != "" || a.ID != st.EtcdLeader || a.Role == "standby" {
				t.Fatalf("etcd leader %q, agents %+v", st.EtcdLeader, st.Agents)
			}
			leaderID = a.MemberID
		}
	}
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var raftLeader uint64
	for _, a := range agents {
		if a.ClientURL == "" || a.EtcdPID() == 0 {
			continue
		}
		if resp, err := c.Status(ctx, a.ClientURL); err == nil {
			raftLeader = resp.Leader
			break
		}
	}
	if got := fmt.Sprintf("%x", raftLeader); got != leaderID {
		t.Errorf("status names member %s as the etcd leader, etcd says %s", leaderID, got)
	}
	// With an agent down, status still answers and names the unreachable one.
	agents[3].Kill()
	out, _, err := env.Ctl("status")
	if err != nil || !strings.Contains(out, "unreachable: "+agents[3].PeerAPI) {
		t.Errorf("status with an agent down: %v\n%s", err, out)
	}
}

func TestResizeKeepsKeys(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(5, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 1, settleTimeout)
	c := clusterClient(t, agents)
	var keys []string
	for i, n := range []int{1, 3, 5, 3, 1} {
		env.MustCtl(fmt.Sprintf("--member-count=%d", n), "configure-cluster")
		harness.WaitSettled(t, agents, n, settleTimeout)
		key := fmt.Sprintf("/resize/%d", i)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := c.Put(ctx, key, fmt.Sprint(n))
		cancel()
		if err != nil {
			t.Fatalf("put after resize to %d: %v", n, err)
		}
		keys = append(keys, key)
		for _, k := range keys {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			resp, err := c.Get(ctx, k)
			cancel()
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("after resize to %d, key %s: %v %v", n, k, resp, err)
			}
		}
		t.Logf("resized to %d, %d keys intact", n, len(keys))
	}
	// Removed agents stopped etcd and moved their data to the trash; nothing
	// was deleted.
	for _, a := range agents {
		if a.EtcdPID() != 0 {
			continue
		}
		trash, _ := os.ReadDir(filepath.Join(a.DataDir, "trash"))
		data, _ := os.ReadDir(filepath.Join(a.DataDir, "data"))
		if len(trash) == 0 || len(data) != 0 {
			t.Errorf("removed agent %s: %d trash entries, %d data folders; want its data in the trash", a.Name, len(trash), len(data))
		}
		for _, e := range trash {
			if _, err := os.Stat(filepath.Join(a.DataDir, "trash", e.Name(), "member", "snap", "db")); err != nil {
				t.Errorf("agent %s trash %s lacks the etcd db: %v", a.Name, e.Name(), err)
			}
		}
	}
}

// The walkthrough's shared-directory discovery forms a cluster too.
func TestFileDiscovery(t *testing.T) {
	env := harness.NewEnv(t)
	dir := filepath.Join(env.Root, "discovery")
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{ExtraArgs: []string{"--discovery=file://" + dir}})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 3 {
		t.Fatalf("discovery dir holds %d records (%v), want 3", len(entries), err)
	}
	// Their records in the store are the evidence of what each saw (for a
	// recover-quorum), whatever the discovery.
	if records, err := os.ReadDir(filepath.Join(env.StoreDir, "discovery")); err != nil || len(records) != 3 {
		t.Errorf("the store holds %d agent records (%v), want 3", len(records), err)
	}
	// Health is reported as of each agent's last cycle.
	harness.WaitFor(t, 20*time.Second, "status through file discovery to show 3 healthy members", func() bool {
		out, _, err := env.Ctl("--discovery=file://"+dir, "--cluster-name=test", "status")
		return err == nil && strings.Count(out, " healthy ") == 3 && strings.Count(out, " leader ") == 1
	})
}
