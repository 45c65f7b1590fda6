package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// defrag-stall: the longest gap between acknowledged writes while the
// managed cluster defragments its three members (etcd-manager-ctl
// defrag: followers first, each isolated, its etcd stopped while its
// agent copies the database offline so that clients fail over,
// leadership handed on before the leader's turn),
// against the baseline of defragmenting the leader in place by hand on
// the same cluster, under the same load, with the same free space.
//
// nospace-recovery: how long writes fail once a managed cluster's
// database fills its backend quota with history (NOSPACE), until a write
// succeeds again; the agents compact, defragment and disarm the alarm on
// their own. The baseline is a person who does the same on a bare
// cluster the instant the first write fails.

// defragStallGoal is the goal for the managed stall, as a share
// of the baseline's.
const defragStallGoal = 0.1

func benchDefragStall(t *testing.T, sc scale) []Result {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "--auto-defrag=false", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{Defaults: true, ExtraArgs: []string{"--backup-interval=24h"}})
	harness.WaitSettled(t, agents, 3, 2*time.Minute)
	var endpoints []string
	for _, a := range agents {
		endpoints = append(endpoints, a.ClientURL)
	}
	cfg := agents[0].TLS()
	fillTimeout, backupWait := time.Minute, time.Minute
	if sc.name == "full" {
		fillTimeout, backupWait = 10*time.Minute, 3*time.Minute
	}

	// Managed first: it leaves every member compact, so that the second
	// fragmentation is alike on all three.
	before := fragment(t, endpoints, cfg, sc.dbBytes, fillTimeout)
	awaitCaptureBase(t, agents, time.Now().Add(-5*time.Second), backupWait)
	managedQuiet := awaitCaptureQuiet(t, sc, agents)
	l := startLoad(t, endpoints, cfg)
	time.Sleep(rollWarmup)
	fsyncs := sampleFsyncs(endpoints, cfg)
	start := time.Now()
	env.MustCtl("defrag", "--timeout=30m")
	end := time.Now()
	managedFsyncs := fsyncs.counts()
	time.Sleep(time.Second)
	managed := l.verify(t, endpoints, cfg, start, end)
	var evs []rollEvent
	for _, a := range agents {
		evs = append(evs, logEvents("agent "+a.Name, a.Log())...)
	}
	managed.stallAround = describeStall(evs, l.stallFrom, l.stallTo)
	logTimeline(t, "managed defragmentation", evs, start, end)
	managedInFlight := l.inFlight(l.stallFrom, l.stallTo)
	after := dbSizes(t, endpoints, cfg)
	t.Logf("managed: %s, longest stall %s (%s; writes in flight across it, by the member serving them: %s), %d acknowledged, %d failed; databases %s -> %s; WAL fsyncs meanwhile: %s; failures by member over the run: %s",
		end.Sub(start).Round(time.Millisecond), managed.stall.Round(time.Millisecond), managed.stallAround, managedInFlight, managed.acked, managed.failed, before, after, managedFsyncs, l.inFlight(start, end))

	beforeHand := fragment(t, endpoints, cfg, sc.dbBytes, fillTimeout)
	awaitCaptureBase(t, agents, time.Now().Add(-5*time.Second), backupWait)
	handQuiet := awaitCaptureQuiet(t, sc, agents)
	leader := leaderEndpoint(t, endpoints, cfg)
	l = startLoad(t, endpoints, cfg)
	time.Sleep(rollWarmup)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{leader}, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	fsyncs = sampleFsyncs(endpoints, cfg)
	startHand := time.Now()
	if _, err := c.Defragment(ctx, leader); err != nil {
		t.Fatalf("defragment the leader by hand: %v", err)
	}
	endHand := time.Now()
	handFsyncs := fsyncs.counts()
	time.Sleep(time.Second)
	hand := l.verify(t, endpoints, cfg, startHand, endHand)
	hand.stallAround = describeStall([]rollEvent{{startHand, "the leader's defragmentation by hand begins"}, {endHand, "it ends"}}, l.stallFrom, l.stallTo)
	handInFlight := l.inFlight(l.stallFrom, l.stallTo)
	t.Logf("by hand: %s, longest stall %s (%s; writes in flight across it, by the member serving them: %s), %d acknowledged, %d failed; databases %s; WAL fsyncs meanwhile: %s; by member over the run: %s",
		endHand.Sub(startHand).Round(time.Millisecond), hand.stall.Round(time.Millisecond), hand.stallAround, handInFlight, hand.acked, hand.failed, beforeHand, handFsyncs, l.inFlight(startHand, endHand))

	v, b := managed.stall.Seconds(), hand.stall.Seconds()
	verdict := "meets"
	if ratio(v, b) > defragStallGoal {
		verdict = "does NOT meet"
	}
	return []Result{{Name: "defrag-stall", Value: v, Unit: "s", Baseline: b, Ratio: ratio(v, b),
		Note: fmt.Sprintf("%s the goal of ≤ %.1fx: the longest gap between acknowledged writes, across all writers, while etcd-manager-ctl defrag "+
			"defragmented the 3 members of a managed cluster (etcd %s, followers first, each isolated (etcd stopped, its database copied offline in fsynced transactions of 8 MiB), leadership handed on before the leader's turn; took %.2fs; "+
			"databases before %s, after %s; %d writes acknowledged, %d failed, slowest acknowledged Put %.3fs; the longest gap %s, the writes in flight across it by the member serving them: %s; etcd's WAL fsyncs meanwhile, per member: %s), under %d writes/s from %d TLS clients on every member's client URL; "+
			"baseline: the same cluster's leader defragmented in place by hand (clientv3 Defragment on its endpoint; took %.2fs; databases before %s; %d acknowledged, %d failed, slowest %.3fs; the writes in flight across its longest gap by the member serving them: %s; WAL fsyncs meanwhile: %s) under the same load; "+
			"each database filled to %.0f MiB with %d KiB values, half of them deleted and compacted away; before the managed run %s; before the baseline %s",
			verdict, defragStallGoal, harness.DefaultEtcdVersion, end.Sub(start).Seconds(), before, after, managed.acked, managed.failed, managed.slowest.Seconds(), managed.stallAround, managedInFlight, managedFsyncs,
			rollRate, rollWriters, endHand.Sub(startHand).Seconds(), beforeHand, hand.acked, hand.failed, hand.slowest.Seconds(), handInFlight, handFsyncs,
			mib(sc.dbBytes), fillValueBytes>>10, managedQuiet, handQuiet)}}
}

