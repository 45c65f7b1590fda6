package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// pitrVersions are the etcd versions whose snapshots the segments are
// applied to, each restored with its own tool.
var pitrVersions = []string{"3.4.23", "3.5.35", "3.6.16", "3.7.3"}

// Capture a workload of puts, deletes, transactions and leases (one
// expiring) from a real etcd of every version into a file store, apply
// the segments to its full backup up to chosen revisions, restore each
// with that version's own tool, start it, and compare everything with the
// live etcd's own view at that revision, taken before any compaction.
func TestPITRApplyEveryVersion(t *testing.T) {
	for _, v := range pitrVersions {
		t.Run(v, func(t *testing.T) { testPITRVersion(t, v) })
	}
}

// kvView is a Range of every key at one revision.
type kvView struct {
	rev int64
	kvs []*mvccpb.KeyValue
}

func viewAt(t *testing.T, c *clientv3.Client, rev int64) kvView {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithFromKey()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := c.Get(ctx, "\x00", opts...)
	if err != nil {
		t.Fatalf("range at %d: %v", rev, err)
	}
	if rev == 0 {
		rev = resp.Header.Revision
	}
	return kvView{rev: rev, kvs: resp.Kvs}
}

func (v kvView) diff(o kvView) string {
	if len(v.kvs) != len(o.kvs) {
		return fmt.Sprintf("%d keys, want %d", len(o.kvs), len(v.kvs))
	}
	for i, a := range v.kvs {
		b := o.kvs[i]
		if string(a.Key) != string(b.Key) || string(a.Value) != string(b.Value) || a.CreateRevision != b.CreateRevision ||
			a.ModRevision != b.ModRevision || a.Version != b.Version || a.Lease != b.Lease {
			return fmt.Sprintf("key %q: got %v, want %v", a.Key, b, a)
		}
	}
	return ""
}

// pitrWorkload writes n rounds of puts, deletes, multi-key transactions
// and leased keys, and returns the leases it granted.
func pitrWorkload(t *testing.T, c *clientv3.Client, rng *rand.Rand, round string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range n {
		k := fmt.Sprintf("/pitr/%s/%d", round, rng.IntN(20))
		var err error
		switch i % 5 {
		case 0, 1:
			_, err = c.Put(ctx, k, fmt.Sprintf("v%d-%d", i, rng.Int()))
		case 2:
			_, err = c.Delete(ctx, k)
		case 3:
			_, err = c.Txn(ctx).Then(
				clientv3.OpPut(k+"/a", "txn"), clientv3.OpPut(k+"/b", "txn"), clientv3.OpDelete(k),
			).Commit()
		case 4:
			var l *clientv3.LeaseGrantResponse
			if l, err = c.Grant(ctx, 600); err == nil {
				_, err = c.Put(ctx, k+"/leased", "x", clientv3.WithLease(l.ID))
			}
		}
		if err != nil {
			t.Fatalf("workload: %v", err)
		}
	}
}

