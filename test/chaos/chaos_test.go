// Package chaos runs a 3-member etcd-manager cluster in secure mode under
// a steady workload, injects one fault per round, and checks after each
// that the cluster is whole again, that its members agree (HashKV), that
// no acknowledged write is lost, and that porcupine finds the history
// linearizable. Every member's etcd peer URL and agent peer API is fronted
// by a proxy of a harness.PeerFirewall, which partitions, drops and
// delays peer traffic; the backup store is never behind it.
// `make test` runs a few rounds; `make chaos ROUNDS=N` runs N.
// CHAOS_SEED replays a run, CHAOS_FAULTS=name,... limits the faults
// drawn, and CHAOS_REPORT_DIR is where the JSON report (and, on failure,
// the history and every log) goes.
package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

const (
	members = 3
	// recoveryBound is how long the cluster may take to be whole again
	// after a fault.
	recoveryBound = 2 * time.Minute
	roundLoad     = 4 * time.Second // workload before and after each fault
	rate          = 250             // operations per second, all clients
	clientCount   = 8               // connections
	workerCount   = 96              // sequential workers over the connections: enough to keep the rate while a slow link makes requests take 0.4 s
	checkTimeout  = time.Minute     // porcupine's budget per round
)

type roundReport struct {
	Round      int      `json:"round"`
	Fault      string   `json:"fault"`
	Detail     string   `json:"detail"`
	RecoveryS  float64  `json:"recoverySeconds"`
	Ops        int      `json:"ops"`
	Checked    int      `json:"opsChecked"`
	Failed     int      `json:"opsFailed"`
	OpsPerSec  float64  `json:"opsPerSecond"`
	Lost       int      `json:"lostWrites"`
	Violations int      `json:"violations"`
	CheckS     float64  `json:"checkSeconds"` // porcupine's time
	Problems   []string `json:"problems,omitempty"`
}

