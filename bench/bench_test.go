// Package bench measures etcd-manager against baselines taken in the same
// run, on real etcd with data on real disk, and reports ratios because
// these machines are noisy.
//
// make bench runs it at full scale and writes bench/results/latest.json;
// make test runs it at BENCH_SCALE=small to keep the harness working.
//
// BENCH_ONLY=name,name runs only the benchmarks that report those results
// (a group reporting several runs whole), for example
// BENCH_ONLY=agent-idle-rss,agent-idle-cpu; such a partial run never
// writes bench/results, unless it runs at full scale with BENCH_MERGE=1:
// then its results replace theirs in bench/results and the others stay,
// with a line in latest.md that says which were measured when.
package bench

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	grpcpeer "google.golang.org/grpc/peer"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// Result is one line of bench/results/latest.json.
type Result struct {
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Baseline float64 `json:"baseline"`
	Ratio    float64 `json:"ratio"`
	Note     string  `json:"note"`
	Skipped  bool    `json:"skipped,omitempty"`
	Reason   string  `json:"reason,omitempty"`
	// noBaseline marks a figure measured against a goal rather than a
	// baseline: baseline and ratio stay 0 in the JSON, "-" in the table.
	noBaseline bool
}

type scale struct {
	name       string
	iterations int
	// dbBytes is the etcd DB size the backup benchmarks fill to.
	dbBytes int64
	// backupIterations is how many backups each backup benchmark takes of
	// its one filled cluster.
	backupIterations int
	// restoreIterations is how many times the restore benchmark restores
	// its one backup.
	restoreIterations int
	// rollIterations is how many rolling upgrades (and by-hand rolls)
	// the rolling-upgrade benchmark measures.
	rollIterations int
	// idleWindow is how long the idle benchmarks measure the agent and
	// the bare etcd, side by side.
	idleWindow time.Duration
	// captureRate is the writes/s of the steady writer the RPO and
	// capture-overhead benchmarks run for captureWindow, captureIterations
	// times on each cluster (capture on, capture off), alternately.
	captureRate       int
	captureWindow     time.Duration
	captureIterations int
	// rssRate is the writes/s under which the agent's RSS is sampled, for
	// rssWindow on each cluster.
	rssRate   int
	rssWindow time.Duration
	// pitrDBBytes is the DB the point-in-time restore benchmark backs up,
	// and pitrRevisions how many revisions it captures after the backup.
	pitrDBBytes   int64
	pitrRevisions int
	// groups, when set, are the only benchmark groups the scale runs, by
	// the first name each reports.
	groups []string
}

// named is a result's name at this scale: the DB-sized figures say the
// size they measure, 1gib at full scale, 8gib at large.
func (sc scale) named(name string) string {
	if sc.name == "large" {
		return strings.Replace(name, "-1gib", "-8gib", 1)
	}
	return name
}

// quotaArgs are configure-cluster's flags for a DB of dbBytes: etcd's
// default quota (2 GiB) is too small at large scale. Twice the DB: at 80%
// of the quota the agents defragment, which would hold up the backups.
func (sc scale) quotaArgs() []string {
	if sc.dbBytes <= 1<<30 {
		return nil
	}
	return []string{fmt.Sprintf("--quota-backend-bytes=%d", 2*sc.dbBytes)}
}

// resultsBase is the name of the files under bench/results that a
// complete run at this scale writes (latest.json and latest.md at full
// scale), or "" for a scale that keeps no results.
func (sc scale) resultsBase() string {
	switch sc.name {
	case "full":
		return "latest"
	case "large":
		return "large"
	}
	return ""
}

func currentScale(t *testing.T) scale {
	switch s := os.Getenv("BENCH_SCALE"); s {
	case "", "small":
		return scale{name: "small", iterations: 1, dbBytes: 64 << 20, backupIterations: 1, restoreIterations: 1, rollIterations: 1, idleWindow: 5 * time.Second,
			captureRate: 200, captureWindow: 3 * time.Second, captureIterations: 2, rssRate: 1000, rssWindow: 6 * time.Second,
			pitrDBBytes: 64 << 20, pitrRevisions: 20_000}
	case "full":
		return scale{name: "full", iterations: 5, dbBytes: 1 << 30, backupIterations: 3, restoreIterations: 2, rollIterations: 2, idleWindow: 60 * time.Second,
			captureRate: 1000, captureWindow: 15 * time.Second, captureIterations: 6, rssRate: 5000, rssWindow: 60 * time.Second,
			pitrDBBytes: 1 << 30, pitrRevisions: 1_000_000}
	case "large":
		// etcd's recommended largest DB, for the figures that grow with
		// the data: run by hand (make bench-large), never by make test.
		return scale{name: "large", iterations: 1, dbBytes: 8 << 30, backupIterations: 1, restoreIterations: 1,
			groups: []string{"backup-file-1gib", "restore-1gib"}}
	default:
		t.Fatalf("BENCH_SCALE=%q: use small, full or large", s)
		return scale{}
	}
}

// benchGroups are the benchmarks in the order they run, each with the
// names of the results it reports.
type benchGroup struct {
	names []string
	run   func(*testing.T, scale) []Result
	// disk, when set, is about how many bytes of free disk the group
	// needs at a scale, under the temp dir where its clusters live.
	disk func(scale) (bytes int64, what string)
}

var benchGroups = []benchGroup{
	{names: []string{"bootstrap-3"}, run: func(t *testing.T, sc scale) []Result { return []Result{benchBootstrap(t, sc)} }},
	{names: []string{"replace-member"}, run: func(t *testing.T, sc scale) []Result { return []Result{benchReplaceMember(t, sc)} }},
	{names: []string{"backup-file-1gib", "backup-s3-1gib", "agent-backup-peak-rss"}, run: benchBackups, disk: backupDisk},
	{names: []string{"restore-1gib"}, run: func(t *testing.T, sc scale) []Result { return []Result{benchRestore(t, sc)} }, disk: restoreDisk},
	{names: []string{"backup-encrypted", "restore-fetch-encrypted"}, run: benchEncryption},
	{names: []string{"rolling-upgrade", "rolling-upgrade-stall"}, run: benchRollingUpgrade},
	{names: []string{"agent-idle-rss", "agent-idle-cpu"}, run: benchIdle},
	{names: []string{"rpo-p99", "capture-overhead", "agent-capture-rss"}, run: benchCaptureLoad},
	{names: []string{"pitr-restore", "pitr-apply-rate"}, run: benchPITR},
	{names: []string{"defrag-stall"}, run: benchDefragStall},
	{names: []string{"nospace-recovery"}, run: benchNoSpace},
}

// backupDisk is what the backup benchmarks hold at once, one store after
// the other: the DB, continuous capture's segments of the fill, the
// baseline's snapshot, the agent's copy of the snapshot as it streams,
// and the backup in the store (a little smaller than the DB gzipped, on
// this hex data); then, for MinIO, the floor's local copy of the backup
// and its upload, which MinIO frees some time after it is deleted. An
// 8 GiB run of 2026-11-28 filled 60 GiB.
func backupDisk(sc scale) (int64, string) {
	return sc.dbBytes * 15 / 2, "the DB, capture's segments of it, the baseline's snapshot, the agent's copy of the snapshot, the backup, and MinIO's floor (a local copy of the backup and its upload)"
}

// restoreDisk is what the restore benchmark holds at its peak, on one disk
// for 3 nodes: the snapshot each node fetches and the data it restores
// (the baseline's and the agents' alike), the backup in the store (a
// little smaller than the DB, as backupDisk says), and, but at the large scale
// (see leanRestore), the 3 live members' data and WAL, which the restore
// moves to each node's trash, and continuous capture's segments of the
// fill. At the large scale, the fill and its backup hold less: 3 members'
// 8 GiB and 2.4 GiB of WAL each, the backup's local copy and the backup.
func restoreDisk(sc scale) (int64, string) {
	if sc.leanRestore() {
		return sc.dbBytes*7 + 2<<30, "each of 3 nodes' fetched snapshot and restored data, the backup, and 2 GiB for WALs and the trash"
	}
	return sc.dbBytes * 11, "3 members' data, moved to trash, plus each node's fetched snapshot and restored data, the backup and capture's segments"
}

// leanRestore reports whether the restore benchmark saves disk: at the
// large scale, 3 nodes sharing this machine's one disk would otherwise
// need about 90 GiB. It then runs the agents without continuous capture,
// whose segments would hold the fill's 8 GiB of writes in the store, and
// deletes and compacts the live cluster's data, and has etcd purge it
// from its WAL, once the backup is taken (emptyCluster). Neither changes the restore's work much: the old
// members' data goes to the trash by a rename, whatever its size, and
// capture only starts again on the restored cluster after clients are
// back.
func (sc scale) leanRestore() bool { return sc.name == "large" }

