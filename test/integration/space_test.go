package integration

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// spaceValue is the i-th 512 KiB value fillUntilNoSpace writes.
func spaceValue(i int) string { return fmt.Sprintf("%06d", i) + strings.Repeat("v", 512<<10-6) }

// fillUntilNoSpace puts 512 KiB values, each its own (to one key, or each
// to a key of its own), until etcd refuses a write for lack of space; at
// most 200. It returns the keys of the writes etcd acknowledged: the i-th
// holds spaceValue(i) unless a later one overwrote it.
func fillUntilNoSpace(t *testing.T, c *clientv3.Client, prefix string, distinct bool) (acked []string) {
	t.Helper()
	for i := range 200 {
		key := prefix
		if distinct {
			key = fmt.Sprintf("%s%d", prefix, i)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.Put(ctx, key, spaceValue(i))
		cancel()
		if err != nil && strings.Contains(err.Error(), "database space exceeded") {
			t.Logf("NOSPACE after %d writes of 512 KiB under %s", i, prefix)
			return acked
		}
		if err != nil {
			t.Fatal(err)
		}
		acked = append(acked, key)
	}
	t.Fatalf("200 writes of 512 KiB under %s and no NOSPACE", prefix)
	return nil
}

// writable waits until a small write succeeds.
func writable(t *testing.T, c *clientv3.Client, timeout time.Duration, what string) {
	t.Helper()
	harness.WaitFor(t, timeout, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := c.Put(ctx, "/space/probe", "x")
		return err == nil
	})
}

// TestNoSpace: a cluster that hits its backend quota with history is
// compacted, defragmented and its NOSPACE alarm disarmed by the leader,
// with no one at the keyboard. When live data fills the quota, the leader
// says so and names the setting; raising the quota in the spec rolls it
// out and writes come back.
func TestNoSpace(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "--quota-backend-bytes=16777216", "--auto-defrag=false", "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{Metrics: true})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)

	// History: one key overwritten until the quota is reached.
	history := fillUntilNoSpace(t, c, "/space/history", false)
	writable(t, c, 2*time.Minute, "writes to come back after the NOSPACE alarm")
	logs := allLogs(agents)
	for _, want := range []string{"etcd's NOSPACE alarm is raised: compacted to the head", `msg="member defragmented"`, "NOSPACE alarm disarmed: etcd takes writes again"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the agents' logs lack %q", want)
		}
	}

	// Recovered on its own: counted, and the history key holds what was
	// last acknowledged.
	harness.WaitFor(t, time.Minute, "the leader's metrics to count the recovery", func() bool {
		for _, a := range agents {
			if m := noSpaceRecoveriesRE.FindStringSubmatch(scrape(t, a.MetricsURL)); m != nil && m[1] != "0" {
				return true
			}
		}
		return false
	})
	// etcd applies the write it refuses for NOSPACE, then raises the
	// alarm: a refused write, like any failed one, may have happened.
	if got := get(t, c, "/space/history"); got != spaceValue(len(history)-1) && got != spaceValue(len(history)) {
		t.Errorf("/space/history holds %.6q… after the recovery, want the last value acknowledged, %.6q…, or the refused one after it", got, spaceValue(len(history)-1))
	}

	// Live data: distinct keys until the quota is reached. While
	// compaction and defragmentation still leave room under 80% of the
	// quota, the leader disarms the alarm and writes go on; once live data
	// fills it, the alarm stays, and the leader says why.
	filled := false
	acked := map[string]string{}
	for round := 0; round < 6 && !filled; round++ {
		for i, k := range fillUntilNoSpace(t, c, fmt.Sprintf("/space/live/%d/", round), true) {
			acked[k] = spaceValue(i)
		}
		harness.WaitFor(t, time.Minute, "the leader to disarm the alarm or say live data fills the quota", func() bool {
			if strings.Contains(allLogs(agents), "NOSPACE: live data fills the backend quota") {
				filled = true
				return true
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := c.Put(ctx, "/space/probe", "x")
			return err == nil
		})
	}
	if !filled {
		t.Fatal("six rounds of live data and the leader never said it fills the quota")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, err := c.Put(ctx, "/space/probe", "x")
	cancel()
	if err == nil {
		t.Fatal("a write succeeded while live data filled the quota: the alarm was disarmed and will flap")
	}
	if !strings.Contains(allLogs(agents), "--quota-backend-bytes=N configure-cluster") {
		t.Error("the leader did not name the setting to raise")
	}
	harness.WaitFor(t, 30*time.Second, "status to show the NOSPACE alarm", func() bool {
		out, _, err := env.Ctl("status")
		return err == nil && regexp.MustCompile(`etcd alarms: .*NOSPACE`).MatchString(out)
	})
	env.MustCtl("--quota-backend-bytes=67108864", "configure-cluster")
	writable(t, c, 4*time.Minute, "writes to come back once the raised quota is rolled out")
	waitCmdline(t, agents, []string{"--quota-backend-bytes=67108864"}, nil)
	// Nothing acknowledged was lost through the alarms, the compactions,
	// the defragmentations and the roll.
	for k, want := range acked {
		if got := get(t, c, k); got != want {
			t.Fatalf("%s holds %.6q… (%d bytes), want the value acknowledged, %.6q… (%d keys acknowledged)", k, got, len(got), want, len(acked))
		}
	}
	t.Logf("%d distinct keys acknowledged before the quota filled, all read back", len(acked))
}

var noSpaceRecoveriesRE = regexp.MustCompile(`(?m)^etcd_manager_nospace_recoveries_total (\d+)`)