type report struct {
	Seed          uint64         `json:"seed"`
	Rounds        []roundReport  `json:"rounds"`
	FaultsByKind  map[string]int `json:"faultsByKind"`
	OpsChecked    int            `json:"opsChecked"`
	Violations    int            `json:"violations"`
	WorstRecovery float64        `json:"worstRecoverySeconds"`
	MinOpsPerSec  float64        `json:"minOpsPerSecond"` // the slowest round's rate
	WorstCheck    float64        `json:"worstCheckSeconds"`
	Summary       string         `json:"summary"`
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func TestChaos(t *testing.T) {
	rounds := envInt("CHAOS_ROUNDS", 3)
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("CHAOS_SEED"), 10, 64); err == nil {
		seed = s
	}
	dir := os.Getenv("CHAOS_REPORT_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("etcd-manager-chaos-%d", seed))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Every agent's whole log is kept there if the test fails.
	t.Setenv("ETCD_MANAGER_TEST_LOGS", filepath.Join(dir, "logs"))
	fmt.Printf("chaos: seed %d (replay with CHAOS_SEED=%d), %d rounds, report in %s\n", seed, seed, rounds, dir)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	all := slices.Concat(faults, faultsOnAgents)
	drawn := all
	if only := os.Getenv("CHAOS_FAULTS"); only != "" {
		drawn = nil
		for _, name := range strings.Split(only, ",") {
			i := slices.IndexFunc(all, func(f fault) bool { return f.name == name })
			if i < 0 {
				t.Fatalf("CHAOS_FAULTS: no fault %q", name)
			}
			drawn = append(drawn, all[i])
		}
	}

	minio := harness.StartMinIO(t)
	minio.CreateBucket(t, "chaos")
	env := harness.NewEnv(t)
	env.UseStore(minio.StoreURL("chaos", "etcd/main"), minio.Env())
	// Faults that read the store themselves (clock-behind) use MinIO's
	// credentials, and never a cloud's metadata service.
	for _, kv := range minio.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	env.MustCtl(fmt.Sprintf("--member-count=%d", members), "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	fw := harness.NewPeerFirewall(t)
	agents := env.StartAgents(members, harness.AgentOptions{PeerFirewall: fw, ExtraArgs: []string{"--member-failure-grace=5s", "--backup-interval=1m", "--backup-retry-delay=2s"}})
	harness.WaitSettled(t, agents, members, recoveryBound)
	c := &cluster{env: env, agents: agents, minio: minio, fw: fw}
	// Every member's peer traffic crosses the proxies, tagged by source.
	allTagged := func() bool {
		tags := fw.Tagged()
		return !slices.ContainsFunc(agents, func(a *harness.Agent) bool { return tags[a.Name] == 0 })
	}
	if err := waitUntil(10*time.Second, allTagged); err != nil {
		t.Fatalf("peer connections tagged by source member: %v, want all %d members: %v", fw.Tagged(), members, err)
	}

	w, err := newWorkload(harness.Endpoints(agents), env.ClientTLS(), clientCount, workerCount, rate, seed)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	c.w = w

	rep := report{Seed: seed, FaultsByKind: map[string]int{}}
	write := func() {
		data, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(filepath.Join(dir, "report.json"), data, 0o644); err != nil {
			t.Error(err)
		}
	}
	for r := 1; r <= rounds; r++ {
		f := drawn[rng.IntN(len(drawn))]
		rr := runRound(t, c, w, r, f, rng, dir)
		rep.Rounds = append(rep.Rounds, rr)
		rep.FaultsByKind[f.name]++
		rep.OpsChecked += rr.Checked
		rep.Violations += rr.Violations
		rep.WorstRecovery = max(rep.WorstRecovery, rr.RecoveryS)
		rep.WorstCheck = max(rep.WorstCheck, rr.CheckS)
		if r == 1 || rr.OpsPerSec < rep.MinOpsPerSec {
			rep.MinOpsPerSec = rr.OpsPerSec
		}
		t.Logf("round %d: %s (%s): recovered in %.1fs; %d ops (%.0f/s), %d checked in %.1fs, %d failed, %d lost, %d violations %v",
			r, f.name, rr.Detail, rr.RecoveryS, rr.Ops, rr.OpsPerSec, rr.Checked, rr.CheckS, rr.Failed, rr.Lost, rr.Violations, rr.Problems)
		write()
		if len(rr.Problems) > 0 {
			t.Errorf("round %d (%s): %s", r, f.name, strings.Join(rr.Problems, "; "))
			break
		}
	}
	var kinds []string
	for k, n := range rep.FaultsByKind {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(kinds)
	rep.Summary = fmt.Sprintf("chaos: %d rounds, %d faults, %d ops checked, %d violations, worst recovery %.1fs",
		len(rep.Rounds), len(rep.Rounds), rep.OpsChecked, rep.Violations, rep.WorstRecovery)
	write()
	if err := os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(rep.Summary+"\n"), 0o644); err != nil {
		t.Error(err)
	}
	fmt.Println("chaos: faults by kind:", strings.Join(kinds, " "))
	fmt.Printf("chaos: the slowest round ran at %.0f ops/s (target %d); porcupine took at most %.1fs on a round\n", rep.MinOpsPerSec, rate, rep.WorstCheck)
	fmt.Println(rep.Summary)
}

// runRound: the workload runs, the fault strikes, the cluster must be
// whole again within recoveryBound, the workload runs on, then it stops
// and the round is checked.
func runRound(t *testing.T, c *cluster, w *workload, round int, f fault, rng *rand.Rand, dir string) roundReport {
	rr := roundReport{Round: round, Fault: f.name}
	c.round, c.initial, c.pre = round, fmt.Sprintf("init-%d", round), nil
	if err := resetKeys(c.agents, c.initial); err != nil {
		rr.Problems = append(rr.Problems, "cannot set the round's initial values: "+err.Error())
		return rr
	}
	began := time.Now()
	w.run(round, int((2*roundLoad+recoveryBound).Seconds())*rate)
	time.Sleep(roundLoad)
	detail, err := f.inject(c, rng)
	rr.Detail = detail
	if err != nil {
		w.halt()
		rr.Problems = append(rr.Problems, "fault injection failed: "+err.Error())
		return rr
	}
	struck := time.Now()
	if err := waitWhole(c.agents, recoveryBound); err != nil {
		rr.Problems = append(rr.Problems, fmt.Sprintf("not whole within %s: %v", recoveryBound, err))
	}
	rr.RecoveryS = time.Since(struck).Seconds()
	time.Sleep(roundLoad)
	w.halt()
	elapsed := time.Since(began)

	history, acked, ops, failed := w.take()
	if p := c.pre; p != nil {
		// The history before the restore, checked on its own; its
		// acknowledged writes were all in the backup, so none is lost.
		rr.Problems = append(rr.Problems, check(p.history, p.initial, dir, round, "before-restore", &rr)...)
		acked = append(acked, p.acked...)
		ops, failed = ops+p.ops, failed+p.failed
		rr.Checked += len(p.history)
	}
	rr.Ops, rr.Failed, rr.Checked = ops, failed, rr.Checked+len(history)
	rr.OpsPerSec = float64(ops) / elapsed.Seconds()
	if err := hashKVAgree(c.agents); err != nil {
		rr.Problems = append(rr.Problems, err.Error())
	}
	lost, err := lostWrites(c.agents, acked)
	if err != nil {
		rr.Problems = append(rr.Problems, "cannot read the log keys: "+err.Error())
	}
	rr.Lost = len(lost)
	if len(lost) > 0 {
		rr.Problems = append(rr.Problems, fmt.Sprintf("%d acknowledged writes lost, first %s", len(lost), lost[0]))
	}
	rr.Problems = append(rr.Problems, check(history, c.initial, dir, round, "history", &rr)...)
	return rr
}

// check runs porcupine on a history whose contended keys started at
// initial, and keeps the history (and its picture, if illegal) in dir
// when it fails.
func check(history []porcupine.Operation, initial, dir string, round int, name string, rr *roundReport) []string {
	var problems []string
	checkStart := time.Now()
	res, info := porcupine.CheckOperationsVerbose(kvModel(initial), history, checkTimeout)
	rr.CheckS += time.Since(checkStart).Seconds()
	switch res {
	case porcupine.Illegal:
		rr.Violations++
		problems = append(problems, "porcupine: the "+name+" is not linearizable")
		_ = porcupine.VisualizePath(kvModel(initial), info, filepath.Join(dir, fmt.Sprintf("round-%d-%s.html", round, name)))
	case porcupine.Unknown:
		problems = append(problems, fmt.Sprintf("porcupine could not decide on the %s within %s", name, checkTimeout))
	}
	if len(problems) > 0 {
		data, _ := json.Marshal(history)
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("round-%d-%s.json", round, name)), data, 0o644)
	}
	return problems
}