// checkDisk fails the run at once, naming what it needs, when the temp
// dir's disk has too little free space for a group: better than filling
// the disk halfway through.
func checkDisk(t *testing.T, sc scale, groups []benchGroup) {
	t.Helper()
	dir := os.TempDir()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatalf("free space under %s: %v", dir, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	for _, g := range groups {
		if g.disk == nil {
			continue
		}
		need, what := g.disk(sc)
		if free < need {
			t.Fatalf("%s at scale %s needs about %.0f GiB free under %s (%s, for a %.0f GiB DB), and %.1f GiB are free: free some space, "+
				"set TMPDIR to a larger disk, or leave it out with BENCH_ONLY", sc.named(g.names[0]), sc.name, float64(need)/(1<<30), dir, what,
				float64(sc.dbBytes)/(1<<30), float64(free)/(1<<30))
		}
		t.Logf("%s at scale %s needs about %.1f GiB free under %s; %.1f GiB are", sc.named(g.names[0]), sc.name, float64(need)/(1<<30), dir, float64(free)/(1<<30))
	}
}

// benchOnly is the set of result names BENCH_ONLY asks for, or nil for
// every benchmark.
// A name may be given as the scale reports it (backup-file-8gib at large
// scale) or as the full scale does; the set holds the full scale's.
func benchOnly(t *testing.T, sc scale) map[string]bool {
	v := strings.TrimSpace(os.Getenv("BENCH_ONLY"))
	if v == "" {
		return nil
	}
	known := map[string]string{}
	for _, g := range benchGroups {
		if !sc.runs(g.names[0]) {
			continue
		}
		for _, n := range g.names {
			known[n], known[sc.named(n)] = n, n
		}
	}
	only := map[string]bool{}
	for _, n := range strings.Split(v, ",") {
		n = strings.TrimSpace(n)
		if known[n] == "" {
			t.Fatalf("BENCH_ONLY: no benchmark at scale %s reports %q", sc.name, n)
		}
		only[known[n]] = true
	}
	return only
}

// runs reports whether the scale runs the group whose first name is
// first.
func (sc scale) runs(first string) bool {
	return sc.groups == nil || slices.Contains(sc.groups, first)
}

func TestBench(t *testing.T) {
	sc := currentScale(t)
	only := benchOnly(t, sc)
	// What is measured, read before the run writes its results.
	build := built()
	var groups []benchGroup
	for _, g := range benchGroups {
		want := only == nil
		for _, n := range g.names {
			want = want || only[n]
		}
		if want && sc.runs(g.names[0]) {
			groups = append(groups, g)
		}
	}
	checkDisk(t, sc, groups)
	var results []Result
	for _, g := range groups {
		results = append(results, g.run(t, sc)...)
	}
	for _, r := range results {
		if !r.Skipped && (r.Value <= 0 || math.IsNaN(r.Value) || (!r.noBaseline && (r.Baseline <= 0 || math.IsNaN(r.Ratio)))) {
			t.Errorf("%s: measured nothing: %+v", r.Name, r)
		}
	}

	// Only a run of every benchmark of the full (or large) scale replaces
	// its files in bench/results; a partial run at that scale with
	// BENCH_MERGE=1 replaces its own results there.
	base := sc.resultsBase()
	keep := base != "" && only == nil
	if base != "" && only != nil && os.Getenv("BENCH_MERGE") == "1" && !t.Failed() {
		mergeResults(t, sc, results, build)
	}
	out := filepath.Join(t.TempDir(), "latest.json")
	if keep {
		out = filepath.Join("results", base+".json")
	}
	data, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	table := markdown(results, sc, build)
	fmt.Println(table)
	if keep {
		if err := os.WriteFile(filepath.Join("results", base+".md"), []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func markdown(rs []Result, sc scale, build string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("scale %s (%d iteration(s), median), %s, on %s; %s\n\n", sc.name, sc.iterations, time.Now().UTC().Format("2006-01-02"), machine(host), build) +
		markdownTable(rs)
}

func markdownTable(rs []Result) string {
	var b strings.Builder
	b.WriteString("| name | value | baseline | ratio | note |\n|---|---|---|---|---|\n")
	for _, r := range rs {
		if r.Skipped {
			fmt.Fprintf(&b, "| %s | skipped | | | %s |\n", r.Name, r.Reason)
			continue
		}
		if r.noBaseline {
			fmt.Fprintf(&b, "| %s | %.2f %s | - | - | %s |\n", r.Name, r.Value, r.Unit, r.Note)
			continue
		}
		fmt.Fprintf(&b, "| %s | %.2f %s | %.2f %s | %.2f× | %s |\n", r.Name, r.Value, r.Unit, r.Baseline, r.Unit, r.Ratio, r.Note)
	}
	return b.String()
}

// mergeResults writes fresh, the results of a full-scale partial run,
// into bench/results in place of the same names, keeping the others, in
// benchGroups order. latest.md keeps the header lines of the runs it
// holds and gains one naming the fresh results and their date.
func mergeResults(t *testing.T, sc scale, fresh []Result, build string) {
	t.Helper()
	base := sc.resultsBase()
	jsonPath, mdPath := filepath.Join("results", base+".json"), filepath.Join("results", base+".md")
	var old []Result
	if data, err := os.ReadFile(jsonPath); err == nil {
		if err := json.Unmarshal(data, &old); err != nil {
			t.Fatalf("merge into %s: %v", jsonPath, err)
		}
	}
	byName := map[string]Result{}
	for _, r := range old {
		r.noBaseline = !r.Skipped && r.Baseline == 0 // not in the JSON
		byName[r.Name] = r
	}
	var names []string
	byFresh := map[string]bool{}
	for _, r := range fresh {
		byName[r.Name], byFresh[r.Name] = r, true
		names = append(names, r.Name)
	}
	var merged []Result
	placed := map[string]bool{}
	for _, g := range benchGroups {
		for _, n := range g.names {
			if r, ok := byName[sc.named(n)]; ok {
				merged, placed[r.Name] = append(merged, r), true
			}
		}
	}
	for _, r := range old {
		if !placed[r.Name] {
			merged = append(merged, byName[r.Name])
		}
	}
	data, err := json.MarshalIndent(merged, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jsonPath, append(data, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}

	host, _ := os.Hostname()
	line := fmt.Sprintf("%s: scale %s, measured %s on %s by a BENCH_ONLY run, merged in; %s", strings.Join(names, ", "), sc.name, time.Now().UTC().Format("2006-01-02"), machine(host), build)
	var header []string
	if data, err := os.ReadFile(mdPath); err == nil {
		head, _, _ := strings.Cut(string(data), "| name |")
		for _, l := range strings.Split(head, "\n") {
			if l == "" {
				continue
			}
			// An earlier merge's line keeps only the names not measured
			// again, and goes when none is left.
			if list, rest, ok := strings.Cut(l, ": scale "); ok && !strings.HasPrefix(l, "scale ") {
				var kept []string
				for _, n := range strings.Split(list, ", ") {
					if _, again := byFresh[n]; !again {
						kept = append(kept, n)
					}
				}
				if len(kept) == 0 {
					continue
				}
				l = strings.Join(kept, ", ") + ": scale " + rest
			}
			header = append(header, l)
		}
	}
	header = append(header, line)
	if err := os.WriteFile(mdPath, []byte(strings.Join(header, "\n\n")+"\n\n"+markdownTable(merged)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("merged %s into %s and %s", strings.Join(names, ", "), jsonPath, mdPath)
}

func machine(host string) string {
	cpu := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d cores", cpu, runtime.NumCPU())
}

// built says what was measured: the commit, the Go release and the build
// tags. The harness builds the agent with the go command this test binary
// came from, in the same environment, so GOFLAGS (the Makefile's GO_TAGS)
// reach both alike.
func built() string {
	commit := "unknown commit"
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = "commit " + strings.TrimSpace(string(out))
		if out, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
			commit += " with uncommitted changes"
		}
	}
	tags := "no build tags"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-tags" && s.Value != "" {
				tags = "-tags=" + s.Value
			}
		}
	}
	return fmt.Sprintf("%s, %s, %s", commit, runtime.Version(), tags)
}

// goal opens a note with whether the figure meets its goal.
func goal(met bool, what string) string {
	if met {
		return "meets the goal of " + what + "; "
	}
	return "does NOT meet the goal of " + what + "; "
}

// goalIdleRSSMiB is the idle agent's RSS goal.
const goalIdleRSSMiB = 32

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// untilWritable retries a put through endpoints, with client TLS cfg
// (nil for plain http), until one succeeds.
func untilWritable(t *testing.T, endpoints []string, cfg *tls.Config, timeout time.Duration) {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := c.Put(ctx, "/bench/probe", "x")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not writable within %s: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// benchBootstrap: 3 agents started cold until the cluster is writable,
// against starting the same three etcd by hand, with the same TLS.
func benchBootstrap(t *testing.T, sc scale) Result {
	var got, base []float64
	for range sc.iterations {
		t.Run("bootstrap-3", func(t *testing.T) {
			env := harness.NewEnv(t)
			bare := env.NewBareCluster(3, true) // its certificates made before the clock starts
			start := time.Now()
			bare.Start(env.DefaultEtcd())
			untilWritable(t, bare.Endpoints(), bare.TLS, time.Minute)
			base = append(base, time.Since(start).Seconds())

			env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
			start = time.Now()
			agents := env.StartAgents(3, harness.AgentOptions{Defaults: true})
			// The client certificate comes from the CA the agents make
			// as they start, so it is fetched on the clock.
			untilWritable(t, harness.Endpoints(agents), env.ClientTLS(), 2*time.Minute)
			got = append(got, time.Since(start).Seconds())
		})
	}
	v, b := median(got), median(base)
	return Result{Name: "bootstrap-3", Value: v, Unit: "s", Baseline: b, Ratio: v / b,
		Note: goal(v <= 1.2*b, "a cold 3-agent start within 1.2× of 3 bare etcd") + "3 agents started cold until a write succeeds, default loop interval, TLS as shipped (the agents make the cluster's CA and their certificates on the clock); " +
			"baseline: 3 bare etcd started by hand with the same TLS (https client and peer URLs requiring client certificates from one CA, certificates made before the clock starts)"}
}

// etcdHealthInterval is how long etcd wants every voter connected before
// it takes a member change.
const etcdHealthInterval = 5 * time.Second

// benchReplaceMember: a wiped member, until 3 healthy voters again, with a
// grace of 0, against one etcd leader election measured in the same run.
func benchReplaceMember(t *testing.T, sc scale) Result {
	var got, base []float64
	// The replacements of a member that led etcd, which wait for an
	// election first, and of one that followed.
	var ofLeader, ofFollower []float64
	for range sc.iterations {
		t.Run("replace-member", func(t *testing.T) {
			env := harness.NewEnv(t)
			bare := env.NewBareCluster(3, true)
			bare.Start(env.DefaultEtcd())
			untilWritable(t, bare.Endpoints(), bare.TLS, time.Minute)
			leader := bare.Leader()
			start := time.Now()
			leader.Kill()
			var rest []string
			for _, m := range bare.Members {
				if m != leader {
					rest = append(rest, m.ClientURL)
				}
			}
			untilWritable(t, rest, bare.TLS, time.Minute)
			base = append(base, time.Since(start).Seconds())

			env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
			agents := env.StartAgents(3, harness.AgentOptions{Defaults: true, ExtraArgs: []string{"--member-failure-grace=0s"}})
			harness.WaitSettled(t, agents, 3, 2*time.Minute)
			// etcd refuses a member change until every voter has been
			// connected to the leader for 5s (its strict reconfiguration
			// check); a member fails long after its cluster formed, not
			// within moments of it.
			time.Sleep(etcdHealthInterval)
			victim := agents[2]
			led := victim.Leads()
			victim.Kill()
			if err := os.RemoveAll(victim.DataDir); err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			victim.Start()
			harness.WaitSettled(t, agents, 3, 2*time.Minute)
			secs := time.Since(start).Seconds()
			got = append(got, secs)
			if led {
				ofLeader = append(ofLeader, secs)
			} else {
				ofFollower = append(ofFollower, secs)
			}
			t.Logf("replacement %.2fs (the wiped member led etcd: %v), against an election of %.2fs", secs, led, base[len(base)-1])
		})
	}
	v, b := median(got), median(base)
	return Result{Name: "replace-member", Value: v, Unit: "s", Baseline: b, Ratio: v / b,
		Note: goal(v <= 2*b, "a wiped member back as a healthy voter within 2× one leader election") + fmt.Sprintf("a member's data dir wiped and its agent restarted, 5s after the cluster settled (etcd takes no member change sooner), until 3 healthy voters, median of %d: %s s; the wiped member was the same agent each time, and led etcd in %d of them (%s s: the others elect a leader first, which then replaces it), and followed in %d (%s s); grace 0, default loop interval, TLS as shipped; baseline: one etcd leader election (kill the leader until a write succeeds) on 3 bare etcd with the same TLS (https client and peer URLs requiring client certificates from one CA): %s s",
			len(got), fmtListPrec(got, 2), len(ofLeader), fmtListPrec(ofLeader, 2), len(ofFollower), fmtListPrec(ofFollower, 2), fmtListPrec(base, 2))}
}

// Backup benchmarks. Each store gets one managed 1-member cluster, filled
// once to sc.dbBytes, then backed up sc.backupIterations times; each
// backup is preceded by the baseline, etcdctl snapshot save of the same
// DB to local disk.

const (
	fillValueBytes = 512 << 10 // under etcd's 1.5 MiB request limit
	fillClients    = 4
	backupTimeout  = 10 * time.Minute
	goalRSSMiB     = 48
)

// backupRun is what one store's run measured.
type backupRun struct {
	got, base  []float64 // seconds: backup-now, etcdctl snapshot save
	snapBytes  int64     // size of the baseline snapshot
	dbSize     int64     // DB size reached by the fill
	fillSecs   float64
	rssMiB     []float64 // the agent's peak RSS during each backup
	idleRSSMiB float64   // the agent's RSS just before the first backup
	// anonMiB and fileMiB are the largest anonymous and file-backed RSS
	// sampled during the backups (VmHWM counts both).
	anonMiB, fileMiB float64
	agentSecs        []float64 // the backup's duration as the agent logs it
	stages           []string  // each backup's stages as the agent logs them
	// catchUp is how long the wait for capture's merges of the fill took
	// (see awaitMerged), and catchUpMiB the agent's peak RSS meanwhile.
	catchUp     time.Duration
	caughtUp    bool // false if the wait gave up
	catchUpMiB  float64
	compressed  int64 // compressed size of the last backup, when known
	backupBytes int64 // uncompressed size of the last backup, when known
	// heap is the agent's heap profile at its largest during one more
	// backup, taken after the measured ones (see profiledBackup).
	heap heapSummary
	// floor is the store's own time to take in the last backup's object
	// (see storeFloor); zero for file://.
	floor storeFloor
}

func benchBackups(t *testing.T, sc scale) []Result {
	var file, s3 backupRun
	t.Run("backup-file", func(t *testing.T) {
		file = runBackups(t, sc, nil, nil)
	})
	t.Run("backup-s3", func(t *testing.T) {
		var minio *harness.MinIO
		s3 = runBackups(t, sc, func(env *harness.Env) {
			minio = harness.StartMinIO(t)
			minio.CreateBucket(t, "bench")
			env.UseStore(minio.StoreURL("bench", "etcd/main"), minio.Env())
			// Env.ClientTLS reads the cluster's CA from the store in this
			// process, whose environment ExtraEnv does not reach: give it
			// MinIO's credentials too, for this subtest.
			for _, kv := range minio.Env() {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
		}, func(t *testing.T, env *harness.Env, name string) storeFloor {
			return measureFloor(t, env, name, minio.PID(), min(sc.backupIterations, floorUploads))
		})
	})

	size := fmt.Sprintf("%.0f MiB", float64(sc.dbBytes)/(1<<20))
	common := func(r backupRun) string {
		capture := "continuous capture on (the default), its merges of the fill's segments not waited for at this scale"
		switch {
		case r.caughtUp:
			capture = fmt.Sprintf("continuous capture on (the default): the first baseline started once capture had merged the fill's segments (no merge for 130s), %.0fs after the fill (the agent's peak RSS meanwhile %.1f MiB)",
				r.catchUp.Seconds(), r.catchUpMiB)
		case r.catchUp > 0:
			capture = fmt.Sprintf("continuous capture on (the default): the first baseline started %.0fs after the fill while capture still merged the fill's segments: the wait for them gave up (the agent's peak RSS meanwhile %.1f MiB)",
				r.catchUp.Seconds(), r.catchUpMiB)
		}
		return fmt.Sprintf("DB filled to %.0f MiB (scale %s: %s target) with %d KiB values of random hex in %.1fs; snapshot %.0f MiB; median of %d; 1-member cluster, default loop interval (backup-now tells the agents it queued the command, and the leader takes it up at once), --backup-interval=24h so no periodic backup overlaps; %s",
			mib(r.dbSize), sc.name, size, fillValueBytes>>10, r.fillSecs, mib(r.snapBytes), len(r.got), capture)
	}
	backupResult := func(name, store string, r backupRun, extra string) Result {
		v, b := medianOr0(r.got), medianOr0(r.base)
		res := Result{Name: name, Value: v, Unit: "s", Baseline: b, Ratio: ratio(v, b)}
		agent := ""
		if len(r.agentSecs) > 0 {
			agent = fmt.Sprintf(" (the agent logs %.2fs for the backup itself)", median(r.agentSecs))
		}
		if len(r.stages) > 0 {
			agent += "; the agent's stages of each backup: " + strings.Join(r.stages, "; ")
		}
		res.Note = goal(v > 0 && v <= 1.3*b, "within 1.3× of etcdctl snapshot save") + fmt.Sprintf("etcd-manager-ctl backup-now to a %s store (snapshot, verify, gzip, upload): %.0f MiB/s%s; baseline: etcdctl snapshot save of the same etcd to local disk, over TLS with a client certificate from etcd-manager-ctl issue-client-cert, as that etcd requires: %.0f MiB/s; %s%s",
			store, throughput(r.snapBytes, v), agent, throughput(r.snapBytes, b), common(r), extra)
		return res
	}
	var fileExtra string
	if file.compressed > 0 {
		fileExtra = fmt.Sprintf("; backup %.0f MiB gzipped to %.0f MiB", mib(file.backupBytes), mib(file.compressed))
	}
	results := []Result{
		backupResult(sc.named("backup-file-1gib"), "file://", file, fileExtra),
		backupResult(sc.named("backup-s3-1gib"), "MinIO (s3://)", s3, "; "+s3.floor.note(medianOr0(s3.base))),
	}

	// Peak RSS: the largest over every backup of both stores.
	peak := 0.0
	for _, x := range append(append([]float64(nil), file.rssMiB...), s3.rssMiB...) {
		peak = max(peak, x)
	}
	verdict := "meets"
	if peak > goalRSSMiB || len(file.rssMiB) == 0 || len(s3.rssMiB) == 0 {
		verdict = "does NOT meet" // or cannot tell: a store's backups measured nothing
	}
	results = append(results, Result{Name: "agent-backup-peak-rss", Value: peak, Unit: "MiB", noBaseline: true,
		Note: fmt.Sprintf("%s the goal of at most %d MiB whatever the DB size (compare the scales for flatness); agent VmHWM, reset through clear_refs just before each backup-now, max over file:// backups (%s MiB) and MinIO backups (%s MiB) of a %.0f MiB DB (scale %s); sampled every 10ms during the backups, peak anonymous RSS %.1f MiB (file://) and %.1f MiB (MinIO), peak file-backed RSS (mapped files, which VmHWM counts) %.1f MiB and %.1f MiB; agent RSS before the first backup %.1f MiB (file://), %.1f MiB (MinIO); the Go heap during one more backup of each, after the measured ones, with the agent restarted with --enable-pprof and its heap profile read every 250ms (the profile is as of the last collection; the inuse_space of each allocating function, outside the runtime's and the standard library's helpers): file:// %s; MinIO %s; no baseline",
			verdict, goalRSSMiB, fmtList(file.rssMiB), fmtList(s3.rssMiB), mib(max(file.dbSize, s3.dbSize)), sc.name,
			file.anonMiB, s3.anonMiB, file.fileMiB, s3.fileMiB, file.idleRSSMiB, s3.idleRSSMiB, file.heap, s3.heap)})
	return results
}

// runBackups starts a managed 1-member cluster (on the store setup
// chooses, file:// by default), fills it and measures its backups.
func runBackups(t *testing.T, sc scale, setup func(env *harness.Env), floor func(t *testing.T, env *harness.Env, name string) storeFloor) backupRun {
	var r backupRun
	env := harness.NewEnv(t)
	if setup != nil {
		setup(env)
	}
	env.MustCtl(append([]string{"--member-count=1", "--etcd-version=" + harness.DefaultEtcdVersion, "configure-cluster"}, sc.quotaArgs()...)...)
	extra := []string{"--backup-interval=24h"}
	agents := env.StartAgents(1, harness.AgentOptions{Defaults: true, ExtraArgs: extra})
	harness.WaitSettled(t, agents, 1, 2*time.Minute)
	agent := agents[0]

	fillTimeout := 30 * time.Second
	if sc.dbBytes > 256<<20 {
		fillTimeout = max(5*time.Minute, time.Duration(sc.dbBytes>>30)*2*time.Minute)
	}
	start := time.Now()
	r.dbSize = fill(t, agent.ClientURL, agent.TLS(), sc.dbBytes, fillTimeout)
	r.fillSecs = time.Since(start).Seconds()
	t.Logf("filled to %.0f MiB in %.1fs", mib(r.dbSize), r.fillSecs)

	pid := agent.PID()
	// At the small scale, which make test runs, the few merges of a
	// small fill are not worth the two minutes.
	if sc.name != "small" {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
			t.Fatalf("reset the agent's peak RSS: %v", err)
		}
		r.catchUp, r.caughtUp = awaitMerged(t, agent, time.Now(), max(6*time.Minute, time.Duration(sc.dbBytes>>30)*2*time.Minute))
		r.catchUpMiB = procStatusMiB(t, pid, "VmHWM")
		t.Logf("capture merged the fill's segments: waited %s; agent peak RSS meanwhile %.1f MiB", r.catchUp.Round(time.Second), r.catchUpMiB)
	}

	snapDir := t.TempDir() // on real disk: /tmp is not tmpfs here, and t.TempDir honours $TMPDIR
	certs := clientCertFiles(t, env)
	var last string // the newest backup's name
	for i := range sc.backupIterations {
		secs, size := etcdctlSnapshot(t, env.BinDir, agent.ClientURL, certs, snapDir)
		r.base = append(r.base, secs)
		r.snapBytes = size

		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
			t.Fatalf("reset the agent's peak RSS: %v", err)
		}
		if i == 0 {
			r.idleRSSMiB = procStatusMiB(t, pid, "VmRSS")
		}
		stopSampling := sampleRSS(pid)
		secs, name := backupNow(t, env)
		last = name
		r.rssMiB = append(r.rssMiB, procStatusMiB(t, pid, "VmHWM"))
		anon, file := stopSampling()
		r.anonMiB, r.fileMiB = max(r.anonMiB, anon), max(r.fileMiB, file)
		r.got = append(r.got, secs)
		t.Logf("backup %s: %.2fs (etcdctl snapshot save %.2fs), agent peak RSS %.1f MiB (sampled: anon %.1f MiB, file-backed %.1f MiB)",
			name, secs, r.base[len(r.base)-1], r.rssMiB[len(r.rssMiB)-1], anon, file)
		if d, ok := agentBackupDuration(agent.Log(), name); ok {
			r.agentSecs = append(r.agentSecs, d.Seconds())
			t.Logf("the agent reports %s for backup %s itself", d, name)
		}
		if st, ok := agentBackupStages(agent.Log(), name); ok {
			r.stages = append(r.stages, st)
		}

		if setup == nil {
			if size, compressed, ok := backupMeta(env.StoreDir, name); ok {
				r.backupBytes, r.compressed = size, compressed
			}
		}
	}
	if floor != nil {
		r.floor = floor(t, env, last)
		t.Logf("the store took in the backup's object by itself in %s", r.floor)
	}
	// At the large scale, one more backup would need another 16 GiB of
	// disk: the heap is profiled at the smaller scales.
	if sc.name != "large" {
		r.heap = profiledBackup(t, env, agent, extra)
		t.Logf("heap profile: %s", r.heap)
	}
	return r
}

// awaitMerged waits until continuous capture has merged the segments the
// fill wrote, so that the backups and their baselines do not share this
// machine's 2 cores and one disk with that catch-up: a burst of writes as
// large as the DB, right before, is the bench's doing. Capture merges each
// closed minute of segments on its passes, a minute apart, and one pass
// may merge for longer than that: once quiet has gone by since the fill
// ended (filled) and since the last "segments merged" in the agent's
// log, the minutes' merges are done. (The hour's merge, of those merged
// segments, comes when the hour ends, whenever that is.) It gives up
// after timeout, and returns how long it waited and whether it saw the
// merges done.
func awaitMerged(t *testing.T, agent *harness.Agent, filled time.Time, timeout time.Duration) (time.Duration, bool) {
	t.Helper()
	const quiet = 130 * time.Second // two of changelog.Config's MergeIntervals, and some
	for {
		last := filled
		for _, line := range strings.Split(agent.Log(), "\n") {
			ts, ok := strings.CutPrefix(line, "time=")
			if !ok || logAttr(line, "msg") != "segments merged" {
				continue
			}
			if at, err := time.Parse(time.RFC3339Nano, strings.Fields(ts + " ")[0]); err == nil && at.After(last) {
				last = at
			}
		}
		waited := time.Since(filled)
		if time.Since(last) > quiet {
			return waited, true
		}
		if waited > timeout {
			t.Logf("capture still merged the fill's segments %s after the fill (the last merge at %s); going on", timeout, last.UTC().Format("15:04:05"))
			return waited, false
		}
		time.Sleep(time.Second)
	}
}

// backupMeta reads the sizes a file:// store's _etcd_backup.meta records
// for the named backup: the snapshot's and its gzip's.
func backupMeta(storeDir, name string) (size, compressed int64, ok bool) {
	data, err := os.ReadFile(filepath.Join(storeDir, name, "_etcd_backup.meta"))
	if err != nil {
		return 0, 0, false
	}
	var m struct {
		Size           int64 `json:"size"`
		CompressedSize int64 `json:"compressedSize"`
	}
	if json.Unmarshal(data, &m) != nil {
		return 0, 0, false
	}
	return m.Size, m.CompressedSize, true
}

// fillPutAttempts bounds the tries of one fill Put that etcd timed out.
const fillPutAttempts = 10

// fill writes unique keys with random hex values from a few clients until
// etcd reports a DB of at least target bytes, bounded in puts and time,
// and returns the DB size reached. Such values have no repeats for LZ77
// to find: the agent's gzip at BestSpeed stores them nearly as they are
// (a backup is about 93% of its snapshot), where Huffman coding alone
// would halve them: these figures are of a backup that shrinks little,
// the costly case for the upload.
func fill(t *testing.T, endpoint string, cfg *tls.Config, target int64, timeout time.Duration) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	maxPuts := int64(2*target/fillValueBytes + 64)
	var puts atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, fillClients)
	for w := range fillClients {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			raw := make([]byte, fillValueBytes/2)
			val := make([]byte, fillValueBytes)
			for i := 0; ctx.Err() == nil; i++ {
				if puts.Add(1) > maxPuts {
					return
				}
				for j := 0; j+8 <= len(raw); j += 8 {
					binary.LittleEndian.PutUint64(raw[j:], rng.Uint64())
				}
				hex.Encode(val, raw)
				// etcd's own "request timed out" comes when its disk falls
				// behind (an 8 GiB fill beside MinIO on one disk): the
				// fill is not measured, so such a Put is tried again, up
				// to fillPutAttempts times.
				var err error
				for attempt := 0; attempt < fillPutAttempts; attempt++ {
					pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
					_, err = c.Put(pctx, fmt.Sprintf("/bench/fill/%d/%08d", w, i), string(val))
					pcancel()
					if !errors.Is(err, rpctypes.ErrTimeout) {
						break
					}
				}
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("put: %w", err)
					}
					return
				}
			}
		}()
	}

	sc, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	dbSize := func() int64 {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		st, err := sc.Status(sctx, endpoint)
		if err != nil {
			return 0
		}
		return st.DbSize
	}
	workers := make(chan struct{})
	go func() { wg.Wait(); close(workers) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-workers:
			done = true
		case <-tick.C:
			if dbSize() >= target {
				cancel()
				<-workers
				done = true
			}
		}
	}
	close(errs)
	for err := range errs {
		t.Fatalf("fill: %v", err)
	}
	got := dbSize()
	if got < target {
		t.Fatalf("fill: DB reached %d bytes after %d puts, want %d (bounded by %d puts and %s)", got, min(puts.Load(), maxPuts), target, maxPuts, timeout)
	}
	return got
}

