package integration

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// compactedTo is the oldest revision etcd still serves: the revision it
// was last compacted to (1 when never).
func compactedTo(t *testing.T, c *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	head, err := c.Get(ctx, "/compaction/none")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	var probeErr error
	i := sort.Search(int(head.Header.Revision), func(i int) bool {
		_, err := c.Get(ctx, "/compaction/none", clientv3.WithRev(int64(i+1)))
		if err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
			probeErr = err
		}
		return err == nil
	})
	if probeErr != nil {
		t.Fatalf("probing the compacted revision: %v", probeErr)
	}
	return int64(i + 1)
}

// The agent compacts by the spec's policy, and never past what capture
// has made durable in the store, until capture has held it back for
// --compaction-capture-wait: then availability wins, it says so, and a
// full backup follows. Capture itself loses nothing (its spool holds
// what the store could not take).
func TestCompactionKeepsBehindCapture(t *testing.T) {
	minio := harness.StartMinIO(t)
	minio.CreateBucket(t, "compaction")
	env := harness.NewEnv(t)
	env.UseStore(minio.StoreURL("compaction", "etcd/main"), minio.Env())
	setEnv(t, minio.Env())
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "--auto-compaction-mode=revision", "--auto-compaction-retention=50", "configure-cluster")
	if out := env.MustCtl("get"); !strings.Contains(out, "compaction: keep 50 revisions\n") {
		t.Fatalf("get does not show the policy:\n%s", out)
	}
	agents := env.StartAgents(1, harness.AgentOptions{Metrics: true, ExtraArgs: []string{"--compaction-interval=1s", "--compaction-capture-wait=10s"}})
	harness.WaitSettled(t, agents, 1, settleTimeout)
	a := agents[0]
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := openStore(t, env.StoreURL)
	writes := func(prefix string, n int) int64 {
		var rev int64
		for i := range n {
			resp, err := c.Put(ctx, fmt.Sprintf("/compaction/%s/%d", prefix, i%20), "v")
			if err != nil {
				t.Fatalf("put: %v", err)
			}
			rev = resp.Header.Revision
		}
		return rev
	}

	// Capture runs (after the cluster's first backup), so that it sees
	// the writes.
	harness.WaitFor(t, time.Minute, "capture to run", func() bool {
		return strings.Contains(scrape(t, a.MetricsURL), "\netcd_manager_capture_running 1\n")
	})
	// The policy, with capture keeping up: the head less 50.
	head := writes("first", 200)
	harness.WaitFor(t, time.Minute, "capture to store the head", func() bool { return harness.CapturedTo(ctx, s) >= head })
	harness.WaitFor(t, time.Minute, fmt.Sprintf("compaction to revision %d", head-50), func() bool { return compactedTo(t, c) == head-50 })
	if m := scrape(t, a.MetricsURL); !strings.Contains(m, fmt.Sprintf("\netcd_manager_compaction_revision %d\n", head-50)) {
		t.Errorf("metrics do not show the compaction to %d:\n%s", head-50, grepLines(m, "etcd_manager_compaction", 20))
	}

	// The store goes away: capture spools, and compaction stops at what
	// the store holds.
	captured := harness.CapturedTo(ctx, s)
	minio.Stop()
	held := time.Now()
	head = writes("second", 200)
	harness.WaitFor(t, 30*time.Second, "compaction to wait for capture", func() bool {
		return strings.Contains(scrape(t, a.MetricsURL), "\netcd_manager_compaction_held_by_capture 1\n")
	})
	for time.Since(held) < 6*time.Second {
		if got := compactedTo(t, c); got > captured+1 {
			t.Fatalf("compacted to %d while capture had stored only up to %d, %s into the outage", got, captured, time.Since(held).Round(time.Millisecond))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := compactedTo(t, c); got != captured+1 {
		t.Errorf("held by capture: compacted to %d, want %d (one past what capture stored)", got, captured+1)
	}

	// Past --compaction-capture-wait, availability wins.
	harness.WaitFor(t, time.Minute, "compaction to go past capture", func() bool { return compactedTo(t, c) == head-50 })
	if took := time.Since(held); took < 10*time.Second {
		t.Errorf("compaction went past capture %s into the outage, before --compaction-capture-wait=10s", took.Round(time.Millisecond))
	}
	if !strings.Contains(a.Log(), "compaction went past continuous capture") {
		t.Errorf("the agent did not say that compaction went past capture:\n%s", grepLines(a.Log(), "compact", 20))
	}
	if m := scrape(t, a.MetricsURL); !strings.Contains(m, "\netcd_manager_compaction_overtook_capture_total 1\n") {
		t.Errorf("metrics do not count the overtake:\n%s", grepLines(m, "etcd_manager_compaction", 20))
	}

	// The store comes back: a full backup follows, and capture, which
	// never stopped, stores everything from its spool.
	overtook := strings.Index(a.Log(), "compaction went past continuous capture")
	minio.Start()
	harness.WaitFor(t, 2*time.Minute, "a full backup after the overtake", func() bool {
		return overtook >= 0 && strings.Contains(a.Log()[overtook:], `msg="backup taken"`)
	})
	harness.WaitFor(t, time.Minute, "capture to store the head", func() bool { return harness.CapturedTo(ctx, s) >= head })
	tls, err := changelog.Timelines(ctx, s)
	if err != nil || len(tls) != 1 {
		t.Fatalf("timelines %v, %v; want one", tls, err)
	}
	runs, err := changelog.Runs(ctx, s, tls[0])
	if err != nil || len(runs) != 1 {
		t.Errorf("runs %+v, %v; want one, with nothing lost", runs, err)
	}
}

// TestCompactionQuotaShare: with the store gone and capture stalled, a
// database whose bytes in use reach --compaction-quota-share of the
// spec's backend quota is compacted at once, long before
// --compaction-capture-wait: availability wins.
func TestCompactionQuotaShare(t *testing.T) {
	minio := harness.StartMinIO(t)
	minio.CreateBucket(t, "quotashare")
	env := harness.NewEnv(t)
	env.UseStore(minio.StoreURL("quotashare", "etcd/main"), minio.Env())
	setEnv(t, minio.Env())
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "--quota-backend-bytes=33554432",
		"--auto-compaction-mode=revision", "--auto-compaction-retention=50", "configure-cluster")
	agents := env.StartAgents(1, harness.AgentOptions{Metrics: true, ExtraArgs: []string{"--compaction-interval=1s",
		"--compaction-capture-wait=30m", "--compaction-quota-share=0.25"}})
	harness.WaitSettled(t, agents, 1, settleTimeout)
	a := agents[0]
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	harness.WaitFor(t, time.Minute, "capture to run", func() bool {
		return strings.Contains(scrape(t, a.MetricsURL), "\netcd_manager_capture_running 1\n")
	})
	s := openStore(t, env.StoreURL)
	first, err := c.Put(ctx, "/quotashare/first", "v")
	if err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, time.Minute, "capture to store the head", func() bool { return harness.CapturedTo(ctx, s) >= first.Header.Revision })
	captured := harness.CapturedTo(ctx, s)

	// The store goes; 100 small writes put the policy's revision past
	// what capture stored, and compaction waits for capture.
	minio.Stop()
	var head int64
	put := func(key, value string) {
		resp, err := c.Put(ctx, key, value)
		if err != nil {
			t.Fatalf("put: %v", err)
		}
		head = resp.Header.Revision
	}
	for i := range 100 {
		put(fmt.Sprintf("/quotashare/small/%d", i%10), "v")
	}
	harness.WaitFor(t, 30*time.Second, "compaction to wait for capture", func() bool {
		return strings.Contains(scrape(t, a.MetricsURL), "\netcd_manager_compaction_held_by_capture 1\n")
	})
	if got := compactedTo(t, c); got > captured+1 {
		t.Fatalf("compacted to %d with capture stalled at %d and the database small", got, captured)
	}
	// History of one key: 10 MiB in use, over a quarter of the 32 MiB
	// quota (and far under a quarter of etcd's default 2 GiB).
	for i := range 20 {
		put("/quotashare/big", spaceValue(i))
	}
	held := time.Now()
	harness.WaitFor(t, time.Minute, fmt.Sprintf("compaction to revision %d", head-50), func() bool { return compactedTo(t, c) == head-50 })
	t.Logf("compacted past capture %s after the database outgrew its share", time.Since(held).Round(time.Millisecond))
	if log := a.Log(); !strings.Contains(log, "compaction went past continuous capture") || !strings.Contains(log, "-byte quota") {
		t.Errorf("the agent did not say that the quota share made compaction go past capture:\n%s", grepLines(log, "compact", 20))
	}
	// Compaction may have gone past capture more than once: when the
	// database outgrew its share, and again to the final head.
	if m := scrape(t, a.MetricsURL); !regexp.MustCompile(`\netcd_manager_compaction_overtook_capture_total [1-9]\d*\n`).MatchString(m) {
		t.Errorf("metrics do not count the overtake:\n%s", grepLines(m, "etcd_manager_compaction", 20))
	}
	if !strings.Contains(a.Log(), "33554432-byte quota") {
		t.Errorf("the overtake did not weigh the spec's quota:\n%s", grepLines(a.Log(), "quota", 20))
	}
}