// awaitCaptureQuiet waits, at full scale, until continuous capture has
// merged the segments of the fill on every agent (see awaitMerged): that
// catch-up writes about as much as the fill to the file:// store, on this
// machine's one disk, and the bench's 1 GiB in a minute is its doing, not
// the defragmentation's. It says what it did, for the note.
func awaitCaptureQuiet(t *testing.T, sc scale, agents []*harness.Agent) string {
	t.Helper()
	if sc.name == "small" {
		return "capture's merges were not waited for (small scale)"
	}
	filled := time.Now()
	var waited time.Duration
	done := true
	for _, a := range agents {
		w, ok := awaitMerged(t, a, filled, 6*time.Minute)
		waited, done = max(waited, w), done && ok
	}
	if !done {
		return fmt.Sprintf("capture still merged the fill's segments when it began (the bench gave up waiting after %s)", waited.Round(time.Second))
	}
	return fmt.Sprintf("capture had merged the fill's segments (%s waited)", waited.Round(time.Second))
}

// awaitCaptureBase waits for the full backup that continuous capture
// takes when fragment compacted past it, so that neither run shares the
// disk with a backup of the whole database: the agents' own compaction
// keeps behind capture, and the bench's does not. When capture asks for
// no backup within captureLossWait, nothing is waited for: one that
// starts again after a full backup newer than the compaction asks for
// none.
func awaitCaptureBase(t *testing.T, agents []*harness.Agent, since time.Time, timeout time.Duration) {
	t.Helper()
	const captureLossWait = 30 * time.Second
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var evs []rollEvent
		for _, a := range agents {
			evs = append(evs, logEvents(a.Name, a.Log())...)
		}
		sort.Slice(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
		var lost time.Time
		for _, e := range evs {
			switch {
			case e.at.Before(since):
			case lost.IsZero() && strings.Contains(e.what, "capture needs a fresh full backup"):
				lost = e.at
			case !lost.IsZero() && strings.Contains(e.what, ": backup taken"):
				t.Logf("capture's fresh full backup: %s at %s", e.what, e.at.UTC().Format("15:04:05.000"))
				return
			}
		}
		if lost.IsZero() && time.Since(since) > captureLossWait {
			return
		}
		time.Sleep(time.Second)
	}
	t.Logf("no fresh full backup for capture within %s of the compaction; going on", timeout)
}