// certFiles are PEM files for etcdctl: the CA to trust and a client
// certificate from it.
type certFiles struct{ ca, cert, key string }

// args are etcdctl's flags for the files.
func (f certFiles) args() []string {
	return []string{"--cacert=" + f.ca, "--cert=" + f.cert, "--key=" + f.key}
}

// clientCertFiles writes a client certificate from the env's cluster CA
// for etcdctl, as an operator would get one: etcd-manager-ctl
// issue-client-cert.
func clientCertFiles(t *testing.T, env *harness.Env) certFiles {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	env.MustCtl("issue-client-cert", "--out", dir, "--name=bench", "--validity=24h")
	return certFiles{ca: filepath.Join(dir, "ca.crt"), cert: filepath.Join(dir, "client.crt"), key: filepath.Join(dir, "client.key")}
}

// etcdctlSnapshot is the baseline: etcdctl snapshot save to local disk,
// over TLS with the client certificate in certs, as the agent's etcd
// requires.
func etcdctlSnapshot(t *testing.T, binDir, endpoint string, certs certFiles, dir string) (float64, int64) {
	t.Helper()
	path := filepath.Join(dir, "baseline.db")
	ctx, cancel := context.WithTimeout(context.Background(), backupTimeout)
	defer cancel()
	args := append([]string{"--endpoints=" + endpoint}, certs.args()...)
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "etcd-v"+harness.DefaultEtcdVersion, "etcdctl"),
		append(args, "snapshot", "save", path)...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	secs := time.Since(start).Seconds()
	if err != nil {
		t.Fatalf("etcdctl snapshot save: %v\n%s", err, out)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	return secs, st.Size()
}