func testPITRVersion(t *testing.T, version string) {
	env := harness.NewEnv(t)
	etcd := filepath.Join(env.BinDir, "etcd-v"+version, "etcd")
	live := env.NewBareCluster(1, false)
	live.Start(etcd)
	c, err := clientv3.New(clientv3.Config{Endpoints: live.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitEtcd(t, c)
	rng := rand.New(rand.NewPCG(1, uint64(len(version))))
	pitrWorkload(t, c, rng, "before", 50)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := filepath.Join(env.Root, "store")
	s := openStore(t, harness.FileURL(dir))
	info, err := backup.Take(ctx, s, backup.Request{
		Client: clientv3.Config{DialTimeout: 5 * time.Second, Logger: zap.NewNop()}, Endpoint: live.Endpoints()[0],
		TempDir: filepath.Join(env.Root, "tmp"), ClusterToken: "tl1", Now: time.Now(),
	})
	if err != nil {
		t.Fatal(err)
	}

	// A digest at most every 300ms: restores check their result against
	// one read from etcd, before and after a compaction.
	cfg := changelog.Default()
	cfg.DigestInterval = 300 * time.Millisecond
	capture, err := changelog.New(cfg, filepath.Join(env.Root, "spool"), s, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	capCtx, stopCapture := context.WithCancel(ctx)
	defer stopCapture()
	runErr := make(chan error, 1)
	go func() {
		runErr <- capture.Run(capCtx, changelog.Etcd(c), "tl1", &changelog.Base{Backup: info.Name, Revision: info.Meta.Revision})
	}()
	go capture.Upload(capCtx)

	// A key under a lease that expires mid-capture, and one under a lease
	// revoked by hand: neither is back at the end; both are at a point
	// before.
	short, err := c.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/pitr/expiring", "soon gone", clientv3.WithLease(short.ID)); err != nil {
		t.Fatal(err)
	}
	revoked, err := c.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/pitr/revoked", "gone", clientv3.WithLease(revoked.ID)); err != nil {
		t.Fatal(err)
	}
	withLeases := viewAt(t, c, 0)
	pitrWorkload(t, c, rng, "during", 100)
	if _, err := c.Revoke(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, "the short lease to expire", func() bool {
		r, err := c.Get(ctx, "/pitr/expiring")
		return err == nil && len(r.Kvs) == 0
	})
	pitrWorkload(t, c, rng, "after", 100)
	head := viewAt(t, c, 0)

	// Views at chosen revisions, before anything compacts.
	targets := []int64{info.Meta.Revision, withLeases.rev, head.rev}
	for range 3 {
		targets = append(targets, info.Meta.Revision+1+rng.Int64N(head.rev-info.Meta.Revision))
	}
	views := map[int64]kvView{}
	for _, r := range targets {
		views[r] = viewAt(t, c, r)
	}
	// Then a compaction in the middle of the captured history, as
	// kube-apiserver does every 5 minutes, and more writes: the digests
	// after it are of a compacted etcd.
	harness.WaitFor(t, 30*time.Second, "capture to pass the views", func() bool { return capture.Status().Durable >= head.rev })
	if _, err := c.Compact(ctx, withLeases.rev); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // a digest after the compaction
	pitrWorkload(t, c, rng, "compacted", 50)
	time.Sleep(time.Second)
	if _, err := c.Put(ctx, "/pitr/last", "x"); err != nil {
		t.Fatal(err)
	}
	final := viewAt(t, c, 0)
	targets = append(targets, final.rev)
	views[final.rev] = final
	harness.WaitFor(t, 30*time.Second, "capture to reach the head", func() bool {
		select {
		case err := <-runErr:
			t.Fatalf("capture ended with %v, at revision %d of %d", err, capture.Status().Durable, final.rev)
		default:
		}
		return capture.Status().Durable >= final.rev
	})
	stopCapture()
	if err := <-runErr; err != context.Canceled {
		t.Fatalf("capture ended with %v", err)
	}

	for i, target := range targets {
		var got kvView
		var applied changelog.Applied
		got, applied = restoreOffline(t, env, s, info.Name, "tl1", target, version, fmt.Sprintf("restore%d", i), func(rc *clientv3.Client, got kvView) {
			checkLeases(t, rc, got)
			if target == withLeases.rev {
				for _, k := range []string{"/pitr/expiring", "/pitr/revoked"} {
					if n := count(t, rc, k); n != 1 {
						t.Errorf("restored to %d: %s is missing, though its lease was live then", target, k)
					}
				}
			}
			if target == head.rev {
				for _, k := range []string{"/pitr/expiring", "/pitr/revoked"} {
					if n := count(t, rc, k); n != 0 {
						t.Errorf("restored to the head: %s is back, though its lease was gone", k)
					}
				}
			}
		})
		if target == final.rev && applied.Digest <= withLeases.rev {
			t.Errorf("apply to %d checked no digest taken after the compaction at %d (the newest checked: %d)", target, withLeases.rev, applied.Digest)
		}
		if d := views[target].diff(got); d != "" {
			t.Errorf("restored to %d (%d revisions from %d segments): %s", target, applied.Revisions, applied.Segments, d)
		}
		t.Logf("etcd %s: restored revision %d (from backup at %d: %d revisions, %d segments, %d leases; digest at %d matched)",
			version, target, info.Meta.Revision, applied.Revisions, applied.Segments, applied.Leases, applied.Digest)
	}
}

// restoreOffline brings backup name forward to revision target of
// timeline with the store's segments, restores the result with etcd
// version's own tool into a fresh single member, and returns what that
// member holds and what the apply did; check, if set, looks at the
// member before it stops.
func restoreOffline(t *testing.T, env *harness.Env, s *store.Store, name, timeline string, target int64, version, work string, check func(*clientv3.Client, kvView)) (kvView, changelog.Applied) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := spec.ParseSupportedVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	bins, err := etcdproc.FindBinaries(env.BinDir, v)
	if err != nil {
		t.Fatal(err)
	}
	work = filepath.Join(env.Root, work)
	path, _, err := backup.Fetch(ctx, s, name, work, backup.FetchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	applied, err := changelog.Apply(ctx, s, path, timeline, target, changelog.ApplyOptions{})
	if err != nil {
		t.Fatalf("apply to %d: %v", target, err)
	}
	if applied.To != target {
		t.Fatalf("apply to %d reached %d", target, applied.To)
	}
	// A restore's dry run names, from the headers alone, the segments
	// this apply read.
	if hs, err := changelog.Covering(ctx, s, timeline, changelog.SnapshotRevision(applied.From), target); err != nil || len(hs) != applied.Segments {
		t.Errorf("Covering(%d, %d) = %d segments, %v; the apply read %d", applied.From, target, len(hs), err, applied.Segments)
	}
	ip := harness.AllocIP(t)
	data := filepath.Join(work, "data")
	if err := bins.RestoreSnapshot(ctx, etcdproc.RestoreOptions{SnapshotPath: path, DataDir: data, Name: "restored",
		PeerURLs: []string{"http://" + ip + ":2380"}, InitialCluster: "restored=http://" + ip + ":2380", Token: "restored"}); err != nil {
		t.Fatalf("restore to %d with etcd %s's tool: %v", target, version, err)
	}
	m := env.NewBareOnData(data, "restored", ip)
	m.Start(filepath.Join(env.BinDir, "etcd-v"+version, "etcd"))
	defer m.Stop()
	rc, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	waitEtcd(t, rc)
	got := viewAt(t, rc, 0)
	if got.rev != target {
		t.Errorf("restored to %d: the restored etcd is at revision %d", target, got.rev)
	}
	if check != nil {
		check(rc, got)
	}
	return got, applied
}

// checkLeases checks that every key's lease exists in the restored etcd,
// with time left.
func checkLeases(t *testing.T, c *clientv3.Client, v kvView) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, kv := range v.kvs {
		if kv.Lease == 0 {
			continue
		}
		ttl, err := c.TimeToLive(ctx, clientv3.LeaseID(kv.Lease), clientv3.WithAttachedKeys())
		if err != nil || ttl.TTL <= 0 {
			t.Errorf("key %q: its lease %x is not live after the restore (%v, ttl %v)", kv.Key, kv.Lease, err, ttl)
			continue
		}
		found := false
		for _, k := range ttl.Keys {
			found = found || string(k) == string(kv.Key)
		}
		if !found {
			t.Errorf("key %q is not attached to its lease %x after the restore", kv.Key, kv.Lease)
		}
	}
}