// fragment fills the database to target, deletes half of what the fill
// wrote, and compacts it away: every member is left with about half its
// database free. It returns the members' sizes, as "size/in-use" MiB.
func fragment(t *testing.T, endpoints []string, cfg *tls.Config, target int64, timeout time.Duration) string {
	t.Helper()
	fill(t, endpoints[0], cfg, target, timeout)
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var rev int64
	for w := range fillClients / 2 {
		resp, err := c.Delete(ctx, fmt.Sprintf("/bench/fill/%d/", w), clientv3.WithPrefix())
		if err != nil {
			t.Fatalf("delete half the fill: %v", err)
		}
		rev = resp.Header.Revision
	}
	if _, err := c.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("compact: %v", err)
	}
	awaitCompacted(ctx, t, c, endpoints, cfg, time.Minute, func(st *clientv3.StatusResponse) bool { return st.DbSizeInUse <= st.DbSize*3/4 })
	return dbSizes(t, endpoints, cfg)
}

// awaitCompacted waits, up to within, until every member's status
// passes compacted: each member compacts on its own, after the one that
// served the Compact. bbolt counts the pages a compaction freed as free
// only from a later write, so small ones are made while waiting.
func awaitCompacted(ctx context.Context, t *testing.T, c *clientv3.Client, endpoints []string, cfg *tls.Config, within time.Duration, compacted func(*clientv3.StatusResponse) bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for i := 0; ; i++ {
		if _, err := c.Put(ctx, "/bench/compact/touch", fmt.Sprint(i)); err != nil {
			t.Fatalf("put: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
		done := true
		for _, ep := range endpoints {
			st, err := statusOf(ep, cfg)
			if err != nil || !compacted(st) {
				done = false
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the members did not all compact within %s: %s", within, dbSizes(t, endpoints, cfg))
		}
	}
}

// dbSizes renders each member's database size and in-use size in MiB.
func dbSizes(t *testing.T, endpoints []string, cfg *tls.Config) string {
	t.Helper()
	var out []string
	for _, ep := range endpoints {
		st, err := statusOf(ep, cfg)
		if err != nil {
			t.Fatalf("status of %s: %v", ep, err)
		}
		out = append(out, fmt.Sprintf("%.0f/%.0f", mib(st.DbSize), mib(st.DbSizeInUse)))
	}
	return "[" + strings.Join(out, " ") + "] MiB (size/in use)"
}

func statusOf(endpoint string, cfg *tls.Config) (*clientv3.StatusResponse, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Status(ctx, endpoint)
}

// leaderEndpoint is the endpoint of the raft leader.
func leaderEndpoint(t *testing.T, endpoints []string, cfg *tls.Config) string {
	t.Helper()
	for _, ep := range endpoints {
		if st, err := statusOf(ep, cfg); err == nil && st.Leader == st.Header.MemberId {
			return ep
		}
	}
	t.Fatal("no member leads")
	return ""
}

// nospaceValueBytes is the value the NOSPACE writer overwrites its keys
// with, and nospaceKeys how many keys it cycles through: the live data
// stays small, the history fills the quota.
const (
	nospaceValueBytes = 64 << 10
	nospaceKeys       = 32
	nospaceTimeout    = 5 * time.Minute
)

func benchNoSpace(t *testing.T, sc scale) []Result {
	quota := int64(64 << 20)
	if sc.name == "full" {
		quota = 512 << 20
	}
	quotaArg := fmt.Sprintf("--quota-backend-bytes=%d", quota)

	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, quotaArg, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{Defaults: true, ExtraArgs: []string{"--backup-interval=24h"}})
	harness.WaitSettled(t, agents, 3, 2*time.Minute)
	var endpoints []string
	for _, a := range agents {
		endpoints = append(endpoints, a.ClientURL)
	}
	managed := runNoSpace(t, endpoints, agents[0].TLS(), nil)
	t.Logf("managed: writes failed for %s (%d puts before the alarm)", managed.down.Round(time.Millisecond), managed.puts)
	for _, a := range agents {
		var steps []string
		for _, line := range strings.Split(a.Log(), "\n") {
			if !strings.HasPrefix(line, "{") && (strings.Contains(line, "NOSPACE") || strings.Contains(line, "defrag") ||
				strings.Contains(line, "action failed") || strings.Contains(line, "waits")) {
				steps = append(steps, line)
			}
		}
		t.Logf("agent %s's steps:\n%s", a.Name, tail(strings.Join(steps, "\n"), 40))
	}

	bare := env.NewBareCluster(3, true)
	bare.AddArgs(quotaArg)
	bare.Start(env.DefaultEtcd())
	hand := runNoSpace(t, bare.Endpoints(), bare.TLS, func(ctx context.Context, c *clientv3.Client) error {
		return recoverByHand(ctx, c, bare.Endpoints())
	})
	t.Logf("by hand: writes failed for %s (%d puts before the alarm)", hand.down.Round(time.Millisecond), hand.puts)

	v, b := managed.down.Seconds(), hand.down.Seconds()
	return []Result{{Name: "nospace-recovery", Value: v, Unit: "s", Baseline: b, Ratio: ratio(v, b),
		Note: fmt.Sprintf("from the first write refused for NOSPACE to the next write acknowledged, on a managed 3-member cluster (etcd %s, --quota-backend-bytes=%d) "+
			"filled with history (%d keys overwritten with %d KiB values; %d puts before the alarm): the agents compact to the head, defragment the members one at a time "+
			"(never the leader in place) and disarm the alarm once every database is under 80%% of the quota; writes retried every 20ms; "+
			"baseline: the same fill on 3 bare etcd with the same quota and TLS, recovered by hand the instant the first write failed "+
			"(compact to the head, defragment each member, disarm the alarm; %d puts before the alarm); the acknowledged values read back on both",
			harness.DefaultEtcdVersion, quota, nospaceKeys, nospaceValueBytes>>10, managed.puts, hand.puts)}}
}

type nospaceRun struct {
	down time.Duration
	puts int
}

// runNoSpace overwrites nospaceKeys keys until a write is refused for
// NOSPACE, runs recoverFn (nil: nothing, the agents recover), then retries
// a write until it succeeds, and reads the last acknowledged values back.
func runNoSpace(t *testing.T, endpoints []string, cfg *tls.Config, recoverFn func(context.Context, *clientv3.Client) error) nospaceRun {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), nospaceTimeout)
	defer cancel()
	val := strings.Repeat("x", nospaceValueBytes-8)
	last := map[string]string{}
	var r nospaceRun
	var failedAt time.Time
	var refusedKey, refused string
	for i := 0; ; i++ {
		if ctx.Err() != nil {
			t.Fatalf("no NOSPACE within %s (%d puts)", nospaceTimeout, i)
		}
		key := fmt.Sprintf("/bench/nospace/%02d", i%nospaceKeys)
		v := fmt.Sprintf("%08d%s", i, val)
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := c.Put(pctx, key, v)
		pcancel()
		if err == nil {
			last[key] = v
			r.puts++
			continue
		}
		if !errors.Is(err, rpctypes.ErrNoSpace) && !strings.Contains(err.Error(), "database space exceeded") {
			t.Fatalf("put %d: %v, want success or NOSPACE", i, err)
		}
		failedAt, refusedKey, refused = time.Now(), key, v
		break
	}
	if recoverFn != nil {
		if err := recoverFn(ctx, c); err != nil {
			t.Fatalf("recover by hand: %v", err)
		}
	}
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Put(pctx, "/bench/nospace/after", "v")
		pcancel()
		if err == nil {
			r.down = time.Since(failedAt)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("writes still fail %s after NOSPACE: %v", time.Since(failedAt).Round(time.Second), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A refused write may still have been applied (the client may have
	// tried it on another member first), so a key holds its last
	// acknowledged value or the refused one, never an older one.
	for k, want := range last {
		resp, err := c.Get(ctx, k)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("%s after the recovery: %v, %v", k, resp, err)
		}
		if got := string(resp.Kvs[0].Value); got != want && (k != refusedKey || got != refused) {
			t.Fatalf("%s after the recovery holds write %.8s; want the last acknowledged, %.8s", k, got, want)
		}
	}
	return r
}

// recoverByHand is what a person does about NOSPACE: compact to the
// head, defragment every member, disarm the alarms.
func recoverByHand(ctx context.Context, c *clientv3.Client, endpoints []string) error {
	st, err := c.Status(ctx, endpoints[0])
	if err != nil {
		return err
	}
	if _, err := c.Compact(ctx, st.Header.Revision, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return err
	}
	for _, ep := range endpoints {
		if _, err := c.Defragment(ctx, ep); err != nil {
			return fmt.Errorf("defragment %s: %w", ep, err)
		}
	}
	alarms, err := c.AlarmList(ctx)
	if err != nil {
		return err
	}
	for _, a := range alarms.Alarms {
		if a.Alarm == etcdserverpb.AlarmType_NOSPACE {
			if _, err := c.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: a.MemberID, Alarm: a.Alarm}); err != nil {
				return err
			}
		}
	}
	return nil
}