// backupNow times etcd-manager-ctl backup-now (which waits for the backup)
// and returns the backup's name. It runs the ctl itself because
// Env.Ctl gives up after a minute, too soon for a large DB.
func backupNow(t *testing.T, env *harness.Env) (float64, string) {
	t.Helper()
	secs, name, err := tryBackupNow(env)
	if err != nil {
		t.Fatal(err)
	}
	return secs, name
}

// tryBackupNow is backupNow for a goroutine other than the test's: it
// returns the failure.
func tryBackupNow(env *harness.Env) (float64, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), backupTimeout+time.Minute)
	defer cancel()
	args := []string{"--backup-store=" + env.StoreURL, "backup-now", "--timeout=" + backupTimeout.String()}
	if env.Insecure {
		args = append(args, "--insecure")
	}
	cmd := exec.CommandContext(ctx, env.CtlBin, args...)
	cmd.Env = append(os.Environ(), env.ExtraEnv...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	secs := time.Since(start).Seconds()
	name := strings.TrimSpace(stdout.String())
	if err != nil || name == "" || strings.ContainsAny(name, " \n") {
		return 0, "", fmt.Errorf("etcd-manager-ctl backup-now: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	return secs, name, nil
}

// sampleRSS polls the RssAnon and RssFile of pid every 10ms until the
// returned function is called, which returns their largest values in MiB.
func sampleRSS(pid int) func() (anon, file float64) {
	stop := make(chan struct{})
	done := make(chan struct{})
	var anon, file float64
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
				anon = max(anon, statusFieldMiB(string(data), "RssAnon"))
				file = max(file, statusFieldMiB(string(data), "RssFile"))
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (float64, float64) {
		close(stop)
		<-done
		return anon, file
	}
}

// statusFieldMiB is a kB field of /proc/<pid>/status in MiB, or -1.
func statusFieldMiB(status, field string) float64 {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return -1
			}
			return float64(kb) / 1024
		}
	}
	return -1
}

// procStatusMiB reads a kB field such as VmHWM from /proc/<pid>/status.
func procStatusMiB(t *testing.T, pid int, field string) float64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	v := statusFieldMiB(string(data), field)
	if v < 0 {
		t.Fatalf("/proc/%d/status: no readable %s", pid, field)
	}
	return v
}

// agentBackupDuration finds the duration the agent logged with "backup
// taken" for the named backup. It only adds detail to a note.
func agentBackupDuration(log, name string) (time.Duration, bool) {
	return backupTakenField(log, name, "duration")
}

// agentBackupStages is the agent's "backup taken" line's stages of the
// named backup, as "stream 4.1s, verify 0.8s, commit 2ms".
func agentBackupStages(log, name string) (string, bool) {
	var parts []string
	for _, stage := range []string{"stream", "verify", "commit"} {
		d, ok := backupTakenField(log, name, stage)
		if !ok {
			return "", false
		}
		parts = append(parts, stage+" "+d.String())
	}
	return strings.Join(parts, ", "), true
}

// backupTakenField reads a duration field of the agent's "backup taken"
// line for the named backup.
func backupTakenField(log, name, field string) (time.Duration, bool) {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "backup taken") || !strings.Contains(line, "name="+name) {
			continue
		}
		_, rest, ok := strings.Cut(line, " "+field+"=")
		if !ok {
			return 0, false
		}
		d, err := time.ParseDuration(strings.Fields(rest + " ")[0])
		return d, err == nil
	}
	return 0, false
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

func throughput(bytes int64, secs float64) float64 {
	if secs <= 0 {
		return 0
	}
	return mib(bytes) / secs
}

// ratio is v/b, or 0 without a baseline (JSON has no NaN); TestBench
// flags a missing baseline.
func ratio(v, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return v / b
}

func medianOr0(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return median(xs)
}

func fmtList(xs []float64) string { return fmtListPrec(xs, 1) }

// fmtListPrec is fmtList with prec digits after the point.
func fmtListPrec(xs []float64, prec int) string {
	var s []string
	for _, x := range xs {
		s = append(s, strconv.FormatFloat(x, 'f', prec, 64))
	}
	if len(s) == 0 {
		return "(none)"
	}
	return strings.Join(s, ", ")
}

// Restore benchmark. One managed 3-member cluster is filled once to
// sc.dbBytes and backed up once; that backup is then restored over the
// live cluster sc.restoreIterations times, each restore preceded by the
// baseline: the same 3-member restore by hand (each node gunzips the
// backup and runs etcdutl snapshot restore, then the 3 etcd start). The
// figure is the time until clients are back on the restored cluster; the
// command goes on to take the restored cluster's fresh backup, and its
// own end is in the note.

const (
	restoreTimeout = 20 * time.Minute
	// readableTimeout bounds the wait for a Get after a restore returns.
	readableTimeout = 2 * time.Minute
)

// restoreRun is what the restore benchmark measured.
type restoreRun struct {
	got, base  []float64 // seconds: restore-backup until clients are back, the same by hand
	done       []float64 // seconds: restore-backup until it returned, the fresh backup taken
	dbSize     int64     // DB size reached by the fill
	fillSecs   float64
	backupSecs float64 // the backup-now that made the backup restored
	snapBytes  int64   // the snapshot, as the backup's meta records it
	emptied    string  // the members' sizes once emptyCluster ran, or ""
	compressed int64   // its etcd.backup.gz
	phases     []string
	errorLines int // agent error lines during the restores
}

func benchRestore(t *testing.T, sc scale) Result {
	var r restoreRun
	t.Run(sc.named("restore-1gib"), func(t *testing.T) {
		r = runRestores(t, sc)
	})
	v, b := medianOr0(r.got), medianOr0(r.base)
	res := Result{Name: sc.named("restore-1gib"), Value: v, Unit: "s", Baseline: b, Ratio: ratio(v, b)}
	more := ""
	if r.errorLines > 0 {
		more = fmt.Sprintf("; the agents logged %d error line(s) during the restores (see the test log)", r.errorLines)
	}
	if r.emptied != "" {
		more += fmt.Sprintf("; to fit 3 nodes on this one disk, the agents ran without continuous capture (--capture=false) and without their own defragmentation (--auto-defrag=false, as the bench defragments), and once the backup was taken the bench deleted the fill, "+
			"compacted and defragmented the live cluster (%s) before the restores: the old members' data goes to the trash by a rename whatever its size", r.emptied)
	}
	if v > 0 && b > 0 {
		if v <= 2*b {
			res.Note = "meets the goal of clients back within 2× the hand-run 3-member restore; "
		} else {
			res.Note = "does NOT meet the goal of clients back within 2× the hand-run 3-member restore; "
		}
	}
	res.Note += fmt.Sprintf("etcd-manager-ctl restore-backup --timeout=20m over a live managed 3-member cluster, until clients are back: a linearizable Get on the client URLs "+
		"answers from the restored cluster (a key written after the backup is gone); "+
		"that holds the leader's pick-up (default loop interval; the ctl tells the agents it queued the command), fetch+gunzip+verify on the driving agent, stopping the old members, "+
		"fetch+gunzip+verify+restore on each of the 3 nodes in parallel and their start in quarantine, the HashKV check and lifting the quarantine (an etcd restart per member); "+
		"the command then takes a fresh full backup of the restored cluster while clients write (a %.0f MiB backup by itself, see %s) and returns: after %s s; "+
		"phases from the agents' logs: %s; "+
		"baseline: the same 3-member restore by hand, each node in parallel gunzipping the same etcd.backup.gz from the store to its own disk and running etcdutl snapshot restore as one member of a new 3-member cluster, "+
		"then the 3 etcd started until a linearizable Get succeeds, with the agents' TLS (https client and peer URLs requiring client certificates from one CA, certificates made before the clock starts); "+
		"DB filled to %.0f MiB (scale %s: %.0f MiB target) with %d KiB values of random hex in %.1fs; snapshot %.0f MiB, %.0f MiB gzipped, backed up in %.1fs; median of %d, baseline measured before each restore, each of them started with the backup dropped from the page cache (a backup taken a while ago)%s",
		mib(r.snapBytes), sc.named("backup-file-1gib"), fmtList(r.done), strings.Join(r.phases, "; "), mib(r.dbSize), sc.name, mib(sc.dbBytes), fillValueBytes>>10, r.fillSecs,
		mib(r.snapBytes), mib(r.compressed), r.backupSecs, len(r.got), more)
	return res
}

// runRestores starts a managed 3-member cluster on a file:// store, fills
// it, backs it up and measures restores of that backup.
func runRestores(t *testing.T, sc scale) restoreRun {
	var r restoreRun
	env := harness.NewEnv(t)
	conf := []string{"--member-count=3", "--etcd-version=" + harness.DefaultEtcdVersion}
	args := []string{"--backup-interval=24h"}
	if sc.leanRestore() {
		// emptyCluster defragments the members itself: the agents' own
		// defragmentation, which the freed space would start, stops
		// each member in turn, and the bench's calls would meet it.
		conf = append(conf, "--auto-defrag=false")
		args = append(args, "--capture=false")
	}
	env.MustCtl(append(append(conf, "configure-cluster"), sc.quotaArgs()...)...)
	agents := env.StartAgents(3, harness.AgentOptions{Defaults: true, ExtraArgs: args})
	harness.WaitSettled(t, agents, 3, 2*time.Minute)

	// Three members write every value, so give the fill more time than
	// the 1-member backup benchmarks do.
	fillTimeout := time.Minute
	if sc.dbBytes > 256<<20 {
		fillTimeout = max(10*time.Minute, time.Duration(sc.dbBytes>>30)*3*time.Minute)
	}
	cfg := env.ClientTLS()
	start := time.Now()
	r.dbSize = fill(t, agents[0].ClientURL, cfg, sc.dbBytes, fillTimeout)
	r.fillSecs = time.Since(start).Seconds()
	t.Logf("filled to %.0f MiB in %.1fs", mib(r.dbSize), r.fillSecs)

	var name string
	r.backupSecs, name = backupNow(t, env)
	t.Logf("backup %s taken in %.2fs", name, r.backupSecs)
	size, compressed, ok := backupMeta(env.StoreDir, name)
	if !ok || size <= 0 {
		t.Fatalf("backup %s: no readable meta with its size in %s", name, env.StoreDir)
	}
	r.snapBytes, r.compressed = size, compressed
	gz := filepath.Join(env.StoreDir, name, "etcd.backup.gz")
	if sc.leanRestore() {
		r.emptied = emptyCluster(t, agents, cfg)
		t.Logf("the live cluster's data deleted and compacted after the backup: %s", r.emptied)
	}

	for i := range sc.restoreIterations {
		// Each restore, by hand or managed, starts with the backup out of
		// the page cache, as a backup taken a while ago is: the store
		// drops what it writes from the cache, and whichever read the
		// backup first would otherwise warm it for the other.
		dropCached(t, gz)
		r.base = append(r.base, bareRestore3(t, env, gz))
		t.Logf("baseline %d: the 3-member restore by hand until a Get: %.2fs", i+1, r.base[len(r.base)-1])

		harness.WaitSettled(t, agents, 3, 2*time.Minute)
		// A key the backup lacks: once a Get no longer finds it, the
		// restored cluster serves the clients.
		putKey(t, harness.Endpoints(agents), cfg, restoreMarker)
		dropCached(t, gz)
		start := time.Now()
		backAt := make(chan time.Time, 1)
		stop := make(chan struct{})
		go func() { backAt <- untilRestored(harness.Endpoints(agents), cfg, restoreTimeout+readableTimeout, stop) }()
		id := restoreBackup(t, env, name)
		returned := time.Now()
		var back time.Time
		select {
		case back = <-backAt:
		case <-time.After(readableTimeout):
			close(stop)
			back = <-backAt
		}
		if back.IsZero() {
			t.Fatalf("after restore %d: no Get answered from the restored cluster", i+1)
		}
		end := time.Now()
		secs := back.Sub(start).Seconds()
		r.got = append(r.got, secs)
		r.done = append(r.done, returned.Sub(start).Seconds())
		phases, errLines := restorePhases(agents, id, start, returned, end)
		r.phases = append(r.phases, fmt.Sprintf("restore %d (clients back after %.1fs): %s", i+1, secs, phases))
		r.errorLines += len(errLines)
		t.Logf("restore %d of %s (command %s): clients back after %.2fs, the ctl returned after %.2fs; %s",
			i+1, name, id, secs, returned.Sub(start).Seconds(), phases)
		for _, l := range errLines {
			t.Logf("agent error during restore %d: %s", i+1, l)
		}
	}
	return r
}

