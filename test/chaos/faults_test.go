package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// A fault is injected by inject, which returns once the fault is over
// (the killed process may be back or not: recovering is the agents' job)
// and says what it did.
type fault struct {
	name   string
	inject func(c *cluster, rng *rand.Rand) (string, error)
}

// cluster is what a fault acts on.
type cluster struct {
	env    *harness.Env
	agents []*harness.Agent
	minio  *harness.MinIO
	fw     *harness.PeerFirewall // in front of every member's peer URL
}

var faults = []fault{
	{"kill-etcd-follower", func(c *cluster, rng *rand.Rand) (string, error) {
		a, err := c.pick(rng, false)
		if err != nil {
			return "", err
		}
		return "SIGKILL etcd of follower " + a.Name, killEtcd(a)
	}},
	{"kill-etcd-leader", func(c *cluster, rng *rand.Rand) (string, error) {
		a, err := c.pick(rng, true)
		if err != nil {
			return "", err
		}
		return "SIGKILL etcd of leader " + a.Name, killEtcd(a)
	}},
	{"kill-agent", func(c *cluster, rng *rand.Rand) (string, error) {
		a := c.agents[rng.IntN(len(c.agents))]
		a.Kill() // its etcd dies with it (parent-death signal)
		time.Sleep(time.Second)
		a.Start()
		return "SIGKILL agent " + a.Name + ", restarted after 1s", nil
	}},
	{"wipe-node", func(c *cluster, rng *rand.Rand) (string, error) {
		a, err := c.pick(rng, rng.IntN(2) == 0)
		if err != nil {
			return "", err
		}
		a.Kill()
		if err := os.RemoveAll(a.DataDir); err != nil {
			return "", err
		}
		a.Start()
		return "SIGKILL agent and etcd of " + a.Name + ", data dir wiped, agent restarted", nil
	}},
	{"partition-follower", func(c *cluster, rng *rand.Rand) (string, error) {
		a, err := c.pick(rng, false)
		if err != nil {
			return "", err
		}
		return c.partition(rng, a, "follower")
	}},
	{"partition-leader", func(c *cluster, rng *rand.Rand) (string, error) {
		a, err := c.pick(rng, true)
		if err != nil {
			return "", err
		}
		return c.partition(rng, a, "leader")
	}},
	{"slow-peer", func(c *cluster, rng *rand.Rand) (string, error) {
		a := c.agents[rng.IntN(len(c.agents))]
		delay := time.Duration(20+rng.IntN(81)) * time.Millisecond
		d := time.Duration(5+rng.IntN(6)) * time.Second
		start := time.Now()
		c.fw.Set(a.Name, harness.LinkRule{Delay: delay})
		defer c.fw.Heal()
		// A write through a crosses its links at least once each way.
		if took, err := putVia(a); err != nil || took < 2*delay {
			return "", fmt.Errorf("a put through %s with its links delayed %s took %s (%v); want at least twice the delay", a.Name, delay, took, err)
		}
		time.Sleep(time.Until(start.Add(d)))
		return fmt.Sprintf("every peer link of %s delayed %s each way for %s", a.Name, delay, d), nil
	}},
	{"restart-all", func(c *cluster, rng *rand.Rand) (string, error) {
		for _, a := range c.agents {
			a.Kill()
		}
		for _, a := range c.agents {
			a.Start()
		}
		return "SIGKILL every agent and etcd, all restarted at once", nil
	}},
	{"store-outage", func(c *cluster, rng *rand.Rand) (string, error) {
		c.minio.Stop()
		d := time.Duration(5+rng.IntN(10)) * time.Second
		time.Sleep(d)
		c.minio.Start()
		return fmt.Sprintf("backup store (MinIO) down for %s", d), nil
	}},
	{"temp-disk-full", func(c *cluster, rng *rand.Rand) (string, error) {
		a, err := c.pick(rng, true) // the leader takes the backups
		if err != nil {
			return "", err
		}
		tmp := filepath.Join(a.DataDir, "tmp")
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			return "", err
		}
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", tmp).CombinedOutput(); err != nil {
			return "", fmt.Errorf("mount a 16 KiB tmpfs (the chaos suite runs as root): %v: %s", err, out)
		}
		// A backup now fails on the full disk, and says so; etcd must not
		// notice.
		_, stderr, err := c.env.Ctl("backup-now", "--timeout=20s")
		if out, uerr := exec.Command("umount", tmp).CombinedOutput(); uerr != nil {
			return "", fmt.Errorf("umount: %v: %s", uerr, out)
		}
		if err == nil || !strings.Contains(stderr, "temp disk full") {
			return "", fmt.Errorf("backup-now on a full temp disk: %v, %q; want a failure that says the temp disk is full", err, stderr)
		}
		return "a 16 KiB temp disk under leader " + a.Name + " during a backup-now, which failed saying so", nil
	}},
}

