package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/anishathalye/porcupine"

	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/store"
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
	fw     *harness.PeerFirewall // in front of every member's etcd peer URL and peer API
	w      *workload
	// round is the round under way, and initial the value its contended
	// keys started from (a restore starts them afresh).
	round   int
	initial string
	// pre is the history before a restore in the round, checked on its
	// own.
	pre *preRestore
}

// preRestore is a round's history up to a restore.
type preRestore struct {
	history     []porcupine.Operation
	acked       []string
	ops, failed int
	initial     string
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
	{"freeze-etcd", func(c *cluster, rng *rand.Rand) (string, error) {
		return c.freezeEtcd(rng)
	}},
	{"clock-behind", func(c *cluster, rng *rand.Rand) (string, error) {
		return c.clockBehind(rng)
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

// pauseAgent freezes a's agent with SIGSTOP for longer than the lease (its
// etcd runs on), then resumes it.
func pauseAgent(a *harness.Agent, d time.Duration) error {
	if err := syscall.Kill(a.PID(), syscall.SIGSTOP); err != nil {
		return err
	}
	if err := waitUntil(5*time.Second, a.Paused); err != nil {
		_ = syscall.Kill(a.PID(), syscall.SIGCONT)
		return fmt.Errorf("agent %s did not stop: %w", a.Name, err)
	}
	time.Sleep(d)
	return syscall.Kill(a.PID(), syscall.SIGCONT)
}

// lease is the agents' --leader-lease in the chaos suite (the harness's).
const lease = 2 * time.Second

// faultsOnAgents are the data-safety faults: stalled agents, agents cut
// off from their peers but not from the store, lost disks.
var faultsOnAgents = []fault{
	{"pause-agent", func(c *cluster, rng *rand.Rand) (string, error) {
		a, err := c.pick(rng, true)
		if err != nil {
			return "", err
		}
		d := lease*2 + time.Duration(rng.IntN(4000))*time.Millisecond
		what := "a backup"
		if rng.IntN(2) == 0 {
			// During a membership change: a wiped follower is removed and
			// added again by the leader's agent, which freezes meanwhile.
			f, err := c.pick(rng, false)
			if err != nil {
				return "", err
			}
			f.Kill()
			if err := os.RemoveAll(f.DataDir); err != nil {
				return "", err
			}
			f.Start()
			time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
			what = "the replacement of wiped follower " + f.Name
		} else if _, stderr, err := c.env.Ctl("backup-now", "--wait=false"); err != nil {
			return "", fmt.Errorf("backup-now: %v: %s", err, stderr)
		}
		if err := pauseAgent(a, d); err != nil {
			return "", err
		}
		return fmt.Sprintf("SIGSTOP of leader %s's agent for %s during %s", a.Name, d.Round(100*time.Millisecond), what), nil
	}},
	{"pause-agent-restore", func(c *cluster, rng *rand.Rand) (string, error) {
		return c.pausedRestore(rng)
	}},
	{"partition-agent", func(c *cluster, rng *rand.Rand) (string, error) {
		a := c.agents[rng.IntN(len(c.agents))]
		rule := harness.LinkRule{Blackhole: true, Agents: true}
		if rng.IntN(2) == 0 {
			rule = harness.LinkRule{Drop: true, Agents: true}
		}
		d := time.Duration(5+rng.IntN(8)) * time.Second
		start := time.Now()
		c.fw.Set(a.Name, rule)
		healed := false
		defer func() {
			if !healed {
				c.fw.Heal()
			}
		}()
		var rest []*harness.Agent
		for _, o := range c.agents {
			if o != a {
				rest = append(rest, o)
			}
		}
		if err := waitUntil(10*time.Second, func() bool { return !canRead(a) }); err != nil {
			return "", fmt.Errorf("agent %s cut off (%s): its etcd still serves linearizable reads: %w", a.Name, rule, err)
		}
		if err := waitUntil(10*time.Second, func() bool { return leaderAmong(rest) }); err != nil {
			return "", fmt.Errorf("agent %s cut off (%s): the others elect no leader: %w", a.Name, rule, err)
		}
		// Half the time, someone asks for a quorum recovery while the
		// cut-off agent sees no leader: it must never fork the cluster.
		recovery := ""
		if rng.IntN(2) == 0 {
			_, _, _ = c.env.Ctl("recover-quorum", "--timeout=1s") // only queues it
			recovery = ", with a recover-quorum queued"
		}
		time.Sleep(time.Until(start.Add(d)))
		c.fw.Heal()
		healed = true
		if recovery != "" {
			// It ends refused (the cluster never lost quorum); clear it.
			if err := waitUntil(time.Minute, func() bool {
				out, _, err := c.env.Ctl("list-commands")
				return err == nil && !strings.Contains(out, "recover-quorum  pending") && !strings.Contains(out, "recover-quorum  running")
			}); err != nil {
				return "", fmt.Errorf("the recover-quorum queued during the partition did not end: %w", err)
			}
			out, _, _ := c.env.Ctl("list-commands")
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "recover-quorum") {
					if !strings.Contains(line, "quorum is not lost") {
						return "", fmt.Errorf("the recover-quorum queued during the partition ended otherwise than refused: %s", line)
					}
					c.env.MustCtl("delete-command", strings.Fields(line)[0])
				}
			}
		}
		return fmt.Sprintf("agent %s (etcd and peer API, not the store) cut off from its peers (%s) for %s%s", a.Name, rule, d, recovery), nil
	}},
	{"lose-disk", func(c *cluster, rng *rand.Rand) (string, error) {
		a, err := c.pick(rng, rng.IntN(2) == 0)
		if err != nil {
			return "", err
		}
		before, err := memberID(a)
		if err != nil {
			return "", err
		}
		if err := os.RemoveAll(filepath.Join(a.DataDir, "data")); err != nil {
			return "", err
		}
		if err := killEtcd(a); err != nil {
			return "", err
		}
		killed := time.Now()
		// The node must come back as a new member, never as the old one
		// on an empty data dir.
		if err := waitUntil(recoveryBound, func() bool {
			id, err := memberID(a)
			return err == nil && id != before
		}); err != nil {
			return "", fmt.Errorf("member %s did not come back as a new member: %w", a.Name, err)
		}
		return fmt.Sprintf("data dir of %s deleted under its running agent, then its etcd killed; back as a new member after %s",
			a.Name, time.Since(killed).Round(100*time.Millisecond)), nil
	}},
}

// memberID is a's etcd's member ID.
func memberID(a *harness.Agent) (uint64, error) {
	c, err := memberClient(a)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := c.Status(ctx, a.ClientURL)
	if err != nil {
		return 0, err
	}
	return st.Header.MemberId, nil
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

// commandRow is one line of list-commands -o json.
type commandRow struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"`
	State  string `json:"state"`
	Detail string `json:"detail"`
}

func (c *cluster) commands() ([]commandRow, error) {
	out, stderr, err := c.env.Ctl("list-commands", "--output=json")
	if err != nil {
		return nil, fmt.Errorf("list-commands: %v: %s", err, stderr)
	}
	var rows []commandRow
	return rows, json.Unmarshal([]byte(out), &rows)
}

// freezeEtcd stops (SIGSTOP) the etcd of one or two members for a few
// seconds: a stalled disk, a paused VM. With two frozen, half the time a
// recover-quorum is queued meanwhile; their agents answer, with the data
// on their disks, so stalled is not lost: nothing may be forced, and the
// command is refused once they thaw.
func (c *cluster) freezeEtcd(rng *rand.Rand) (string, error) {
	n := 1 + rng.IntN(2)
	var frozen []*harness.Agent
	var names []string
	for _, i := range rng.Perm(len(c.agents))[:n] {
		a := c.agents[i]
		pid := a.EtcdPID()
		if pid == 0 {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return "", err
		}
		frozen = append(frozen, a)
		names = append(names, a.Name)
	}
	thaw := func() {
		for _, a := range frozen {
			if pid := a.EtcdPID(); pid != 0 {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		}
	}
	defer thaw()
	// A few seconds: long enough for the survivor to see no leader and
	// the engine to judge, short enough for the history of a frozen
	// majority (every write meanwhile in doubt) to stay checkable.
	d := time.Duration(3+rng.IntN(4)) * time.Second
	start := time.Now()
	queued := len(frozen) == 2 && rng.IntN(2) == 0
	if queued {
		time.Sleep(1500 * time.Millisecond)                   // once the survivor sees no leader
		_, _, _ = c.env.Ctl("recover-quorum", "--timeout=1s") // only queues it
	}
	time.Sleep(time.Until(start.Add(d)))
	thaw()
	what := fmt.Sprintf("SIGSTOP etcd of %s for %s", strings.Join(names, ", "), d)
	if !queued {
		return what, nil
	}
	// The command ends refused, never done: a done recover-quorum forced
	// a member out of a majority that was only frozen.
	err := waitUntil(2*time.Minute, func() bool {
		rows, err := c.commands()
		if err != nil {
			return false
		}
		for _, r := range rows {
			if r.Kind == "recover-quorum" && r.State != "failed" {
				return false
			}
		}
		return true
	})
	if err != nil {
		return "", fmt.Errorf("the recover-quorum queued while %s were frozen did not end refused: %w", strings.Join(names, ", "), err)
	}
	for _, a := range c.agents {
		if strings.Contains(a.Log(), "restarting etcd with --force-new-cluster") {
			return "", fmt.Errorf("agent %s forced a new cluster while %s were only frozen", a.Name, strings.Join(names, ", "))
		}
	}
	return what + ", with a recover-quorum queued meanwhile, refused once they thawed", nil
}

// pausedRestore: the workload stops, a backup is taken, and its restore
// runs while the agent driving it freezes for longer than the lease. The
// restored state must equal the backup's exactly. The history before the
// restore is checked on its own; the round's history starts afresh after
// it, from the restored values (a restore rolls back by design).
func (c *cluster) pausedRestore(rng *rand.Rand) (string, error) {
	c.w.halt()
	history, acked, ops, failed := c.w.take()
	c.pre = &preRestore{history: history, acked: acked, ops: ops, failed: failed, initial: c.initial}
	out, stderr, err := c.env.Ctl("backup-now", "--timeout=1m")
	if err != nil {
		return "", fmt.Errorf("backup-now: %v: %s", err, stderr)
	}
	backupName := strings.TrimSpace(out)
	want, err := chaosKeys(c.agents)
	if err != nil {
		return "", err
	}
	if _, stderr, err := c.env.Ctl("restore-backup", backupName, "--wait=false"); err != nil {
		return "", fmt.Errorf("restore-backup: %v: %s", err, stderr)
	}
	// The driver is the store lock's holder once the restore has begun.
	var driver *harness.Agent
	if err := waitUntil(time.Minute, func() bool {
		holder := lockHolder(c.env)
		for _, a := range c.agents {
			if holder != "" && a.NodeID() == holder {
				driver = a
				return true
			}
		}
		return false
	}); err != nil {
		return "", fmt.Errorf("no agent took the store lock for the restore: %w", err)
	}
	time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
	d := lease*2 + time.Duration(rng.IntN(3000))*time.Millisecond
	if err := pauseAgent(driver, d); err != nil {
		return "", err
	}
	if err := waitUntil(recoveryBound, func() bool {
		rows, err := c.commands()
		return err == nil && !slices.ContainsFunc(rows, func(r commandRow) bool { return r.Kind == "restore-backup" })
	}); err != nil {
		rows, _ := c.commands()
		return "", fmt.Errorf("the restore did not complete: %w (queue %+v)", err, rows)
	}
	if err := waitWhole(c.agents, recoveryBound); err != nil {
		return "", fmt.Errorf("not whole after the restore: %w", err)
	}
	got, err := chaosKeys(c.agents)
	if err != nil {
		return "", err
	}
	if !maps.Equal(got, want) {
		return "", fmt.Errorf("the restored state differs from the backup's: %d keys restored, %d backed up", len(got), len(want))
	}
	c.initial = fmt.Sprintf("%s-restored", c.initial)
	if err := resetKeys(c.agents, c.initial); err != nil {
		return "", fmt.Errorf("after the restore: %w", err)
	}
	c.w.run(c.round, int((roundLoad+recoveryBound).Seconds())*rate)
	return fmt.Sprintf("restore of %s (%d keys) with its driver %s frozen for %s; restored exactly", backupName, len(want), driver.Name, d.Round(100*time.Millisecond)), nil
}

// chaosKeys reads every key the workload writes, linearizably.
func chaosKeys(agents []*harness.Agent) (map[string]string, error) {
	cl, err := client(agents)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cl.Get(ctx, "/chaos/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the workload's keys: %w", err)
	}
	out := make(map[string]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out, nil
}

// lockHolder is the node ID of the agent that says (in status) it drives
// a procedure, "" if none does.
func lockHolder(env *harness.Env) string {
	out, _, err := env.Ctl("status", "--output=json")
	if err != nil {
		return ""
	}
	var st struct {
		Agents []struct {
			ID        string `json:"id"`
			Procedure string `json:"procedure"`
		} `json:"agents"`
	}
	_ = json.Unmarshal([]byte(out), &st)
	for _, a := range st.Agents {
		if a.Procedure != "" {
			return a.ID
		}
	}
	return ""
}

// clockBehind sets the clock of the leader's capture back by 10 s to a
// minute, through the test hook, for a few seconds while the workload
// writes. Capture's times must stay monotonic: the moment just before the
// fault still maps to a revision before the first write acknowledged
// after it, as etcd numbered them.
func (c *cluster) clockBehind(rng *rand.Rand) (string, error) {
	a, err := c.pick(rng, true) // the leader captures
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := store.Open(ctx, c.env.StoreURL, store.Options{})
	if err != nil {
		return "", err
	}
	defer s.Close()
	cl, err := memberClient(a)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	before, err := cl.Put(ctx, "chaos-clock", "before")
	if err != nil {
		return "", fmt.Errorf("a put before the fault: %w", err)
	}
	if err := waitUntil(30*time.Second, func() bool { return harness.CapturedTo(ctx, s) >= before.Header.Revision }); err != nil {
		return "", fmt.Errorf("capture of the put before the fault: %w", err)
	}
	time.Sleep(100 * time.Millisecond)
	at := time.Now()
	time.Sleep(100 * time.Millisecond)
	back := time.Duration(10+rng.IntN(51)) * time.Second
	if err := a.SetClockOffset(-back); err != nil {
		return "", err
	}
	defer func() { _ = a.SetClockOffset(0) }()
	time.Sleep(300 * time.Millisecond) // the hook reads the file every 100 ms
	after, err := cl.Put(ctx, "chaos-clock", "after")
	if err != nil {
		return "", fmt.Errorf("a put during the fault: %w", err)
	}
	d := time.Duration(3+rng.IntN(4)) * time.Second
	time.Sleep(d)
	if err := a.SetClockOffset(0); err != nil {
		return "", err
	}
	what := fmt.Sprintf("the capture clock of %s set back %s for %s", a.Name, back, d)
	if err := waitUntil(30*time.Second, func() bool { return harness.CapturedTo(ctx, s) >= after.Header.Revision }); err != nil {
		// Leadership may have moved meanwhile; capture goes on elsewhere.
		return what + "; the put during it was not captured within 30 s", nil
	}
	// The current timeline: the one captured last.
	tls, err := changelog.Timelines(ctx, s)
	if err != nil {
		return "", err
	}
	current, newest := "", time.Time{}
	for _, tl := range tls {
		runs, err := changelog.Runs(ctx, s, tl)
		if err != nil {
			return "", err
		}
		if n := len(runs); n > 0 && runs[n-1].LastTime.After(newest) {
			current, newest = tl, runs[n-1].LastTime
		}
	}
	rev, ok, err := changelog.RevisionAt(ctx, s, current, at, nil)
	if err != nil {
		return "", err
	}
	if ok && rev >= after.Header.Revision {
		return "", fmt.Errorf("%s: --to-time just before the fault resolves to revision %d on timeline %s, at or after the put acknowledged after it (%d)",
			what, rev, current, after.Header.Revision)
	}
	return what, nil
}