// TestCompactionPeriodic: a periodic policy compacts to the revision etcd
// had a retention ago, never to one younger.
func TestCompactionPeriodic(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "--auto-compaction-mode=periodic", "--auto-compaction-retention=6s", "configure-cluster")
	if out := env.MustCtl("get"); !strings.Contains(out, "compaction: keep 6s of history\n") {
		t.Fatalf("get does not show the policy:\n%s", out)
	}
	agents := env.StartAgents(1, harness.AgentOptions{ExtraArgs: []string{"--compaction-interval=1s"}})
	harness.WaitSettled(t, agents, 1, settleTimeout)
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var head int64
	var written time.Time // when the last write was sent: etcd had not the head before
	for i := range 50 {
		written = time.Now()
		resp, err := c.Put(ctx, fmt.Sprintf("/periodic/%d", i%5), "v")
		if err != nil {
			t.Fatal(err)
		}
		head = resp.Header.Revision
	}
	// Until the period has passed since the last write, compaction stays
	// below it: the newest revision 6s old is older than head.
	for time.Since(written) < 5*time.Second {
		if got := compactedTo(t, c); got >= head {
			t.Fatalf("compacted to %d, the head, %s after it was written", got, time.Since(written).Round(time.Millisecond))
		}
		time.Sleep(250 * time.Millisecond)
	}
	harness.WaitFor(t, time.Minute, fmt.Sprintf("compaction to the head %d, a period after it was written", head), func() bool {
		return compactedTo(t, c) == head
	})
	if took := time.Since(written); took < 6*time.Second {
		t.Errorf("compacted to the head %s after it was written, within the 6s period", took.Round(time.Millisecond))
	}
}