func client(agents []*harness.Agent) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: harness.Endpoints(agents), TLS: agents[0].TLS(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
}

// resetKeys sets every contended key to the round's initial value, with
// the workload stopped.
func resetKeys(agents []*harness.Agent, v string) error {
	c, err := client(agents)
	if err != nil {
		return err
	}
	defer c.Close()
	for i := range contendedKeys {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.Put(ctx, contendedKey(i), v)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// waitWhole waits until the cluster has all its members healthy, as
// voters, in one cluster.
func waitWhole(agents []*harness.Agent, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	var cs harness.ClusterState
	for time.Now().Before(deadline) {
		if cs = harness.Observe(agents); cs.Settled(members) {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("last seen %+v", cs)
}

// hashKVAgree checks that every member has the same key-value hash at
// one revision.
func hashKVAgree(agents []*harness.Agent) error {
	c, err := client(agents)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := c.Status(ctx, agents[0].ClientURL)
	if err != nil {
		return fmt.Errorf("HashKV: status: %w", err)
	}
	rev := st.Header.Revision
	var first uint32
	for i, a := range agents {
		h, err := c.HashKV(ctx, a.ClientURL, rev)
		if err != nil {
			return fmt.Errorf("HashKV of %s at %d: %w", a.Name, rev, err)
		}
		if i == 0 {
			first = h.Hash
		} else if h.Hash != first {
			return fmt.Errorf("HashKV at revision %d differs: %s has %d, %s has %d", rev, agents[0].Name, first, a.Name, h.Hash)
		}
	}
	return nil
}

// lostWrites returns the acknowledged log keys the cluster no longer has.
func lostWrites(agents []*harness.Agent, acked []string) ([]string, error) {
	c, err := client(agents)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, logPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	have := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		have[string(kv.Key)] = true
	}
	var lost []string
	for _, k := range acked {
		if !have[k] {
			lost = append(lost, k)
		}
	}
	return lost, nil
}
