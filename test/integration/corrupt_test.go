package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// memberDB is the bbolt file of an agent's etcd.
func memberDB(t *testing.T, a *harness.Agent) string {
	t.Helper()
	dbs, err := filepath.Glob(filepath.Join(a.DataDir, "data", "*", "member", "snap", "db"))
	if err != nil || len(dbs) != 1 {
		t.Fatalf("%s: etcd's database: %v %v", a.Name, dbs, err)
	}
	return dbs[0]
}

// putMarkers writes 50 keys under prefix whose values are marker-<i>,
// and waits for etcd to commit them to its database (every 100ms).
func putMarkers(t *testing.T, ctx context.Context, c *clientv3.Client, prefix, marker string) {
	t.Helper()
	for i := range 50 {
		if _, err := c.Put(ctx, fmt.Sprintf("%s%d", prefix, i), fmt.Sprintf("%s-%d", marker, i)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
}

// TestCorruptMemberRebuilt: bytes flipped inside a stored value of one
// member's database, while it is stopped, are caught by etcd's initial
// corruption check when it starts; its agent keeps etcd stopped and the
// data, and the leader compares it (read from its database) with the
// others': it is the minority, so it is set aside and the member rebuilt
// from its peers: the cluster is whole again, every member's HashKV
// agrees, and the value reads back intact from the rebuilt member.
func TestCorruptMemberRebuilt(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	marker := "corruption-marker-" + strings.Repeat("m", 64)
	putMarkers(t, ctx, c, "/corrupt/", marker)

	victim := agents[2]
	victim.Stop()
	db := memberDB(t, victim)
	data, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	n := bytes.Count(data, []byte(marker))
	if n == 0 {
		t.Fatalf("the marker is not in %s", db)
	}
	data = bytes.ReplaceAll(data, []byte(marker), []byte(strings.Replace(marker, "marker", "MARKER", 1)))
	if err := os.WriteFile(db, data, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("flipped %d stored values in %s", n, db)
	victim.Start()

	victim.WaitLog("etcd found its data differs from a peer's", 1, 2*time.Minute)
	assertRebuilt(t, ctx, c, agents, victim, "/corrupt/7", marker+"-7")
	assertDiscardEvent(t, env, victim, "hash-mismatch")
}

// assertDiscardEvent waits for the victim's event of setting its data
// aside, for reason, in the store's event history.
func assertDiscardEvent(t *testing.T, env *harness.Env, victim *harness.Agent, reason string) {
	t.Helper()
	re := regexp.MustCompile(regexp.QuoteMeta(victim.NodeID()) + `\s+discard-member-data \(` + reason + `\)\s+failed\s+data moved to `)
	harness.WaitFor(t, 30*time.Second, "the event of "+victim.Name+"'s data set aside ("+reason+")", func() bool {
		out, _, err := env.Ctl("events", "--since=1h")
		return err == nil && re.MatchString(out)
	})
}

// TestDamagedDBRebuilt: an agent killed with its etcd (an unclean exit)
// comes back to a database whose page headers are damaged. Its start-up
// check finds the damage before etcd starts; the data goes to the trash,
// and the leader rebuilds the member from its peers.
func TestDamagedDBRebuilt(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := range 300 {
		if _, err := c.Put(ctx, fmt.Sprintf("/damaged/%d", i), strings.Repeat("v", 500)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // etcd commits its backend every 100ms

	victim := agents[1]
	etcdPID := victim.EtcdPID()
	if etcdPID == 0 {
		t.Fatalf("%s: no etcd pid file", victim.Name)
	}
	victim.Kill()
	harness.WaitFor(t, 10*time.Second, "the killed agent's etcd to die with it", func() bool {
		return syscall.Kill(etcdPID, 0) != nil
	})
	db := memberDB(t, victim)
	n := damageLeafPages(t, db)
	t.Logf("damaged the headers of %d leaf pages in %s", n, db)
	victim.Start()

	victim.WaitLog("etcd's database is damaged; not starting etcd on it", 1, 2*time.Minute)
	assertRebuilt(t, ctx, c, agents, victim, "/damaged/7", strings.Repeat("v", 500))
	assertDiscardEvent(t, env, victim, "damaged-db")
}

// TestDivergentMemberRebuilt: stored values flipped in a running
// follower's database make its HashKV differ from the other two's.
//   - The leader's periodic comparison finds it in the minority, has its
//     data set aside, and rebuilds it from its peers (etcd's own periodic
//     check is off, so that the rebuild is the leader's doing).
//   - Or etcd's own periodic check raises its CORRUPT alarm, and the whole
//     cluster refuses requests: the alarm makes the leader compare the
//     hashes at once, rebuild the member, and disarm the alarm.
func TestDivergentMemberRebuilt(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"the leader's periodic comparison", []string{"--hash-check-interval=3s", "--etcd-corrupt-check-interval=0"}},
		{"etcd's CORRUPT alarm", []string{"--hash-check-interval=0", "--etcd-corrupt-check-interval=2s"}},
	} {
		t.Run(tt.name, func(t *testing.T) { testDivergentMemberRebuilt(t, tt.args) })
	}
}

func testDivergentMemberRebuilt(t *testing.T, args []string) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{Metrics: true, ExtraArgs: args})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	periodic := args[0] != "--hash-check-interval=0"
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	marker := "divergence-marker-" + strings.Repeat("d", 64)
	putMarkers(t, ctx, c, "/diverge/", marker)
	if periodic {
		harness.WaitFor(t, time.Minute, "the leader's first comparison of the members' HashKV", func() bool {
			return strings.Contains(allLogs(agents), "the voting members' HashKV agree")
		})
	}

	// Flip the values in place, under the running etcd: bbolt reads them
	// through its memory map of the file.
	victim := follower(t, agents)
	db := memberDB(t, victim)
	data, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(db, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	flipped := 0
	for off := 0; ; {
		i := bytes.Index(data[off:], []byte(marker))
		if i < 0 {
			break
		}
		if _, err := f.WriteAt([]byte("DIVERGENCE"), int64(off+i)); err != nil {
			t.Fatal(err)
		}
		flipped++
		off += i + len(marker)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if flipped == 0 {
		t.Fatalf("the marker is not in %s", db)
	}
	t.Logf("flipped %d stored values in the running %s's %s", flipped, victim.Name, db)

	victim.WaitLog("the leader found this member's data disagrees with its peers'", 1, 2*time.Minute)
	assertRebuilt(t, ctx, c, agents, victim, "/diverge/7", marker+"-7")
	if !periodic {
		harness.WaitFor(t, time.Minute, "the CORRUPT alarm to be disarmed", func() bool {
			return strings.Contains(allLogs(agents), "etcd's CORRUPT alarm disarmed")
		})
		if !strings.Contains(allLogs(agents), "check-hashes (etcd's CORRUPT alarm is raised") {
			t.Error("no agent compared the hashes for the CORRUPT alarm")
		}
	}
	if _, err := c.Put(ctx, "/diverge/after", "x"); err != nil {
		t.Fatalf("a write after the rebuild: %v", err)
	}
	harness.WaitFor(t, 30*time.Second, "status to show the member rebuilt", func() bool {
		out, _, err := env.Ctl("status")
		return err == nil && strings.Contains(out, "last member rebuilt for disagreeing data: "+victim.NodeID())
	})
	discarded := 0
	for _, a := range agents {
		if m := discardedRE.FindStringSubmatch(scrape(t, a.MetricsURL)); m != nil {
			n, _ := strconv.Atoi(m[1])
			discarded += n
		}
	}
	if discarded != 1 {
		t.Errorf("etcd_manager_corrupt_members_discarded_total sums to %d over the agents, want 1", discarded)
	}
	// The victim's own agent counts and records what it set aside.
	if !hasLine(scrape(t, victim.MetricsURL), `etcd_manager_member_data_discarded_total{reason="hash-mismatch"} 1`) {
		t.Errorf("%s's metrics do not count its data set aside for a hash mismatch", victim.Name)
	}
	assertDiscardEvent(t, env, victim, "hash-mismatch")
	alarms, err := c.AlarmList(ctx)
	if err != nil || len(alarms.Alarms) != 0 {
		t.Errorf("alarms after the rebuild: %v, %v", alarms, err)
	}
}

var discardedRE = regexp.MustCompile(`(?m)^etcd_manager_corrupt_members_discarded_total (\d+)`)

// damageLeafPages overwrites the type flags in the header of every bbolt
// leaf page of the file at path, and returns how many it damaged.
func damageLeafPages(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const pageSize = 4096
	n := 0
	for off := 2 * pageSize; off+16 <= len(data); off += pageSize {
		// header: id uint64, flags uint16 (0x02: leaf), count, overflow
		if binary.LittleEndian.Uint16(data[off+8:]) == 0x02 && binary.LittleEndian.Uint64(data[off:]) == uint64(off/pageSize) {
			binary.LittleEndian.PutUint16(data[off+8:], 0x7777)
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no leaf page in %s", path)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return n
}

// assertRebuilt waits for victim's member to be rebuilt from its peers:
// the cluster is whole, its old data is in its trash, every member's
// HashKV agrees, and key reads back as want from the rebuilt member.
func assertRebuilt(t *testing.T, ctx context.Context, c *clientv3.Client, agents []*harness.Agent, victim *harness.Agent, key, want string) {
	t.Helper()
	harness.WaitFor(t, 4*time.Minute, "the member to be rebuilt from its peers", func() bool {
		st := harness.Observe(agents)
		return st.Healthy == 3 && len(st.Voters) == 3 && len(st.ClusterIDs) == 1
	})
	trash, _ := filepath.Glob(filepath.Join(victim.DataDir, "trash", "*"))
	if len(trash) == 0 {
		t.Error("the bad data is not in the trash")
	}
	rev := headRevision(t, ctx, c)
	var hashes []uint32
	for _, a := range agents {
		harness.WaitFor(t, time.Minute, a.Name+"'s HashKV", func() bool {
			hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			h, err := c.HashKV(hctx, a.ClientURL, rev)
			if err != nil {
				return false
			}
			hashes = append(hashes, h.Hash)
			return true
		})
	}
	if hashes[0] != hashes[1] || hashes[1] != hashes[2] {
		t.Fatalf("HashKV at revision %d: %v", rev, hashes)
	}
	vc, err := clientv3.New(clientv3.Config{Endpoints: []string{victim.ClientURL}, TLS: victim.TLS(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	resp, err := vc.Get(ctx, key, clientv3.WithSerializable())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != want {
		t.Fatalf("the rebuilt member reads %v, %v", resp, err)
	}
}

// TestDamagedLeaderIsTheOneRebuilt: a value is rewritten (same length) in
// one member's stopped database, and the cluster starts all at once, so
// that no initial check compares it; that member leads. A settings roll
// then restarts the followers, whose initial checks fail against the
// damaged leader. A failed check says only that two copies differ: the
// leader compares every member's HashKV (the stopped one's read from its
// database), the follower is in the majority and starts again without the
// check, and the leader, the minority, is the one rebuilt. Every member
// then holds the majority's value, as etcd itself answers on each.
func TestDamagedLeaderIsTheOneRebuilt(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{ExtraArgs: []string{"--hash-check-interval=0", "--etcd-corrupt-check-interval=0"}})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	marker := "majority-marker-" + strings.Repeat("m", 64)
	putMarkers(t, ctx, c, "/damaged-leader/", marker)

	for _, a := range agents {
		a.Stop()
	}
	damaged := agents[0]
	db := memberDB(t, damaged)
	data, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(marker, "majority", "MINORITY", 1)
	n := bytes.Count(data, []byte(marker))
	if n == 0 {
		t.Fatalf("the marker is not in %s", db)
	}
	if err := os.WriteFile(db, bytes.ReplaceAll(data, []byte(marker), []byte(bad)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("rewrote %d stored values in %s", n, db)
	// The damaged member first: with no peer serving, its etcd starts
	// without the initial check; the others' checks cannot read its hash
	// before it has quorum, and pass it by.
	damaged.Start()
	harness.WaitFor(t, time.Minute, "the damaged member's etcd to run", func() bool { return damaged.EtcdPID() > 0 })
	time.Sleep(2 * time.Second)
	for _, a := range agents[1:] {
		a.Start()
	}
	// Should the followers' checks fail now already, against the damaged
	// member (they may, as it serves its peers), no leader can judge
	// them: each starts without its check after a while, and the leader
	// compares the data once there is one.
	harness.WaitSettled(t, agents, 3, 3*settleTimeout)
	// The damaged member leads.
	// A member whose etcd restarts meanwhile (a follower whose check
	// failed) does not answer for a moment: the wait asks again.
	leads := func(a *harness.Agent) bool {
		ok, err := a.Leading()
		return err == nil && ok
	}
	harness.WaitFor(t, time.Minute, damaged.Name+" to lead", func() bool {
		if leads(damaged) {
			return true
		}
		st, ok := memberStatus(damaged)
		if !ok {
			return false
		}
		for _, a := range agents {
			if leads(a) {
				mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, _ = a.Client().MoveLeader(mctx, st.Header.MemberId)
				cancel()
			}
		}
		return leads(damaged)
	})
	env.MustCtl("--snapshot-count=5001", "configure-cluster")
	damaged.WaitLog("the leader found this member's data disagrees with its peers'", 1, 5*time.Minute)
	harness.WaitFor(t, 4*time.Minute, "three healthy members", func() bool {
		st := harness.Observe(agents)
		return st.Healthy == 3 && len(st.Voters) == 3 && len(st.ClusterIDs) == 1
	})
	// Each member's own etcd answers with the majority's value.
	for _, a := range agents {
		harness.WaitFor(t, time.Minute, a.Name+" to read the majority's value", func() bool {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			resp, err := a.Client().Get(rctx, "/damaged-leader/7", clientv3.WithSerializable())
			return err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == marker+"-7"
		})
	}
	failed := 0
	for _, a := range agents[1:] {
		if strings.Contains(a.Log(), "the data is moved to the trash") {
			t.Errorf("%s, which held the majority's data, had its data set aside", a.Name)
		}
		if strings.Contains(a.Log(), "etcd found its data differs from a peer's") {
			failed++
		}
	}
	if failed == 0 {
		t.Error("no follower's initial check failed against the damaged member: the test did not reach its case")
	}
	assertDiscardEvent(t, env, damaged, "hash-mismatch")
}