func waitEtcd(t *testing.T, c *clientv3.Client) {
	t.Helper()
	harness.WaitFor(t, 30*time.Second, "etcd to serve", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Get(ctx, "/ready")
		return err == nil
	})
}

// The whole path through the agents: capture starts on its own (taking
// the full backup it needs), a writer with puts, deletes, transactions and
// leases runs, every node is killed and wiped, and restore-backup --latest
// brings back everything acknowledged, as the live cluster saw it. Then a
// restore to an earlier revision, on the old timeline and with etcd's
// --bump-revision, brings back that revision's exact content.
func TestPointInTimeRestore(t *testing.T) {
	// Merges every second, into 1s and 4s windows: the restores below read
	// merged segments, and segments deleted under a restore's listing.
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{ExtraArgs: []string{
		"--capture-merge-interval=1s", "--capture-merge-windows=1s,4s", "--capture-digest-interval=1s"}})
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := openStore(t, env.StoreURL)

	// A full backup before the writes: every point after it is reachable.
	first, err := backup.ReadMeta(ctx, s, strings.TrimSpace(env.MustCtl("backup-now")))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	lease, err := c.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/pitr/leased", "kept with its lease", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	pitrWorkload(t, c, rng, "first", 150)
	mid := viewAt(t, c, 0)
	pitrWorkload(t, c, rng, "second", 150)
	head := viewAt(t, c, 0)
	earlier := first.Revision + 1 + rng.Int64N(mid.rev-first.Revision)
	atEarlier := viewAt(t, c, earlier)

	// Capture started on its own, after the full backup it took of this
	// cluster, and follows the writes.
	acked := time.Now()
	var timeline string
	harness.WaitFor(t, time.Minute, "capture to make the head durable in the store", func() bool {
		tls, err := changelog.Timelines(ctx, s)
		if err != nil || len(tls) != 1 {
			return false
		}
		timeline = tls[0]
		runs, err := changelog.Runs(ctx, s, timeline)
		return err == nil && len(runs) > 0 && runs[len(runs)-1].Last >= head.rev
	})
	t.Logf("the head (revision %d) was durable in the store when checked, %s after its write and the views were read", head.rev, time.Since(acked).Round(10*time.Millisecond))
	// The segments of the writes get merged (per 1s window, then per 4s
	// where a 4s window holds several), and the merged ones replace them:
	// the restores below read merged segments. Writes that all land in
	// one 1s window make a single level-1 segment, which no level-2
	// merge follows (a fast run), so the wait is for any merged level;
	// internal/changelog's tests check the levels themselves.
	levels := map[int]int{}
	harness.WaitFor(t, time.Minute, "the writes' segments to be merged", func() bool {
		refs, err := changelog.List(ctx, s, timeline)
		if err != nil {
			return false
		}
		clear(levels)
		merged, level0 := 0, 0
		for _, r := range refs {
			levels[r.Level]++
			switch {
			case r.Level >= 1:
				merged++
			case r.First <= head.rev:
				level0++
			}
		}
		return merged > 0 && level0 <= 2
	})
	t.Logf("segments by level once merged: %v", levels)

	for _, a := range agents {
		a.Kill()
	}
	for _, a := range agents {
		if err := os.RemoveAll(a.DataDir); err != nil {
			t.Fatal(err)
		}
		a.Start()
	}
	harness.WaitFor(t, time.Minute, "the leader to refuse an empty cluster", func() bool {
		return strings.Contains(allLogs(agents), "must issue restore-backup command to proceed")
	})

	// The dry run names the point and the segments, and queues nothing.
	out, errOut, err := env.Ctl("restore-backup", "--latest", "--dry-run", "-o", "json")
	if err != nil {
		t.Fatalf("restore-backup --latest --dry-run: %v\n%s", err, errOut)
	}
	var dry struct {
		Revision int64
		Segments []struct{ First, Last int64 }
	}
	if err := json.Unmarshal([]byte(out), &dry); err != nil || dry.Revision != head.rev || len(dry.Segments) == 0 ||
		dry.Segments[0].First > changelog.SnapshotRevision(first.Revision)+1 || dry.Segments[len(dry.Segments)-1].Last < head.rev {
		t.Errorf("restore-backup --latest --dry-run = %s (%v): want revision %d, reached by segments from revision %d", out, err, head.rev, changelog.SnapshotRevision(first.Revision)+1)
	}
	if cmds := env.MustCtl("list-commands"); strings.Contains(cmds, "restore-backup") {
		t.Errorf("a dry run queued a restore:\n%s", cmds)
	}

	out, errOut, err = env.Ctl("restore-backup", "--latest", "--timeout=3m")
	if err != nil {
		t.Fatalf("restore-backup --latest: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	if !strings.Contains(errOut, fmt.Sprintf("restoring timeline %s at revision %d", timeline, head.rev)) {
		t.Errorf("restore-backup --latest did not say what it restores:\n%s", errOut)
	}
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c2 := clusterClient(t, agents)
	got := viewAt(t, c2, 0)
	if got.rev != head.rev {
		t.Errorf("restored --latest to revision %d, want %d", got.rev, head.rev)
	}
	if d := head.diff(got); d != "" {
		t.Errorf("restored --latest: %s", d)
	}
	checkLeases(t, c2, got)

	// An earlier point, with the revision bumped as Kubernetes needs. The
	// restore made a new timeline that starts at the head of the old
	// one: the target resolves back through it, with no --timeline.
	out, errOut, err = env.Ctl("restore-backup", fmt.Sprintf("--to-revision=%d", earlier),
		"--bump-revision=1000", "--mark-compacted", "--timeout=3m")
	if err != nil {
		t.Fatalf("restore-backup --to-revision: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c3 := clusterClient(t, agents)
	got = viewAt(t, c3, 0)
	if got.rev != earlier+1000 {
		t.Errorf("restored to %d with a bump of 1000: at revision %d", earlier, got.rev)
	}
	if d := atEarlier.diff(got); d != "" {
		t.Errorf("restored to %d: %s", earlier, d)
	}
	if !strings.Contains(errOut, fmt.Sprintf("restoring timeline %s at revision %d", timeline, earlier)) {
		t.Errorf("restore-backup --to-revision=%d did not resolve on the original timeline %s:\n%s", earlier, timeline, errOut)
	}

	// The history: three timelines, each newer one branched from the one
	// before.
	rangesOut := env.MustCtl("list-backups", "--ranges")
	if n := strings.Count(rangesOut, "branched from timeline "+timeline); n != 2 {
		t.Errorf("list-backups --ranges shows %d timelines branched from %s, want 2 (one at revision %d, one at %d):\n%s", n, timeline, head.rev, earlier, rangesOut)
	}
	if !strings.Contains(rangesOut, fmt.Sprintf("at its revision %d", earlier)) || !strings.Contains(rangesOut, fmt.Sprintf("bumped by 1000 to start at %d", earlier+1000)) {
		t.Errorf("list-backups --ranges does not show the branch at %d with its bump:\n%s", earlier, rangesOut)
	}
	// The bumped timeline goes on: its capture, with digests, brings a
	// later --latest back, though its backups carry the bump's mark.
	for i := range 20 {
		put(t, c3, fmt.Sprintf("/pitr/after-bump/%d", i), "v")
	}
	time.Sleep(2 * time.Second) // a digest of the bumped timeline
	put(t, c3, "/pitr/after-bump/last", "v")
	bumped := viewAt(t, c3, 0)
	harness.WaitFor(t, time.Minute, "capture of the bumped timeline", func() bool { return harness.CapturedTo(ctx, s) >= bumped.rev })
	// From the bumped timeline's first backup, so that the digests taken
	// since lie between it and the target, whatever backups came later.
	infos, err := backup.List(ctx, s)
	if err != nil || len(infos) == 0 {
		t.Fatalf("backups: %v", err)
	}
	bumpedTL := infos[len(infos)-1].Meta.ClusterToken
	firstOfBumped := ""
	for _, in := range infos {
		if in.Meta.ClusterToken == bumpedTL {
			firstOfBumped = in.Name
			break
		}
	}
	out, errOut, err = env.Ctl("restore-backup", firstOfBumped, "--latest", "--timeout=3m")
	if err != nil {
		t.Fatalf("restore-backup %s --latest on the bumped timeline: %v\nstdout: %s\nstderr: %s", firstOfBumped, err, out, errOut)
	}
	harness.WaitSettled(t, agents, 3, settleTimeout)
	if got := viewAt(t, clusterClient(t, agents), 0); got.rev != bumped.rev || bumped.diff(got) != "" {
		t.Errorf("restored --latest of the bumped timeline to %d: %s", got.rev, bumped.diff(got))
	}
	re := regexp.MustCompile(fmt.Sprintf(`to-revision=%d .*digest-checked-at=(\d+)`, bumped.rev))
	if m := re.FindStringSubmatch(allLogs(agents)); m == nil || m[1] == "0" {
		t.Errorf("the restore of the bumped timeline to %d checked no digest: %v", bumped.rev, m)
	}

	// The revisions the bump skipped exist on no timeline.
	if _, errOut, err := env.Ctl("restore-backup", fmt.Sprintf("--to-revision=%d", earlier+500)); err == nil || !strings.Contains(errOut, "do not exist") {
		t.Errorf("restore-backup to a revision the bump skipped: %v\n%s", err, errOut)
	}

	// What cannot be reached is refused before anything is queued.
	for _, tc := range []struct{ args []string }{
		{[]string{fmt.Sprintf("--to-revision=%d", head.rev+1_000_000), "--timeline=" + timeline}},
		{[]string{"--to-revision=-5", "--timeline=" + timeline}},
		{[]string{"--to-time=2001-01-01T00:00:00Z", "--timeline=" + timeline}},
		{[]string{"--latest", "--to-revision=5"}},
		{[]string{"--latest", "--timeline=../../x"}},
	} {
		if out, errOut, err := env.Ctl(append([]string{"restore-backup"}, tc.args...)...); err == nil {
			t.Errorf("restore-backup %v was accepted: %s %s", tc.args, out, errOut)
		}
	}
	if cmds := env.MustCtl("list-commands"); strings.Contains(cmds, "restore-backup") {
		t.Errorf("a refused restore left a command:\n%s", cmds)
	}
}

// A point that no digest checks is restored only when the user accepts
// that: with --require-digest it is refused before anything stops, and
// without, the restore says it is unverified. The result is checked
// against etcd's own history at the target either way.
func TestRestoreRequireDigest(t *testing.T) {
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{ExtraArgs: []string{"--capture-digest-interval=0"}})
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := openStore(t, env.StoreURL)
	env.MustCtl("backup-now")
	pitrWorkload(t, c, rand.New(rand.NewPCG(3, 3)), "unverified", 60)
	target := viewAt(t, c, 0)
	harness.WaitFor(t, time.Minute, "capture to make the target durable in the store", func() bool {
		tls, err := changelog.Timelines(ctx, s)
		if err != nil || len(tls) != 1 {
			return false
		}
		runs, err := changelog.Runs(ctx, s, tls[0])
		return err == nil && len(runs) > 0 && runs[len(runs)-1].Last >= target.rev
	})
	put(t, c, "/digest/after-target", "still here if nothing was touched")

	out, errOut, err := env.Ctl("restore-backup", fmt.Sprintf("--to-revision=%d", target.rev), "--require-digest", "--timeout=3m")
	if err == nil {
		t.Fatalf("restore-backup --require-digest of a point no digest checks succeeded:\n%s\n%s", out, errOut)
	}
	if msg := err.Error() + errOut; !strings.Contains(msg, "unverified") || !strings.Contains(msg, "the cluster was not touched") {
		t.Errorf("the refusal does not say why, or what it left: %v\n%s", err, errOut)
	}
	if got := get(t, c, "/digest/after-target"); got != "still here if nothing was touched" {
		t.Fatalf("the refused restore touched the cluster: /digest/after-target = %q", got)
	}

	out, errOut, err = env.Ctl("restore-backup", fmt.Sprintf("--to-revision=%d", target.rev), "--timeout=3m")
	if err != nil {
		t.Fatalf("restore-backup --to-revision: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	if !strings.Contains(out, "unverified") || !strings.Contains(errOut, "capture recorded no digest") {
		t.Errorf("the restore does not say it is unverified:\nstdout: %s\nstderr: %s", out, errOut)
	}
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c2 := clusterClient(t, agents)
	if d := target.diff(viewAt(t, c2, 0)); d != "" {
		t.Errorf("restored to %d: %s", target.rev, d)
	}
}

// --to-time maps a moment to the last revision etcd committed by then,
// and no later: a backup's whole-second timestamp, taken before its
// snapshot, never raises it; and a moment after a restored timeline began
// but before its oldest backup kept is refused, not answered with the
// state the restore started from. The oracle is etcd's own revisions,
// from the writes' responses.
func TestToTimeIsExact(t *testing.T) {
	w := newBareWorld(t)
	env, c, ctx, s := w.env, w.c, w.ctx, w.s
	take := func(token string, now time.Time) backup.Info { return w.backup(t, token, now) }
	put := func(k string) int64 { return w.put(t, k) }
	rfc := func(at time.Time) string { return at.UTC().Format(time.RFC3339Nano) }
	put("/exact/before-base")
	base := take("tl1", time.Now())
	capture, err := changelog.New(changelog.Default(), filepath.Join(env.Root, "spool"), s, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	capCtx, stopCapture := context.WithCancel(ctx)
	defer stopCapture()
	go func() {
		_ = capture.Run(capCtx, changelog.Etcd(c), "tl1", &changelog.Base{Backup: base.Name, Revision: base.Meta.Revision})
	}()
	go capture.Upload(capCtx)

	revA := put("/exact/a")
	time.Sleep(200 * time.Millisecond)
	at := time.Now()
	time.Sleep(200 * time.Millisecond)
	revB := put("/exact/b")
	// A backup stamped with the whole second before at, whose snapshot
	// holds /exact/b, written after at.
	late := take("tl1", at.Truncate(time.Second))
	if late.Meta.Revision < revB {
		t.Fatalf("the backup is at revision %d, before /exact/b (%d)", late.Meta.Revision, revB)
	}
	harness.WaitFor(t, time.Minute, "capture to make /exact/b durable", func() bool { return harness.CapturedTo(ctx, s) >= revB })

	queued := func(args ...string) string {
		t.Helper()
		out, errOut, err := env.Ctl(append([]string{"restore-backup", "--wait=false"}, args...)...)
		if err != nil {
			t.Fatalf("restore-backup %v: %v\n%s", args, err, errOut)
		}
		env.MustCtl("delete-command", strings.TrimSpace(out))
		return errOut
	}
	want := fmt.Sprintf("restoring timeline tl1 at revision %d:", revA)
	if got := queued("--to-time="+rfc(at), "--timeline=tl1"); !strings.Contains(got, want) {
		t.Errorf("--to-time between /exact/a (revision %d) and /exact/b (%d) resolved to:\n%s\nwant %q", revA, revB, got, want)
	}

	// A restored timeline tl2 began after /exact/b; retention has
	// removed its early backups, so its oldest kept is a while later.
	time.Sleep(200 * time.Millisecond)
	began := time.Now()
	if err := changelog.WriteBranch(ctx, s, changelog.Branch{Timeline: "tl2", Parent: "tl1", Revision: revB, Backup: late.Name, Time: began.UTC()}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	keptAt := time.Now()
	take("tl2", keptAt)
	mid := began.Add(keptAt.Sub(began) / 2)
	_, errOut, err := env.Ctl("restore-backup", "--wait=false", "--to-time="+rfc(mid), "--timeline=tl2")
	if err == nil || !strings.Contains(errOut, "before the oldest backup kept of timeline tl2") || !strings.Contains(errOut, "the timeline began at") {
		t.Errorf("--to-time after tl2 began, before its oldest backup kept: %v\n%s\nwant a refusal", err, errOut)
	}
	// Before tl2 began, the time is the parent's.
	if got := queued("--to-time="+rfc(at), "--timeline=tl2"); !strings.Contains(got, want) {
		t.Errorf("--to-time before tl2 began resolved to:\n%s\nwant %q", got, want)
	}
	if cmds := env.MustCtl("list-commands"); strings.Contains(cmds, "restore-backup") {
		t.Errorf("a refused or deleted restore left a command:\n%s", cmds)
	}
}

// A run of captured changes whose base backup retention removed is
// reachable only from a kept backup inside it: list-backups --ranges,
// and the restore, say so alike. The revisions come from etcd's own
// responses, and the gap is made as in production: capture stopped, etcd
// compacted past it, capture started a new run after a fresh backup.
func TestRangesFromKeptBackups(t *testing.T) {
	w := newBareWorld(t)
	env, c, ctx, s := w.env, w.c, w.ctx, w.s
	take := func() backup.Info { return w.backup(t, "tl1", time.Now()) }
	writes := func(prefix string, n int) int64 {
		t.Helper()
		var rev int64
		for i := range n {
			r, err := c.Put(ctx, fmt.Sprintf("%s/%d", prefix, i), "v")
			if err != nil {
				t.Fatal(err)
			}
			rev = r.Header.Revision
		}
		return rev
	}
	capture, err := changelog.New(changelog.Default(), filepath.Join(env.Root, "spool"), s, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	go capture.Upload(ctx)
	runFrom := func(b backup.Info) (stop func()) {
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = capture.Run(rctx, changelog.Etcd(c), "tl1", &changelog.Base{Backup: b.Name, Revision: b.Meta.Revision})
		}()
		return func() { rcancel(); <-done }
	}

	writes("/ranges/before", 5)
	stop := runFrom(take())
	first := writes("/ranges/run1", 10)
	harness.WaitFor(t, time.Minute, "capture of the first run", func() bool { return harness.CapturedTo(ctx, s) >= first })
	stop()
	// Uncaptured, and compacted away: capture must start a new run.
	time.Sleep(100 * time.Millisecond)
	inGap := time.Now()
	lost := writes("/ranges/uncaptured", 10)
	if _, err := c.Compact(ctx, lost); err != nil {
		t.Fatal(err)
	}
	base2 := take()
	stop = runFrom(base2)
	mid := writes("/ranges/run2-early", 10) - 5 // between the removed base and the kept backup
	kept := take()
	end := writes("/ranges/run2-late", 10)
	harness.WaitFor(t, time.Minute, "capture of the second run", func() bool { return harness.CapturedTo(ctx, s) >= end })
	stop()
	// Retention removes the second run's base.
	if err := backup.Remove(ctx, s, base2.Name); err != nil {
		t.Fatal(err)
	}

	var rs []timelineRangeJSON
	out := env.MustCtl("list-backups", "--ranges", "-o", "json")
	if err := json.Unmarshal([]byte(out), &rs); err != nil || len(rs) != 1 {
		t.Fatalf("list-backups --ranges -o json: %v\n%s", err, out)
	}
	unreachable := false
	for _, g := range rs[0].Gaps {
		unreachable = unreachable || (g.After < mid && mid < g.Before)
	}
	if !unreachable {
		t.Errorf("--ranges shows revision %d, between the removed base %s (%d) and the kept backup %s (%d), as restorable:\n%s",
			mid, base2.Name, base2.Meta.Revision, kept.Name, kept.Meta.Revision, out)
	}
	if rs[0].LatestRevision != end {
		t.Errorf("--ranges: latest revision %d, want %d", rs[0].LatestRevision, end)
	}
	if _, errOut, err := env.Ctl("restore-backup", "--wait=false", "--timeline=tl1", fmt.Sprintf("--to-revision=%d", mid)); err == nil {
		t.Errorf("a restore to revision %d, which no kept backup reaches, was queued", mid)
	} else if !strings.Contains(errOut, "not captured") {
		t.Errorf("the refusal does not say why:\n%s", errOut)
	}
	// A moment while capture was not following has no known state.
	if _, errOut, err := env.Ctl("restore-backup", "--wait=false", "--timeline=tl1", "--to-time="+inGap.UTC().Format(time.RFC3339Nano)); err == nil || !strings.Contains(errOut, "falls in a gap of capture") {
		t.Errorf("--to-time inside the gap: %v\n%s\nwant a refusal", err, errOut)
	}
	out, errOut, err := env.Ctl("restore-backup", "--wait=false", "--timeline=tl1", fmt.Sprintf("--to-revision=%d", end))
	if err != nil || !strings.Contains(errOut, fmt.Sprintf("at revision %d: backup %s", end, kept.Name)) {
		t.Errorf("a restore to revision %d from the kept backup %s: %v\n%s", end, kept.Name, err, errOut)
	}
	if err == nil {
		env.MustCtl("delete-command", strings.TrimSpace(out))
	}
}

// timelineRangeJSON is what list-backups --ranges -o json prints of a
// timeline, as far as the tests read it.
type timelineRangeJSON struct {
	LatestRevision int64 `json:"latestRevision"`
	Gaps           []struct {
		After  int64 `json:"After"`
		Before int64 `json:"Before"`
	} `json:"gaps"`
}

// outageStore refuses uploads while down: segments stay in the spool.
type outageStore struct {
	changelog.Store
	down atomic.Bool
}

func (o *outageStore) CreateFrom(ctx context.Context, key string, r io.Reader) error {
	if o.down.Load() {
		return errors.New("store unreachable (test)")
	}
	return o.Store.CreateFrom(ctx, key, r)
}

// A spooled segment damaged on disk during a store outage ends its run:
// it is set aside, the segments after it are never uploaded, capture
// starts again from the last revision the store holds whole and reads
// the lost revisions from etcd again. The store then holds the whole
// history with no hole, which a restore applies and checks against the
// digests capture read from etcd itself.
func TestDamagedSpoolSegmentEndsTheRun(t *testing.T) {
	w := newBareWorld(t)
	env, c, ctx, s := w.env, w.c, w.ctx, w.s
	rng := rand.New(rand.NewPCG(11, 11))
	pitrWorkload(t, c, rng, "before", 20)
	base := w.backup(t, "tl1", time.Now())
	spool := filepath.Join(env.Root, "spool")
	st := &outageStore{Store: s}
	cfg := changelog.Default()
	cfg.DigestInterval = 300 * time.Millisecond
	capture, err := changelog.New(cfg, spool, st, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	go capture.Upload(ctx)
	runs := make(chan error, 4)
	run := func() {
		go func() {
			runs <- capture.Run(ctx, changelog.Etcd(c), "tl1", &changelog.Base{Backup: base.Name, Revision: base.Meta.Revision})
		}()
	}
	run()
	pitrWorkload(t, c, rng, "first", 30)
	head := viewAt(t, c, 0).rev
	harness.WaitFor(t, time.Minute, "capture of the first writes", func() bool { return harness.CapturedTo(ctx, s) >= head })

	// The store goes away; writes pile up in the spool, a segment per cut.
	st.down.Store(true)
	var spooled []string
	for i := 0; i < 40 && len(spooled) < 3; i++ {
		pitrWorkload(t, c, rng, fmt.Sprintf("outage-%d", i), 5)
		head = viewAt(t, c, 0).rev
		time.Sleep(300 * time.Millisecond)
		spooled, _ = filepath.Glob(filepath.Join(spool, "tl1-*.seg"))
	}
	if len(spooled) < 3 {
		t.Fatalf("%d segments spooled during the outage, want 3 or more", len(spooled))
	}
	slices.Sort(spooled)
	if err := os.WriteFile(spooled[1], []byte("damaged on disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	st.down.Store(false)

	// The run ends; capture starts again, as the agent does.
	select {
	case err := <-runs:
		if !errors.Is(err, changelog.ErrRunEnded) {
			t.Fatalf("capture ended with %v, want ErrRunEnded", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("capture did not end its run after a spooled segment was set aside")
	}
	if n := capture.Status().SetAside; n != 1 {
		t.Errorf("%d segments counted set aside, want 1", n)
	}
	if _, err := os.Stat(spooled[1] + ".bad"); err != nil {
		t.Errorf("the damaged segment is not kept aside: %v", err)
	}
	run()
	pitrWorkload(t, c, rng, "after", 20)
	head = viewAt(t, c, 0).rev
	harness.WaitFor(t, time.Minute, "capture to catch up after the hole", func() bool { return harness.CapturedTo(ctx, s) >= head })
	want := viewAt(t, c, head)

	rs, err := changelog.Runs(ctx, s, "tl1")
	if err != nil || len(rs) != 1 {
		t.Fatalf("runs after the hole: %+v, %v; want one run, whole", rs, err)
	}
	if err := changelog.CheckReach(rs, base.Meta.Revision, head); err != nil {
		t.Fatal(err)
	}
	// Apply it all to the backup and restore it with etcd's own tool:
	// every chain link, and a digest read from etcd, must hold, and the
	// restored member must hold what etcd held.
	got, applied := restoreOffline(t, env, s, base.Name, "tl1", head, harness.DefaultEtcdVersion, "restored", nil)
	if applied.Digest == 0 {
		t.Errorf("the apply to %d checked no digest", head)
	}
	if d := want.diff(got); d != "" {
		t.Errorf("the restored history differs from etcd's at revision %d: %s", head, d)
	}
}

// Capture times are monotonic on a timeline: a writer whose clock is
// behind the one before it goes on from the last time written, so that
// --to-time's search never finds a later revision at an earlier time.
// The oracle is etcd's own revision of the write before the moment.
func TestCaptureTimesMonotonic(t *testing.T) {
	w := newBareWorld(t)
	env, c, ctx, s := w.env, w.c, w.ctx, w.s
	if _, err := c.Put(ctx, "/mono/before-base", "v"); err != nil {
		t.Fatal(err)
	}
	base := w.backup(t, "tl1", time.Now())
	put := func(k string) int64 { return w.put(t, k) }
	// writer captures with the clock now, from the last point the store
	// holds, until stop.
	writer := func(name string, now func() time.Time) (stop func()) {
		w, err := changelog.New(changelog.Default(), filepath.Join(env.Root, name), s, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
		if err != nil {
			t.Fatal(err)
		}
		w.Now = now
		wctx, wcancel := context.WithCancel(ctx)
		done := make(chan struct{}, 2)
		go func() {
			_ = w.Run(wctx, changelog.Etcd(c), "tl1", &changelog.Base{Backup: base.Name, Revision: base.Meta.Revision})
			done <- struct{}{}
		}()
		go func() { w.Upload(wctx); done <- struct{}{} }()
		return func() { wcancel(); <-done; <-done }
	}
	stop := writer("spool-1", time.Now)
	revA := put("/mono/a")
	time.Sleep(200 * time.Millisecond)
	at := time.Now()
	time.Sleep(200 * time.Millisecond)
	revB := put("/mono/b")
	harness.WaitFor(t, time.Minute, "the first writer to make /mono/b durable", func() bool { return harness.CapturedTo(ctx, s) >= revB })
	stop()
	// The next writer's clock is a little behind, within
	// --capture-max-clock-offset.
	stop = writer("spool-2", func() time.Time { return time.Now().Add(-900 * time.Millisecond) })
	var head int64
	for i := range 20 {
		head = put(fmt.Sprintf("/mono/late/%d", i))
	}
	harness.WaitFor(t, time.Minute, "the second writer to make its writes durable", func() bool { return harness.CapturedTo(ctx, s) >= head })
	stop()
	got, ok, err := changelog.RevisionAt(ctx, s, "tl1", at, nil)
	if err != nil || !ok || got != revA {
		t.Errorf("RevisionAt(between /mono/a and /mono/b) = %d, %v, %v; want %d (etcd's revision of /mono/a)", got, ok, err, revA)
	}
	rs, err := changelog.Runs(ctx, s, "tl1")
	if err != nil || len(rs) != 1 || rs[0].LastTime.Before(at) {
		t.Errorf("runs %+v (%v): the last capture time went back before %s", rs, err, at)
	}
	// A writer whose clock is an hour behind refuses to capture, and says
	// why, rather than stamp revisions with times that are not theirs.
	late, err := changelog.New(changelog.Default(), filepath.Join(env.Root, "spool-3"), s, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	late.Now = func() time.Time { return time.Now().Add(-time.Hour) }
	ran := make(chan error, 1)
	go func() { ran <- late.Run(ctx, changelog.Etcd(c), "tl1", nil) }()
	put("/mono/refused")
	select {
	case err := <-ran:
		if !errors.Is(err, changelog.ErrClockBehind) {
			t.Errorf("capture with a clock an hour behind ended with %v, want ErrClockBehind", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("capture with a clock an hour behind went on")
	}
}

// bareWorld is one bare etcd member, a client of it and the env's store,
// for the tests that drive capture and backups themselves.
type bareWorld struct {
	env  *harness.Env
	live *harness.BareCluster
	c    *clientv3.Client
	ctx  context.Context
	s    *store.Store
}

func newBareWorld(t *testing.T) *bareWorld {
	t.Helper()
	env := harness.NewEnv(t)
	live := env.NewBareCluster(1, false)
	live.Start(filepath.Join(env.BinDir, "etcd-v"+harness.DefaultEtcdVersion, "etcd"))
	c, err := clientv3.New(clientv3.Config{Endpoints: live.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitEtcd(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return &bareWorld{env: env, live: live, c: c, ctx: ctx, s: openStore(t, env.StoreURL)}
}

// backup takes a full backup of the member as timeline token's, named
// by now.
func (w *bareWorld) backup(t *testing.T, token string, now time.Time) backup.Info {
	t.Helper()
	info, err := backup.Take(w.ctx, w.s, backup.Request{
		Client: clientv3.Config{DialTimeout: 5 * time.Second, Logger: zap.NewNop()}, Endpoint: w.live.Endpoints()[0],
		TempDir: filepath.Join(w.env.Root, "tmp"), ClusterToken: token, Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// put writes k and returns etcd's revision of the write.
func (w *bareWorld) put(t *testing.T, k string) int64 {
	t.Helper()
	r, err := w.c.Put(w.ctx, k, "v")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}