// dropCached asks the kernel to drop the file at path from the page
// cache (it must hold no unwritten pages: a store's object is synced).
func dropCached(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatalf("drop %s from the page cache: %v", path, err)
	}
}

// emptyCluster deletes everything fill wrote, compacts it away,
// defragments every member and has etcd purge its WAL of the fill, so
// that the live cluster a restore replaces holds little on disk. It
// returns the members' sizes after.
func emptyCluster(t *testing.T, agents []*harness.Agent, cfg *tls.Config) string {
	t.Helper()
	endpoints := harness.Endpoints(agents)
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	resp, err := c.Delete(ctx, "/bench/fill/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("delete the fill: %v", err)
	}
	if _, err := c.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("compact the fill away: %v", err)
	}
	// A defragmentation before a member has compacted would copy the fill.
	awaitCompacted(ctx, t, c, endpoints, cfg, 5*time.Minute, func(st *clientv3.StatusResponse) bool { return st.DbSizeInUse <= 64<<20 })
	for _, ep := range endpoints {
		if _, err := c.Defragment(ctx, ep); err != nil {
			t.Fatalf("defragment %s: %v", ep, err)
		}
	}
	sizes := dbSizes(t, endpoints, cfg)
	for _, ep := range endpoints {
		if st, err := statusOf(ep, cfg); err != nil || st.DbSize > 64<<20 {
			t.Fatalf("after deleting, compacting and defragmenting, a member still holds a large database: %s", sizes)
		}
	}
	return sizes + ", WAL " + purgeWAL(t, c, agents)
}

// purgeWAL has every member's etcd drop the WAL files that hold the
// fill: 2.4 GiB each at 8 GiB, which a restore would move to the trash
// with the rest. etcd purges WAL files only up to its latest snapshot of
// its state, taken every --snapshot-count entries (10000 by default), so
// that many small writes make one. It waits until the agents' WALs hold
// at most 1 GiB together, and returns their size.
func purgeWAL(t *testing.T, c *clientv3.Client, agents []*harness.Agent) string {
	t.Helper()
	const writes, writers = 10_001, 8
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= writes && errs[w] == nil; i = next.Add(1) {
				_, errs[w] = c.Put(ctx, fmt.Sprintf("/bench/empty/%d", i%100), "x")
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("small writes for etcd's snapshot: %v", err)
	}
	walBytes := func() int64 {
		var n int64
		for _, a := range agents {
			files, _ := filepath.Glob(filepath.Join(a.DataDir, "data", "*", "member", "wal", "*.wal"))
			for _, f := range files {
				if st, err := os.Stat(f); err == nil {
					n += st.Size()
				}
			}
		}
		return n
	}
	deadline := time.Now().Add(2 * time.Minute) // etcd purges every 30 s
	for walBytes() > 1<<30 {
		if time.Now().After(deadline) {
			t.Fatalf("etcd did not purge the fill from its WAL within 2 minutes of %d writes: the members' WALs hold %.0f MiB", writes, mib(walBytes()))
		}
		time.Sleep(time.Second)
	}
	return fmt.Sprintf("%.0f MiB in all", mib(walBytes()))
}

// bareRestore3 is the baseline: the 3-member restore by hand. On the
// clock, each of 3 bare etcd's nodes, in parallel, gunzips the backup gz
// to its own disk and runs etcdutl snapshot restore as one member of a
// new cluster; then the 3 etcd start, with the TLS the agents give their
// etcd, until a linearizable Get succeeds. Certificates are made before
// the clock starts. The members are killed by PID and their data removed
// before it returns.
func bareRestore3(t *testing.T, env *harness.Env, gz string) float64 {
	t.Helper()
	bare := env.NewBareCluster(3, true)
	etcdutl := filepath.Join(env.BinDir, "etcd-v"+harness.DefaultEtcdVersion, "etcdutl")
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
	defer cancel()

	start := time.Now()
	errs := make([]error, len(bare.Members))
	var wg sync.WaitGroup
	for i, m := range bare.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			snap := m.DataDir + ".snapshot.db"
			if _, err := gunzipTo(gz, snap); err != nil {
				errs[i] = err
				return
			}
			out, err := exec.CommandContext(ctx, etcdutl, "snapshot", "restore", snap,
				"--data-dir", m.DataDir, "--name", m.Name, "--initial-cluster", bare.InitialCluster,
				"--initial-cluster-token", bare.Token, "--initial-advertise-peer-urls", m.PeerURL).CombinedOutput()
			if err != nil {
				errs[i] = fmt.Errorf("etcdutl snapshot restore for %s: %v\n%s", m.Name, err, out)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	bare.Start(env.DefaultEtcd())
	if err := untilReadable(bare.Endpoints(), bare.TLS, readableTimeout, nil); err != nil {
		t.Fatalf("3 bare etcd on the restored snapshot: %v", err)
	}
	secs := time.Since(start).Seconds()
	for _, m := range bare.Members {
		m.Kill()
		if err := os.RemoveAll(m.DataDir); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(m.DataDir + ".snapshot.db"); err != nil {
			t.Fatal(err)
		}
	}
	return secs
}

// gunzipTo writes the gunzipped src to dst and returns its size.
func gunzipTo(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	zr, err := gzip.NewReader(in)
	if err != nil {
		return 0, fmt.Errorf("gunzip %s: %w", src, err)
	}
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, zr)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("gunzip %s to %s: %w", src, dst, err)
	}
	return n, nil
}

// restoreMarker is a key written after the backup a benchmark restores:
// a Get that does not find it answers from the restored cluster.
const restoreMarker = "/bench/after-backup"

// putKey writes key through endpoints, or fails the test.
func putKey(t *testing.T, endpoints []string, cfg *tls.Config, key string) {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, key, "v"); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// untilRestored retries a linearizable Get of restoreMarker through
// endpoints every 20ms until one answers without it, and returns when
// that answer came; the zero time after timeout, or once stop is closed.
// Its client lives through the restore's outage, unlike the baseline's,
// which is made once its etcd are started: each try first resets gRPC's
// reconnect backoff, which grows over an outage to 2 minutes between
// dials, so that the figure is when the cluster serves, not when this
// client's next dial was due.
func untilRestored(endpoints []string, cfg *tls.Config, timeout time.Duration, stop <-chan struct{}) time.Time {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return time.Time{}
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c.ActiveConnection().ResetConnectBackoff()
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		resp, err := c.Get(ctx, restoreMarker)
		cancel()
		if err == nil && len(resp.Kvs) == 0 {
			return time.Now()
		}
		select {
		case <-stop:
			return time.Time{}
		case <-time.After(20 * time.Millisecond):
		}
	}
	return time.Time{}
}