// fsyncCounts are each member's WAL fsyncs, from etcd's
// etcd_disk_wal_fsync_duration_seconds histogram: all of them, and those
// over 256 ms and over 1 s.
type fsyncCounts [][3]float64

// walFsyncs reads the members' WAL fsync histograms from their /metrics;
// a member that does not answer counts zeros.
func walFsyncs(endpoints []string, cfg *tls.Config) fsyncCounts {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	out := make(fsyncCounts, len(endpoints))
	for i, ep := range endpoints {
		resp, err := hc.Get(strings.TrimSuffix(ep, "/") + "/metrics")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		resp.Body.Close()
		var total, le256, le1024 float64
		for _, line := range strings.Split(string(body), "\n") {
			name, v, ok := strings.Cut(line, " ")
			if !ok || !strings.HasPrefix(name, "etcd_disk_wal_fsync_duration_seconds") {
				continue
			}
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				continue
			}
			switch name {
			case "etcd_disk_wal_fsync_duration_seconds_count":
				total = f
			case `etcd_disk_wal_fsync_duration_seconds_bucket{le="0.256"}`:
				le256 = f
			case `etcd_disk_wal_fsync_duration_seconds_bucket{le="1.024"}`:
				le1024 = f
			}
		}
		out[i] = [3]float64{total, total - le256, total - le1024}
	}
	return out
}