// partition cuts a off from its peers, by blackhole or by drop, for 4 to
// 12 s. It checks that the partition took: a can no longer serve a
// linearizable read, and the others elect a leader among themselves.
func (c *cluster) partition(rng *rand.Rand, a *harness.Agent, role string) (string, error) {
	rule := harness.LinkRule{Blackhole: true}
	if rng.IntN(2) == 0 {
		rule = harness.LinkRule{Drop: true}
	}
	d := time.Duration(4+rng.IntN(9)) * time.Second
	start := time.Now()
	c.fw.Set(a.Name, rule)
	defer c.fw.Heal()
	var rest []*harness.Agent
	for _, o := range c.agents {
		if o != a {
			rest = append(rest, o)
		}
	}
	if err := waitUntil(10*time.Second, func() bool { return !canRead(a) }); err != nil {
		return "", fmt.Errorf("%s %s of %s: it still serves linearizable reads: %w", rule, role, a.Name, err)
	}
	if err := waitUntil(10*time.Second, func() bool { return leaderAmong(rest) }); err != nil {
		return "", fmt.Errorf("%s %s of %s: the other members elect no leader among themselves: %w", rule, role, a.Name, err)
	}
	time.Sleep(time.Until(start.Add(d)))
	return fmt.Sprintf("%s cut off from its peers (%s) for %s", role+" "+a.Name, rule, time.Since(start).Round(100*time.Millisecond)), nil
}

func waitUntil(bound time.Duration, cond func() bool) error {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if cond() {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not within %s", bound)
}

// canRead says whether a's etcd answers a linearizable read within 1 s.
func canRead(a *harness.Agent) bool {
	cl, err := memberClient(a)
	if err != nil {
		return false
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = cl.Get(ctx, "chaos-probe")
	return err == nil
}

// putVia times a put through a's etcd alone.
func putVia(a *harness.Agent) (time.Duration, error) {
	cl, err := memberClient(a)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = cl.Put(ctx, "chaos-probe", "x")
	return time.Since(start), err
}

// leaderAmong says whether one of agents' etcds is the raft leader.
func leaderAmong(agents []*harness.Agent) bool {
	for _, a := range agents {
		if ok, err := isRaftLeader(a); err == nil && ok {
			return true
		}
	}
	return false
}

func killEtcd(a *harness.Agent) error {
	pid := a.EtcdPID()
	if pid <= 0 {
		return fmt.Errorf("agent %s runs no etcd", a.Name)
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// pick returns the agent beside etcd's raft leader, or a random follower.
func (c *cluster) pick(rng *rand.Rand, leader bool) (*harness.Agent, error) {
	var followers []*harness.Agent
	for _, a := range c.agents {
		isLeader, err := isRaftLeader(a)
		if err != nil {
			continue
		}
		if isLeader && leader {
			return a, nil
		}
		if !isLeader {
			followers = append(followers, a)
		}
	}
	if leader || len(followers) == 0 {
		return nil, fmt.Errorf("no %s found", map[bool]string{true: "leader", false: "follower"}[leader])
	}
	return followers[rng.IntN(len(followers))], nil
}

func isRaftLeader(a *harness.Agent) (bool, error) {
	c, err := memberClient(a)
	if err != nil {
		return false, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := c.Status(ctx, a.ClientURL)
	if err != nil {
		return false, err
	}
	return st.Leader == st.Header.MemberId, nil
}

// memberClient is a client of a's etcd alone.
func memberClient(a *harness.Agent) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL}, TLS: a.TLS(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
}