// untilReadable retries a linearizable Get through endpoints, with client
// TLS cfg, until one succeeds, giving up after timeout or once gone (if
// not nil) is closed.
func untilReadable(endpoints []string, cfg *tls.Config, timeout time.Duration, gone <-chan struct{}) error {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := c.Get(ctx, "/bench/probe")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-gone:
			return fmt.Errorf("the process exited before a Get succeeded: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no Get succeeded within %s: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// restoreBackup runs etcd-manager-ctl restore-backup name, which returns
// once the restore is complete, and returns the command's ID. With point
// (as --latest), the ctl is given point instead of the name, and name is
// the backup it must report it brought forward. It runs the ctl itself,
// as backupNow does, to give a large restore its own timeout.
func restoreBackup(t *testing.T, env *harness.Env, name string, point ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout+time.Minute)
	defer cancel()
	target := []string{name}
	if len(point) > 0 {
		target = point
	}
	args := append(append([]string{"--backup-store=" + env.StoreURL, "restore-backup"}, target...), "--timeout="+restoreTimeout.String())
	if env.Insecure {
		args = append(args, "--insecure")
	}
	cmd := exec.CommandContext(ctx, env.CtlBin, args...)
	cmd.Env = append(os.Environ(), env.ExtraEnv...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil || !strings.Contains(stdout.String(), "restored backup "+name) {
		t.Fatalf("etcd-manager-ctl restore-backup %s: %v\nstdout: %s\nstderr: %s", strings.Join(target, " "), err, stdout.String(), stderr.String())
	}
	_, rest, ok := strings.Cut(stderr.String(), " as command ")
	id := strings.Fields(rest + " ")
	if !ok || len(id) == 0 {
		t.Fatalf("etcd-manager-ctl restore-backup printed no command ID: %s", stderr.String())
	}
	return id[0]
}

// restorePhases summarises restore id from the agents' logs: how long
// each phase took, from start (the ctl started) to end (a Get succeeded),
// and the agents' error lines in between. It only adds detail to a note:
// what it cannot find it leaves out.
func restorePhases(agents []*harness.Agent, id string, start, returned, end time.Time) (string, []string) {
	ev := map[string]time.Time{} // the earliest time each event was logged, by any agent
	note := func(key string, at time.Time) {
		if old, ok := ev[key]; !ok || at.Before(old) {
			ev[key] = at
		}
	}
	var token, driver, backupTook string
	var errLines []string
	type line struct {
		agent string
		at    time.Time
		text  string
	}
	var lines []line
	for _, a := range agents {
		for _, text := range strings.Split(a.Log(), "\n") {
			ts, ok := strings.CutPrefix(text, "time=")
			if !ok {
				continue // etcd's JSON lines, the harness's own
			}
			at, err := time.Parse(time.RFC3339Nano, strings.Fields(ts + " ")[0])
			if err != nil || at.Before(start) || at.After(end) {
				continue
			}
			lines = append(lines, line{a.Name, at, text})
		}
	}
	for _, l := range lines {
		switch {
		case strings.Contains(l.text, "level=ERROR"):
			errLines = append(errLines, "agent "+l.agent+": "+l.text)
		case strings.Contains(l.text, `action="prepare-restore `+id+" "):
			note("picked", l.at)
		case strings.Contains(l.text, `msg="restore started`) && strings.Contains(l.text, "command="+id):
			note("started", l.at)
			token, driver = logAttr(l.text, "cluster-token"), l.agent
		case strings.Contains(l.text, `msg="procedure moves on"`) && strings.Contains(l.text, "command="+id+" "):
			note(logAttr(l.text, "phase"), l.at)
		case strings.Contains(l.text, `msg="restore complete`) && strings.Contains(l.text, "command="+id):
			note("complete", l.at)
		case strings.Contains(l.text, `msg="backup taken"`) && strings.Contains(l.text, `reason="after restore `+id+`"`):
			backupTook = logAttr(l.text, "duration")
		}
	}
	var nodes []string
	for _, l := range lines {
		if token != "" && !ev[spec.RestoreRestoring].IsZero() && strings.Contains(l.text, `msg="restored backup; starting etcd in quarantine"`) && logAttr(l.text, "cluster-token") == token {
			nodes = append(nodes, fmt.Sprintf("%.1fs", l.at.Sub(ev["restoring"]).Seconds()))
		}
	}

	// The steps in order: the event that ends each, and what it covers.
	steps := []struct{ event, what string }{
		{"picked", "pick-up"},
		{"started", "validate (fetch+verify)"},
		{spec.RestoreRestoring, "stopping"},
		{spec.RestoreVerifying, "restoring"},
		{spec.RestoreLifting, "verifying"},
		{spec.RestoreBackingUp, "lifting"},
		{"complete", "backing-up"},
	}
	var out []string
	prev := start
	for _, s := range steps {
		at, ok := ev[s.event]
		if !ok {
			out = append(out, s.what+" ?")
			continue
		}
		part := fmt.Sprintf("%s %.1fs", s.what, at.Sub(prev).Seconds())
		switch {
		case s.event == spec.RestoreVerifying && len(nodes) > 0:
			part += " (the nodes' own restores done " + strings.Join(nodes, ", ") + " into it)"
		case s.event == "complete" && backupTook != "":
			part += " (the backup itself " + backupTook + ")"
		}
		out = append(out, part)
		prev = at
	}
	if at, ok := ev["complete"]; ok {
		out = append(out, fmt.Sprintf("then the ctl returned after %.1fs and a Get succeeded after %.1fs more", returned.Sub(at).Seconds(), end.Sub(returned).Seconds()))
	}
	if driver != "" {
		out = append(out, "driven by agent "+driver)
	}
	return strings.Join(out, ", "), errLines
}

// logAttr is the value of key in one of the agent's text log lines, or "".
func logAttr(line, key string) string {
	_, rest, ok := strings.Cut(line, " "+key+"=")
	if !ok {
		return ""
	}
	if strings.HasPrefix(rest, `"`) {
		if q, err := strconv.QuotedPrefix(rest); err == nil {
			if v, err := strconv.Unquote(q); err == nil {
				return v
			}
		}
		return ""
	}
	return strings.Fields(rest + " ")[0]
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Rolling upgrade benchmark. A managed 3-member cluster on etcd 3.5 is
// told to run 3.6 while a load generator writes about rollRate writes/s;
// the value is the time until every member's Status reports the new
// version, and the figure that matters to clients is the longest stall:
// the largest gap between two acknowledged writes, across all writers,
// during the roll. The baseline is the same roll done by hand on three
// bare etcd: each stopped (SIGTERM) and started again on the new binary
// with its data, one at a time.

const (
	rollFrom = "3.5.35"
	rollTo   = "3.6.16"
	// rollRate is the writes/s the load generator aims at, over
	// rollWriters clients, each Put bounded by rollPutTimeout.
	rollRate       = 200
	rollWriters    = 8
	rollPutTimeout = 2500 * time.Millisecond
	// rollLoadMax bounds the load in time, and rollRate times it in count.
	rollLoadMax = 10 * time.Minute
	// rollWarmup is how long the load runs before the roll starts.
	rollWarmup = 2 * time.Second
	// rollTimeout bounds one roll, managed or by hand: over ten times
	// what one takes. A managed roll that has not finished by then is
	// reported as stuck, and fails the benchmark.
	rollTimeout = 2 * time.Minute
	// stallGoal is about one etcd leader election.
	stallGoal = 2 * time.Second
)

// rollRun is what one roll under load measured.
type rollRun struct {
	secs          float64
	stall         time.Duration // the longest gap between acknowledged writes during the roll
	stallAround   string        // what the logs show around that gap
	acked, failed int
	rollRate      float64 // acknowledged writes/s during the roll
	// slowest is the longest one acknowledged Put took during the roll,
	// and writerGap the longest one writer went without an acknowledged
	// write (a failed Put included): what a single client waited, while
	// others may have gone on.
	slowest, writerGap time.Duration
	failures           string // when the failed writes were sent, and what was happening
	// stuck, when set, says why a managed roll did not finish within
	// rollTimeout; its secs are then the time waited.
	stuck string
}

func benchRollingUpgrade(t *testing.T, sc scale) []Result {
	var got, base []rollRun
	for i := range sc.rollIterations {
		t.Run("rolling-upgrade", func(t *testing.T) {
			b := runBareRoll(t)
			t.Logf("by hand %d: %.2fs, longest stall %s (%s), %d writes acknowledged, %d failed, %.0f/s during the roll",
				i+1, b.secs, b.stall.Round(time.Millisecond), b.stallAround, b.acked, b.failed, b.rollRate)
			base = append(base, b)
			m := runManagedRoll(t)
			t.Logf("managed %d: %.2fs, longest stall %s (%s), %d writes acknowledged, %d failed, %.0f/s during the roll",
				i+1, m.secs, m.stall.Round(time.Millisecond), m.stallAround, m.acked, m.failed, m.rollRate)
			if m.stuck != "" {
				t.Errorf("managed roll %d is stuck: %s", i+1, m.stuck)
			}
			got = append(got, m)
		})
	}
	// secs are the finished rolls' durations.
	secs := func(rs []rollRun) []float64 {
		var out []float64
		for _, r := range rs {
			if r.stuck == "" {
				out = append(out, r.secs)
			}
		}
		return out
	}
	var stuck []string
	for i, r := range got {
		if r.stuck != "" {
			stuck = append(stuck, fmt.Sprintf("roll %d after %.0fs: %s", i+1, r.secs, r.stuck))
		}
	}
	stuckNote, stuckShort := "", ""
	if len(stuck) > 0 {
		stuckShort = fmt.Sprintf("; %d of %d managed roll(s) did NOT finish within %s (see rolling-upgrade)", len(stuck), len(got), rollTimeout)
		stuckNote = fmt.Sprintf("; %d of %d managed roll(s) did NOT finish within %s, left out of the median (%s)",
			len(stuck), len(got), rollTimeout, strings.Join(stuck, "; "))
	}
	stalls := func(rs []rollRun) (worst float64, each string) {
		var s []string
		for _, r := range rs {
			worst = max(worst, r.stall.Seconds())
			s = append(s, fmt.Sprintf("%.3f", r.stall.Seconds()))
		}
		return worst, strings.Join(s, ", ")
	}
	writes := func(rs []rollRun) string {
		var parts []string
		for i, r := range rs {
			p := fmt.Sprintf("roll %d: %d acknowledged, %d failed, %.0f/s during the roll, slowest acknowledged Put %.3fs, longest a single writer went without an acknowledged write %.3fs",
				i+1, r.acked, r.failed, r.rollRate, r.slowest.Seconds(), r.writerGap.Seconds())
			if r.failures != "" {
				p += " (failed: " + r.failures + ")"
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "; ")
	}
	around := func(rs []rollRun) string {
		var parts []string
		for i, r := range rs {
			parts = append(parts, fmt.Sprintf("roll %d: %.3fs, %s", i+1, r.stall.Seconds(), r.stallAround))
		}
		return strings.Join(parts, "; ")
	}
	stall, each := stalls(got)
	baseStall, baseEach := stalls(base)
	verdict := "meets"
	if stall > stallGoal.Seconds() {
		verdict = "does NOT meet"
	}
	load := fmt.Sprintf("about %d writes/s from %d TLS clients on every member's client URL (a time.Ticker each, Put timeout %s, %s of load before the roll)",
		rollRate, rollWriters, rollPutTimeout, rollWarmup)

	v, b := medianOr0(secs(got)), medianOr0(secs(base))
	return []Result{
		{Name: "rolling-upgrade", Value: v, Unit: "s", Baseline: b, Ratio: ratio(v, b),
			Note: fmt.Sprintf("etcd-manager-ctl configure-cluster --etcd-version=%s on a live managed 3-member cluster on %s until every member's Status reports %s "+
				"(the leader's backup, then each member restarted on the new binary, followers first, the leader last after MoveLeader, each gated on health and catch-up; default loop interval, --backup-interval=24h), "+
				"under %s; longest stall (largest gap between acknowledged writes, across all writers, during the roll) %.3fs (rolls: %s s): %s the goal of ≤ %.0fs (about one election); "+
				"writes: %s; every acknowledged write present after each roll; "+
				"baseline: 3 bare etcd %s with the agents' TLS (https client and peer URLs requiring client certificates from one CA), stopped by hand (SIGTERM, wait for exit) and started again on %s with the same data dir and flags, one at a time, followers first, each until its Status reports %s, under the same load: longest stall %.3fs (rolls: %s s), writes: %s; median of %d managed roll(s) and of %d by hand",
				rollTo, rollFrom, rollTo, load, stall, each, verdict, stallGoal.Seconds(), writes(got),
				rollFrom, rollTo, rollTo, baseStall, baseEach, writes(base), len(secs(got)), len(secs(base))) + stuckNote},
		{Name: "rolling-upgrade-stall", Value: stall, Unit: "s", noBaseline: true,
			Note: fmt.Sprintf("%s the goal of ≤ %.0fs (about one election): the longest gap between two acknowledged writes, across all writers, during a managed %s → %s rolling upgrade of 3 members (see rolling-upgrade), max over %d roll(s) (%s s) under %s; around it: %s; by hand (baseline of rolling-upgrade) the longest stall was %.3fs (%s); no baseline",
				verdict, stallGoal.Seconds(), rollFrom, rollTo, len(got), each, load, around(got), baseStall, around(base)) + stuckShort},
	}
}

// runManagedRoll starts a managed 3-member cluster on rollFrom, puts it
// under load and times configure-cluster --etcd-version=rollTo until every
// member reports rollTo.
func runManagedRoll(t *testing.T) rollRun {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+rollFrom, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{Defaults: true, ExtraArgs: []string{"--backup-interval=24h"}})
	harness.WaitSettled(t, agents, 3, 2*time.Minute)
	urls, cfg := harness.Endpoints(agents), env.ClientTLS()
	waitVersions(t, urls, cfg, rollFrom, time.Minute)

	l := startLoad(t, urls, cfg)
	time.Sleep(rollWarmup)
	start := time.Now()
	env.MustCtl("--etcd-version="+rollTo, "configure-cluster")
	werr := untilVersions(urls, cfg, rollTo, rollTimeout)
	end := time.Now()
	var stuck string
	if werr != nil {
		stuck = stuckRoll(agents, werr)
	}
	l.halt()
	r := l.verify(t, urls, cfg, start, end)
	r.secs, r.stuck = end.Sub(start).Seconds(), stuck

	var evs []rollEvent
	for _, a := range agents {
		evs = append(evs, logEvents("agent "+a.Name, a.Log())...)
	}
	r.stallAround = describeStall(evs, l.stallFrom, l.stallTo)
	r.failures = describeFailures(l.fails, evs, start)
	logTimeline(t, "managed roll", evs, start, end)
	return r
}

// runBareRoll starts three bare etcd rollFrom as one cluster, puts them
// under load and times the roll to rollTo by hand.
func runBareRoll(t *testing.T) rollRun {
	env := harness.NewEnv(t)
	binDir := env.BinDir
	bare := env.NewBareCluster(3, true)
	bare.Start(filepath.Join(binDir, "etcd-v"+rollFrom, "etcd"))
	urls, cfg := bare.Endpoints(), bare.TLS
	untilWritable(t, urls, cfg, time.Minute)
	waitVersions(t, urls, cfg, rollFrom, time.Minute)

	// Followers first, the leader last, as the agents do (etcd hands
	// leadership on by itself when its leader is stopped gracefully).
	leader := bare.Leader()
	var order []*harness.BareEtcd
	for _, m := range bare.Members {
		if m != leader {
			order = append(order, m)
		}
	}
	order = append(order, leader)

	l := startLoad(t, urls, cfg)
	time.Sleep(rollWarmup)
	var evs []rollEvent
	start := time.Now()
	for _, m := range order {
		what := m.Name
		if m == leader {
			what += " (the leader)"
		}
		evs = append(evs, rollEvent{time.Now(), "by hand: SIGTERM to " + what})
		m.Stop()
		evs = append(evs, rollEvent{time.Now(), "by hand: " + m.Name + " exited, starting it on " + rollTo})
		m.Start(filepath.Join(binDir, "etcd-v"+rollTo, "etcd"))
		waitVersions(t, []string{m.ClientURL}, cfg, rollTo, rollTimeout)
		evs = append(evs, rollEvent{time.Now(), "by hand: " + m.Name + " reports " + rollTo})
	}
	end := time.Now()
	l.halt()
	r := l.verify(t, urls, cfg, start, end)
	r.secs = end.Sub(start).Seconds()
	for _, m := range bare.Members {
		m.Kill() // not left idling through the managed roll that follows
		evs = append(evs, logEvents(m.Name, m.Log())...)
	}
	r.stallAround = describeStall(evs, l.stallFrom, l.stallTo)
	r.failures = describeFailures(l.fails, evs, start)
	logTimeline(t, "by-hand roll", evs, start, end)
	return r
}

// Bare etcd started by hand (harness.NewBareCluster), the baselines of
// bootstrap-3, replace-member, rolling-upgrade and agent-idle. They run with TLS as the agents' etcd
// does (internal/etcdproc): https client and peer URLs, each requiring a
// certificate from one CA (--client-cert-auth, --peer-client-cert-auth),
// from harness.NewTLSFiles, so that each ratio compares like with like.
// The certificates are made before any clock starts, as an operator's
// would be.

// waitVersions polls each endpoint's Status until every one reports
// server version v.
func waitVersions(t *testing.T, endpoints []string, cfg *tls.Config, v string, timeout time.Duration) {
	t.Helper()
	if err := untilVersions(endpoints, cfg, v, timeout); err != nil {
		t.Fatal(err)
	}
}

func untilVersions(endpoints []string, cfg *tls.Config, v string, timeout time.Duration) error {
	var cs []*clientv3.Client
	for _, ep := range endpoints {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, TLS: cfg, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer c.Close()
		cs = append(cs, c)
	}
	deadline := time.Now().Add(timeout)
	var last string
	for {
		all := true
		for i, c := range cs {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := c.Status(ctx, endpoints[i])
			cancel()
			switch {
			case err != nil:
				all, last = false, fmt.Sprintf("%s: %v", endpoints[i], err)
			case st.Version != v:
				all, last = false, fmt.Sprintf("%s runs %s", endpoints[i], st.Version)
			}
			if !all {
				break
			}
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not every member reports etcd %s within %s: %s", v, timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rollLoad writes about rollRate unique keys a second from rollWriters
// clients, each on every endpoint, and records every acknowledged write.
// It is bounded by rollRate*rollLoadMax writes and rollLoadMax.
type rollLoad struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	acks    []rollAck
	fails   []rollAck // key unset, err set
	started time.Time
	// stallFrom and stallTo bound the longest gap found by verify.
	stallFrom, stallTo time.Time
}

// rollAck is one write's outcome: when it returned, how long it took, and
// its key if acknowledged or its error if not.
type rollAck struct {
	writer   int
	at       time.Time
	took     time.Duration
	key, err string
	// member is the address of the member that served the write's last
	// attempt.
	member string
}

// servedBy records in a request's context which member served it.
type servedBy struct{ addr string }

type servedByKey struct{}

// recordServer is a gRPC client interceptor that notes in the request's
// servedBy which member each attempt went to.
func recordServer(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var p grpcpeer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	if s, ok := ctx.Value(servedByKey{}).(*servedBy); ok && p.Addr != nil {
		s.addr = p.Addr.String()
	}
	return err
}

const rollPrefix = "/bench/roll/"

func startLoad(t *testing.T, endpoints []string, cfg *tls.Config) *rollLoad {
	t.Helper()
	l := &rollLoad{stop: make(chan struct{}), done: make(chan struct{}), started: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), rollLoadMax)
	period := rollWriters * time.Second / rollRate
	perWriter := int(rollRate*rollLoadMax/time.Second) / rollWriters
	var cs []*clientv3.Client
	var wg sync.WaitGroup
	for w := range rollWriters {
		c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(recordServer)}})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		cs = append(cs, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the writers evenly over one period.
			select {
			case <-time.After(time.Duration(w) * period / rollWriters):
			case <-l.stop:
				return
			}
			tick := time.NewTicker(period)
			defer tick.Stop()
			for i := range perWriter {
				select {
				case <-l.stop:
					return
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				key := fmt.Sprintf("%s%d/%07d", rollPrefix, w, i)
				pctx, pcancel := context.WithTimeout(ctx, rollPutTimeout)
				by := &servedBy{}
				sent := time.Now()
				_, err := c.Put(context.WithValue(pctx, servedByKey{}, by), key, "v")
				at := time.Now()
				pcancel()
				l.mu.Lock()
				if err != nil {
					l.fails = append(l.fails, rollAck{writer: w, at: at, took: at.Sub(sent), err: err.Error(), member: by.addr})
				} else {
					l.acks = append(l.acks, rollAck{writer: w, at: at, took: at.Sub(sent), key: key, member: by.addr})
				}
				l.mu.Unlock()
			}
		}()
	}
	go func() {
		wg.Wait()
		cancel()
		for _, c := range cs {
			c.Close()
		}
		close(l.done)
	}()
	t.Cleanup(l.halt)
	return l
}

// halt stops the writers and waits for their last writes.
func (l *rollLoad) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// verify checks, once the load is halted, that every acknowledged write
// is present, and measures the longest gap between acknowledged writes
// that overlaps the roll from start to end.
func (l *rollLoad) verify(t *testing.T, endpoints []string, cfg *tls.Config, start, end time.Time) rollRun {
	t.Helper()
	l.halt()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, rollPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatalf("read the load's keys back: %v", err)
	}
	have := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		have[string(kv.Key)] = true
	}
	var lost []string
	for _, a := range l.acks {
		if !have[a.key] {
			lost = append(lost, a.key)
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d acknowledged writes are lost, first %s", len(lost), len(l.acks), lost[0])
	}
	if len(l.acks) < 50 {
		t.Fatalf("only %d writes were acknowledged (%d failed)", len(l.acks), len(l.fails))
	}

	acks := append([]rollAck(nil), l.acks...)
	sort.Slice(acks, func(i, j int) bool { return acks[i].at.Before(acks[j].at) })
	r := rollRun{acked: len(acks), failed: len(l.fails)}
	// The longest one writer waited between acknowledged writes, over
	// gaps that overlap the roll.
	lastOf := map[int]time.Time{}
	for _, a := range acks {
		if prev, ok := lastOf[a.writer]; ok && !a.at.Before(start) && !prev.After(end) {
			r.writerGap = max(r.writerGap, a.at.Sub(prev))
		}
		lastOf[a.writer] = a.at
	}
	during := 0
	for i, a := range acks {
		if !a.at.Before(start) && !a.at.After(end) {
			during++
			r.slowest = max(r.slowest, a.took)
		}
		if i == 0 {
			continue
		}
		prev := acks[i-1].at
		if a.at.Before(start) || prev.After(end) {
			continue // the gap does not overlap the roll
		}
		if d := a.at.Sub(prev); d > r.stall {
			r.stall, l.stallFrom, l.stallTo = d, prev, a.at
		}
	}
	if last := acks[len(acks)-1].at; last.Before(end) {
		// No write was acknowledged after some point of the roll.
		if d := end.Sub(last); d > r.stall {
			r.stall, l.stallFrom, l.stallTo = d, last, end
		}
	}
	r.rollRate = float64(during) / end.Sub(start).Seconds()
	return r
}

// inFlight says which members served the writes in flight across the
// gap from..to (sent before it ended, returned after it began), and how
// they ended: "127.0.0.1:2379: 5 acknowledged (slowest 2.1s), 3 failed".
func (l *rollLoad) inFlight(from, to time.Time) string {
	type tally struct {
		acked, failed int
		slowest       time.Duration
	}
	by := map[string]*tally{}
	count := func(rs []rollAck, failed bool) {
		for _, r := range rs {
			if r.at.Before(from) || r.at.Add(-r.took).After(to) {
				continue
			}
			m := cmp.Or(r.member, "no member")
			if by[m] == nil {
				by[m] = &tally{}
			}
			if failed {
				by[m].failed++
			} else {
				by[m].acked++
			}
			by[m].slowest = max(by[m].slowest, r.took)
		}
	}
	l.mu.Lock()
	count(l.acks, false)
	count(l.fails, true)
	l.mu.Unlock()
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(by)) {
		t := by[m]
		parts = append(parts, fmt.Sprintf("%s: %d acknowledged, %d failed (slowest %.2fs)", m, t.acked, t.failed, t.slowest.Seconds()))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

// rollEvent is something the logs (or the by-hand roll) show at a time.
type rollEvent struct {
	at   time.Time
	what string
}

// logEvents picks from an agent's or etcd's log the lines that explain a
// stall: the agents' steps (restarts, leadership hand-over, backups,
// warnings and errors) and etcd's leadership changes.
func logEvents(who, log string) []rollEvent {
	var out []rollEvent
	agentMsgs := []string{"restarting a member on another etcd version", "restarting etcd on another version",
		"stopping etcd", "etcd stopped", "etcd started", "raft leadership handed on", "backup taken",
		"defragmenting a member", "member defragmented", "stopping etcd to defragment its database offline", "etcd defragmented, and serves its clients again"}
	etcdMsgs := []string{"elected leader", "lost leader", "transfer leadership", "leadership transfer", "became leader",
		"database snapshot", "slow fdatasync", "apply request took too long", "ready to serve client requests"}
	for _, line := range strings.Split(log, "\n") {
		if ts, ok := strings.CutPrefix(line, "time="); ok {
			at, err := time.Parse(time.RFC3339Nano, strings.Fields(ts + " ")[0])
			if err != nil {
				continue
			}
			msg := logAttr(line, "msg")
			keep := strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN")
			for _, m := range agentMsgs {
				keep = keep || msg == m
			}
			if keep {
				what := who + ": " + msg
				if reason := logAttr(line, "reason"); msg == "backup taken" && reason != "" {
					what += " (" + reason + ", " + logAttr(line, "duration") + ")"
				}
				out = append(out, rollEvent{at, what})
			}
			continue
		}
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var e struct {
			TS  string `json:"ts"`
			Msg string `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		keep := false
		for _, m := range etcdMsgs {
			keep = keep || strings.Contains(e.Msg, m)
		}
		if !keep {
			continue
		}
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999Z0700"} {
			if at, err := time.Parse(layout, e.TS); err == nil {
				out = append(out, rollEvent{at, who + " etcd: " + e.Msg})
				break
			}
		}
	}
	return out
}

// describeStall lists the events from a little before the stall from..to
// to its end, each with its offset from the stall's start.
func describeStall(evs []rollEvent, from, to time.Time) string {
	if from.IsZero() {
		return "no stall found"
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	var parts []string
	for _, e := range evs {
		if e.at.Before(from.Add(-time.Second)) || e.at.After(to) {
			continue
		}
		parts = append(parts, fmt.Sprintf("%+.2fs %s", e.at.Sub(from).Seconds(), e.what))
	}
	head := fmt.Sprintf("from %s to %s", from.UTC().Format("15:04:05.000"), to.UTC().Format("15:04:05.000"))
	if len(parts) == 0 {
		return head + ", no logged event within a second before it or during it"
	}
	if len(parts) > 8 {
		parts = append(parts[:8], fmt.Sprintf("and %d more", len(parts)-8))
	}
	return head + ", logged around it: " + strings.Join(parts, ", ")
}

// logTimeline logs the events of a roll from start to end, with their
// offsets from start.
func logTimeline(t *testing.T, what string, evs []rollEvent, start, end time.Time) {
	t.Helper()
	sort.Slice(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	var b strings.Builder
	for _, e := range evs {
		if !e.at.Before(start) && !e.at.After(end) {
			fmt.Fprintf(&b, "\n  %7.3fs %s", e.at.Sub(start).Seconds(), e.what)
		}
	}
	t.Logf("%s, %.2fs from %s:%s", what, end.Sub(start).Seconds(), start.UTC().Format("15:04:05.000"), b.String())
}

// describeFailures says when each failed write (the first few) was sent,
// relative to the roll's start, why it failed, and the last event logged
// before it was sent.
func describeFailures(fails []rollAck, evs []rollEvent, start time.Time) string {
	if len(fails) == 0 {
		return ""
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	var parts []string
	for i, f := range fails {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(fails)-3))
			break
		}
		sent := f.at.Add(-f.took)
		p := fmt.Sprintf("one sent at %+.2fs, %s after %.2fs", sent.Sub(start).Seconds(), f.err, f.took.Seconds())
		for j := len(evs) - 1; j >= 0; j-- {
			if !evs[j].at.After(sent) {
				p += fmt.Sprintf(", %.2fs after %s", sent.Sub(evs[j].at).Seconds(), evs[j].what)
				break
			}
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// stuckRoll says why a managed roll has not finished: the last "version
// change waits" or "a rolling change waits" line each agent logged (the agents log a wait once, when
// it begins), and each member's version and raft index by Status now.
func stuckRoll(agents []*harness.Agent, err error) string {
	parts := []string{err.Error()}
	for _, a := range agents {
		var last string
		for _, line := range strings.Split(a.Log(), "\n") {
			if strings.HasPrefix(line, "time=") && (strings.Contains(line, "version change waits") || strings.Contains(line, "a rolling change waits")) {
				last = line
			}
		}
		if last != "" {
			parts = append(parts, "agent "+a.Name+" last logged: "+last)
		}
	}
	var now []string
	for _, a := range agents {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL}, TLS: a.TLS(), DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := c.Status(ctx, a.ClientURL)
		cancel()
		c.Close()
		if err != nil {
			now = append(now, fmt.Sprintf("agent %s: %v", a.Name, err))
			continue
		}
		role := ""
		if st.Leader == st.Header.MemberId {
			role = ", raft leader"
		}
		now = append(now, fmt.Sprintf("agent %s: etcd %s, raft index %d%s", a.Name, st.Version, st.RaftIndex, role))
	}
	return strings.Join(parts, "; ") + "; by Status now: " + strings.Join(now, ", ")
}

// Idle benchmarks. A managed 1-member cluster (the agent with its default
// timings) and one bare etcd of the same version, started by hand, run
// side by side. Once both are writable and the agent has finished its
// start-up work, both are measured over the same window of sc.idleWindow:
// the agent process itself (not its etcd child) and the bare etcd, their
// VmRSS every idleSampleEvery and their CPU time over the window.
//
// The CPU time is the sum over the process's threads of the run time in
// /proc/<pid>/task/<tid>/schedstat, in ns. The kernel derives utime+stime
// in /proc/<pid>/stat from the same run time, but reports them in ticks of
// 10ms: an idle agent uses about 6ms in the 5s of the small scale, so
// utime+stime read 0 there in 4 runs of 5. They are still read, as a
// cross-check given in the note.

const (
	idleSampleEvery = time.Second
	// idleSettle follows the agent's first periodic backup, which is due
	// as soon as the cluster exists: a little over two cycles at the
	// default loop interval (2s), so the window holds steady cycles only.
	idleSettle = 5 * time.Second
	// userHZ is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
	// which is 100 on every architecture Go runs Linux on.
	userHZ = 100
)

// idleProc is one process measured over the idle window.
type idleProc struct {
	pid    int
	rssMiB []float64 // VmRSS, every idleSampleEvery
	cpuNs  int64     // its threads' run time over the window
	ticks  int64     // utime+stime over the window, in 1/userHZ s
	// exited counts threads gone by the window's end: their run time
	// after its start is missing from cpuNs (ticks still hold it).
	exited int
}

func (p idleProc) meanRSS() float64 {
	if len(p.rssMiB) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range p.rssMiB {
		sum += x
	}
	return sum / float64(len(p.rssMiB))
}

func (p idleProc) rssRange() string {
	if len(p.rssMiB) == 0 {
		return "no samples"
	}
	lo, hi := p.rssMiB[0], p.rssMiB[0]
	for _, x := range p.rssMiB {
		lo, hi = min(lo, x), max(hi, x)
	}
	return fmt.Sprintf("%.1f–%.1f MiB", lo, hi)
}

func (p idleProc) cpuSecs() float64 { return float64(p.cpuNs) / 1e9 }

func (p idleProc) tickSecs() float64 { return float64(p.ticks) / userHZ }

// cpuPercent is the process's CPU time over the window as a percentage of
// one core.
func (p idleProc) cpuPercent(window time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return 100 * p.cpuSecs() / window.Seconds()
}

// cpuCheck is the cross-check for the note: utime+stime, and any thread
// that exited.
func (p idleProc) cpuCheck() string {
	s := fmt.Sprintf("utime+stime %.2f CPU-s", p.tickSecs())
	if p.exited > 0 {
		s += fmt.Sprintf(", %d thread(s) exited during the window", p.exited)
	}
	return s
}

// idleRun is what the idle benchmarks measured.
type idleRun struct {
	agent, child, bare idleProc // child: the agent's etcd
	window             time.Duration
	agentLines         int // lines the agent itself logged during the window
	backups            int // backups the agent took during the window
}

func benchIdle(t *testing.T, sc scale) []Result {
	var r idleRun
	t.Run("agent-idle", func(t *testing.T) {
		r = runIdle(t, sc)
	})
	n := len(r.agent.rssMiB)
	setup := fmt.Sprintf("a managed 1-member cluster on etcd %s, default timings (loop interval 2s, --backup-interval 15m), TLS as shipped, idle: "+
		"measured once writable, its first periodic backup taken (due as soon as the cluster exists) and %s more; "+
		"the agent logged %d line(s) of its own and took %d backup(s) during the window; "+
		"the bare etcd and the managed cluster ran side by side, measured over the same %.1fs window (scale %s)",
		harness.DefaultEtcdVersion, idleSettle, r.agentLines, r.backups, r.window.Seconds(), sc.name)

	rss, baseRSS := r.agent.meanRSS(), r.bare.meanRSS()
	cpu, baseCPU := r.agent.cpuPercent(r.window), r.bare.cpuPercent(r.window)
	return []Result{
		{Name: "agent-idle-rss", Value: rss, Unit: "MiB", Baseline: baseRSS, Ratio: ratio(rss, baseRSS),
			Note: goal(rss <= goalIdleRSSMiB, fmt.Sprintf("at most %d MiB", goalIdleRSSMiB)) + fmt.Sprintf("the agent process's VmRSS (not its etcd child), mean of %d samples %s apart (range %s); %s; "+
				"baseline: a bare etcd %s started by hand as a 1-member cluster with the agents' TLS (https client and peer URLs requiring client certificates from one CA), its VmRSS at the same instants (mean, range %s); "+
				"the agent's etcd child averaged %.1f MiB (range %s), so agent and etcd together %.1f MiB, %.2f× the bare etcd",
				n, idleSampleEvery, r.agent.rssRange(), setup,
				harness.DefaultEtcdVersion, r.bare.rssRange(),
				r.child.meanRSS(), r.child.rssRange(), rss+r.child.meanRSS(), ratio(rss+r.child.meanRSS(), baseRSS))},
		{Name: "agent-idle-cpu", Value: cpu, Unit: "% of a core", Baseline: baseCPU, Ratio: ratio(cpu, baseCPU),
			Note: goal(cpu <= baseCPU, "at most the bare etcd's") + fmt.Sprintf("the agent process's CPU time (not its etcd child's) over the window as a percentage of one core (1%% = 0.6 CPU-seconds a minute): "+
				"%.3f CPU-s in %.1fs, the run time of its threads from /proc/<pid>/task/*/schedstat (ns; the figure utime+stime in /proc/<pid>/stat rounds to 10ms ticks; cross-check: %s); %s; "+
				"baseline: a bare etcd %s started by hand as a 1-member cluster with the agents' TLS (https client and peer URLs requiring client certificates from one CA), its CPU time over the same window: %.3f CPU-s (%s); "+
				"the agent's etcd child used %.3f CPU-s (%.2f%% of a core; %s), so agent and etcd together %.2f%%, %.2f× the bare etcd",
				r.agent.cpuSecs(), r.window.Seconds(), r.agent.cpuCheck(), setup,
				harness.DefaultEtcdVersion, r.bare.cpuSecs(), r.bare.cpuCheck(),
				r.child.cpuSecs(), r.child.cpuPercent(r.window), r.child.cpuCheck(), cpu+r.child.cpuPercent(r.window), ratio(cpu+r.child.cpuPercent(r.window), baseCPU))},
	}
}

// runIdle starts the managed cluster and the bare etcd, waits until both
// are writable and the agent has settled, then measures both over one
// window.
func runIdle(t *testing.T, sc scale) idleRun {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	bares := env.NewBareCluster(1, true)
	bares.Start(env.DefaultEtcd())
	bare := bares.Members[0]
	agent := env.StartAgents(1, harness.AgentOptions{Defaults: true})[0]
	untilWritable(t, bares.Endpoints(), bares.TLS, time.Minute)
	harness.WaitSettled(t, []*harness.Agent{agent}, 1, 2*time.Minute)
	untilWritable(t, []string{agent.ClientURL}, agent.TLS(), time.Minute)
	agent.WaitLog(`msg="backup taken"`, 1, time.Minute)
	time.Sleep(idleSettle)

	childPID := agent.EtcdPID()
	if childPID <= 0 {
		t.Fatal("the agent's etcd has no pid file")
	}
	r := idleRun{agent: idleProc{pid: agent.PID()}, child: idleProc{pid: childPID}, bare: idleProc{pid: bare.PID()}}
	log := agent.Log()
	lines, backups := ownLogLines(log), strings.Count(log, `msg="backup taken"`)
	r.window = measureIdle(t, sc.idleWindow, &r.agent, &r.child, &r.bare)
	if pid := agent.EtcdPID(); pid != childPID {
		t.Fatalf("the agent's etcd changed during the window: pid %d, then %d", childPID, pid)
	}
	log = agent.Log()
	r.agentLines, r.backups = ownLogLines(log)-lines, strings.Count(log, `msg="backup taken"`)-backups
	t.Logf("idle over %.1fs: agent RSS mean %.1f MiB (%s), CPU %.3fs = %.2f%% (%s); its etcd RSS mean %.1f MiB, CPU %.3fs (%s); bare etcd RSS mean %.1f MiB (%s), CPU %.3fs = %.2f%% (%s); the agent logged %d line(s)",
		r.window.Seconds(), r.agent.meanRSS(), r.agent.rssRange(), r.agent.cpuSecs(), r.agent.cpuPercent(r.window), r.agent.cpuCheck(),
		r.child.meanRSS(), r.child.cpuSecs(), r.child.cpuCheck(), r.bare.meanRSS(), r.bare.rssRange(), r.bare.cpuSecs(), r.bare.cpuPercent(r.window), r.bare.cpuCheck(), r.agentLines)
	return r
}

// ownLogLines counts the agent's own lines in its log (etcd's are JSON).
func ownLogLines(log string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(line, "time=") {
			n++
		}
	}
	return n
}

// measureIdle samples the VmRSS of every process at the start of window
// and every idleSampleEvery after it, and takes each one's CPU time over
// it. It returns the window as measured.
func measureIdle(t *testing.T, window time.Duration, ps ...*idleProc) time.Duration {
	t.Helper()
	start := make([]int64, len(ps))
	startNs := make([]map[int]int64, len(ps))
	begin := time.Now()
	for i, p := range ps {
		startNs[i] = threadRunNs(t, p.pid)
		start[i] = cpuTicks(t, p.pid)
	}
	sample := func() {
		for _, p := range ps {
			p.rssMiB = append(p.rssMiB, procStatusMiB(t, p.pid, "VmRSS"))
		}
	}
	sample()
	tick := time.NewTicker(idleSampleEvery)
	defer tick.Stop()
	for range int(window / idleSampleEvery) {
		<-tick.C
		sample()
	}
	for i, p := range ps {
		end := threadRunNs(t, p.pid)
		p.ticks = cpuTicks(t, p.pid) - start[i]
		for tid, ns := range end {
			p.cpuNs += ns - startNs[i][tid] // a thread started since counts from 0
		}
		for tid := range startNs[i] {
			if _, ok := end[tid]; !ok {
				p.exited++
			}
		}
	}
	return time.Since(begin)
}

// threadRunNs is the run time of each of pid's threads so far, in ns: the
// first field of /proc/<pid>/task/<tid>/schedstat.
func threadRunNs(t *testing.T, pid int) map[int]int64 {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int64{}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // the thread exited since the listing
		}
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(data))
		if len(f) == 0 {
			t.Fatalf("%s/%d/schedstat: %q", dir, tid, data)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			t.Fatalf("%s/%d/schedstat: %q: %v", dir, tid, data, err)
		}
		out[tid] = ns
	}
	if len(out) == 0 {
		t.Fatalf("%s: no threads", dir)
	}
	return out
}

// cpuTicks is utime+stime of pid, from /proc/<pid>/stat, in 1/userHZ s.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name, field 2, is in parentheses and may hold spaces;
	// the fields after it start with field 3, the state.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		t.Fatalf("/proc/%d/stat: %q", pid, data)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %q", pid, data)
	}
	var sum int64
	for _, s := range f[11:13] { // fields 14 and 15: utime, stime
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/stat: %q: %v", pid, data, err)
		}
		sum += n
	}
	return sum
}