// fsyncSampler adds up the members' WAL fsyncs from its start until it
// is stopped, sampling twice a second: a count that goes down is a
// member's etcd restarted, counting from zero again.
type fsyncSampler struct {
	stop chan struct{}
	done chan fsyncCounts
}

func sampleFsyncs(endpoints []string, cfg *tls.Config) *fsyncSampler {
	s := &fsyncSampler{stop: make(chan struct{}), done: make(chan fsyncCounts, 1)}
	go func() {
		last := walFsyncs(endpoints, cfg)
		sum := make(fsyncCounts, len(endpoints))
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for range 7200 { // an hour at most
			stopped := false
			select {
			case <-s.stop:
				stopped = true
			case <-tick.C:
			}
			now := walFsyncs(endpoints, cfg)
			for i := range now {
				if now[i][0] == 0 {
					continue // not answering: count on from its last sample
				}
				for j := range 3 {
					d := now[i][j] - last[i][j]
					if now[i][0] < last[i][0] {
						d = now[i][j] // restarted
					}
					sum[i][j] += d
				}
				last[i] = now[i]
			}
			if stopped {
				break
			}
		}
		s.done <- sum
	}()
	return s
}

// counts stops the sampler and returns the sums.
func (s *fsyncSampler) counts() fsyncCounts {
	close(s.stop)
	return <-s.done
}

func (c fsyncCounts) String() string {
	var parts []string
	for _, m := range c {
		parts = append(parts, fmt.Sprintf("%.0f (%.0f over 256ms, %.0f over 1s)", m[0], m[1], m[2]))
	}
	return strings.Join(parts, "; ")
}
