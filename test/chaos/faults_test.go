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
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL}, TLS: a.TLS(), DialTimeout: time.Second, Logger: zap.NewNop()})
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
