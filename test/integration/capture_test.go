package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// TestCaptureAcrossFaults: capture goes on, with no gap and no revision
// twice, through a change of leader (the capturing agent killed), a store
// outage (MinIO stopped for a while) and an agent restart, under a steady
// steadyWriter. Then 20 random revisions and 5 random moments of that history
// are restored offline and compared with what the live cluster served at
// each revision.
func TestCaptureAcrossFaults(t *testing.T) {
	minio := harness.StartMinIO(t)
	minio.CreateBucket(t, "capture")
	env := harness.NewEnv(t)
	env.UseStore(minio.StoreURL("capture", "etcd/main"), minio.Env())
	setEnv(t, minio.Env())
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{Metrics: true})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := openStore(t, env.StoreURL)
	baseName := strings.TrimSpace(env.MustCtl("backup-now"))
	base, err := backup.ReadMeta(ctx, s, baseName)
	if err != nil {
		t.Fatal(err)
	}
	c := clusterClient(t, agents)
	wr := startSteadyWriter(c)
	defer wr.halt()

	// The capturing agent says so in its metrics.
	capturing := func(not *harness.Agent) *harness.Agent {
		var found *harness.Agent
		harness.WaitFor(t, 2*time.Minute, "an agent to capture", func() bool {
			for _, a := range agents {
				if a != not && a.Running() && strings.Contains(scrape(t, a.MetricsURL), "\netcd_manager_capture_running 1") {
					found = a
					return true
				}
			}
			return false
		})
		return found
	}
	progress := func(what string) {
		rev := wr.last()
		harness.WaitFor(t, 2*time.Minute, what, func() bool { return harness.CapturedTo(ctx, s) >= rev })
	}
	time.Sleep(2 * time.Second)

	// A change of leader: the capturing agent dies with its etcd.
	leader := capturing(nil)
	leader.Kill()
	next := capturing(leader)
	t.Logf("capture moved from %s to %s", leader.Name, next.Name)
	leader.Start()
	harness.WaitSettled(t, agents, 3, settleTimeout)
	progress("capture to go on after the change of leader")

	// A store outage: the spool holds what capture cuts meanwhile.
	minio.Stop()
	spooler := capturing(nil)
	harness.WaitFor(t, 30*time.Second, "segments to wait in the spool", func() bool {
		m := spoolRE.FindStringSubmatch(scrape(t, spooler.MetricsURL))
		return m != nil && m[1] != "0"
	})
	time.Sleep(2 * time.Second)
	minio.Start()
	progress("the spool to drain after the store outage")

	// The capturing agent restarts: it resumes after what it spooled.
	cur := capturing(nil)
	cur.Stop()
	cur.Start()
	harness.WaitSettled(t, agents, 3, settleTimeout)
	time.Sleep(2 * time.Second)
	wr.halt()
	head := wr.last()
	progress("capture to reach the head")
	// Every spool drains, the killed leader's too: what it cut before it
	// died overlaps what its successor wrote, and is trimmed to fit.
	harness.WaitFor(t, time.Minute, "every spool to drain", func() bool {
		for _, a := range agents {
			if m := spoolRE.FindStringSubmatch(scrape(t, a.MetricsURL)); m == nil || m[1] != "0" {
				return false
			}
		}
		return true
	})
	for _, a := range agents {
		if strings.Contains(a.Log(), "segment is corrupt") {
			t.Errorf("%s found a segment corrupt:\n%s", a.Name, grepLines(a.Log(), "segment is corrupt", 3))
		}
	}

	// One run, no gap: every revision from the backup on, once.
	tls, err := changelog.Timelines(ctx, s)
	if err != nil || len(tls) != 1 {
		t.Fatalf("timelines: %v, %v; want one", tls, err)
	}
	tl := tls[0]
	runs, err := changelog.Runs(ctx, s, tl)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || changelog.SnapshotRevision(base.Revision)+1 != runs[0].First || runs[0].Last < head {
		t.Fatalf("captured runs %+v; want one from revision %d to at least %d", runs, base.Revision+1, head)
	}
	for _, a := range agents {
		if strings.Contains(a.Log(), "capture cannot continue") {
			t.Errorf("%s started a new run: a gap", a.Name)
		}
	}

	// 20 random revisions and 5 random moments, as the live cluster saw
	// them.
	rng := rand.New(rand.NewPCG(3, 3))
	var targets []int64
	for range 20 {
		targets = append(targets, base.Revision+1+rng.Int64N(head-base.Revision))
	}
	for range 5 {
		at := runs[0].FirstTime.Add(time.Duration(rng.Int64N(int64(runs[0].LastTime.Sub(runs[0].FirstTime)))))
		rev, ok, err := changelog.RevisionAt(ctx, s, tl, at, nil)
		if err != nil || !ok {
			t.Fatalf("revision at %s: %d %v %v", at, rev, ok, err)
		}
		targets = append(targets, rev)
	}
	for i, target := range targets {
		want := viewAt(t, c, target)
		got, applied := restoreOffline(t, env, s, baseName, tl, target, harness.DefaultEtcdVersion, fmt.Sprintf("restore%d", i), nil)
		if d := want.diff(got); d != "" {
			t.Errorf("restored to %d: %s", target, d)
		}
		if applied.Revisions != target-changelog.SnapshotRevision(base.Revision) {
			t.Errorf("restored to %d: applied %d revisions, want %d", target, applied.Revisions, target-base.Revision)
		}
	}
	t.Logf("%d writes; revisions %d to %d captured in one run; %d restores compared", wr.count(), runs[0].First, runs[0].Last, len(targets))

	// Compaction overtakes capture: the capturing agent dies, writes go
	// on, and the cluster is compacted to its head before another agent
	// resumes. Availability wins: capture starts a new run after a fresh
	// full backup, and the hole is reported, not hidden. The other agents
	// are paused (their etcd runs on) until the compaction is done: a
	// successor whose watch caught up first would capture every revision,
	// correctly, and leave no hole to report.
	victim := capturing(nil)
	var others []*harness.Agent
	for _, a := range agents {
		if a != victim {
			a.Pause()
			others = append(others, a)
		}
	}
	victim.Kill()
	for i := range 30 {
		// The client may have been talking to the member that died.
		harness.WaitFor(t, 30*time.Second, "a write", func() bool {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := c.Put(wctx, fmt.Sprintf("/capture/late/%d", i), "v")
			return err == nil
		})
	}
	compactTo := viewAt(t, c, 0).rev
	if _, err := c.Compact(ctx, compactTo); err != nil {
		t.Fatal(err)
	}
	for _, a := range others {
		a.Continue()
	}
	gapper := capturing(victim)
	victim.Start()
	harness.WaitFor(t, 2*time.Minute, "capture to start a new run after a full backup", func() bool {
		// A new run shows in the store with its first write.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, _ = c.Put(wctx, "/capture/after-gap", "v")
		cancel()
		runs, err := changelog.Runs(ctx, s, tl)
		return err == nil && len(runs) == 2 && runs[1].Base != nil
	})
	runs, err = changelog.Runs(ctx, s, tl)
	if err != nil {
		t.Fatal(err)
	}
	gaps := changelog.Gaps(runs)
	if len(gaps) != 1 || gaps[0].After >= compactTo || gaps[0].Before <= compactTo-30 {
		t.Fatalf("gaps %+v after a compaction to %d; want one hole before it", gaps, compactTo)
	}
	if m := gapsRE.FindStringSubmatch(scrape(t, gapper.MetricsURL)); m == nil || m[1] == "0" {
		t.Errorf("%s did not count the gap in etcd_manager_capture_gaps: %v", gapper.Name, m)
	}
	// The new run's base backup is restorable itself: the hole ends
	// before it.
	if out := env.MustCtl("list-backups", "--ranges"); !strings.Contains(out, fmt.Sprintf("gap: revisions %d to %d cannot be restored", gaps[0].After+1, runs[1].Base.Revision-1)) {
		t.Errorf("list-backups --ranges does not show the gap %+v before the base at %d:\n%s", gaps[0], runs[1].Base.Revision, out)
	}
	inGap := gaps[0].After + 1
	if _, errOut, err := env.Ctl("restore-backup", fmt.Sprintf("--to-revision=%d", inGap)); err == nil || !strings.Contains(errOut, "not captured") {
		t.Errorf("restore-backup into the gap (revision %d): %v\n%s", inGap, err, errOut)
	}
	t.Logf("compaction to %d overtook capture: gap %d..%d reported, new run from %d", compactTo, gaps[0].After+1, gaps[0].Before-1, runs[1].First)
}

var gapsRE = regexp.MustCompile(`(?m)^etcd_manager_capture_gaps (\S+)`)

var spoolRE = regexp.MustCompile(`(?m)^etcd_manager_capture_spool_bytes (\S+)`)

// steadyWriter puts and deletes keys, 50 a second at most, until halted.
type steadyWriter struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	rev  int64
	n    int
}

func startSteadyWriter(c *clientv3.Client) *steadyWriter {
	w := &steadyWriter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < 20000; i++ {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			k := fmt.Sprintf("/capture/%d", i%40)
			var rev int64
			if i%5 == 4 {
				if r, err := c.Delete(ctx, k); err == nil {
					rev = r.Header.Revision
				}
			} else if r, err := c.Put(ctx, k, fmt.Sprint(i)); err == nil {
				rev = r.Header.Revision
			}
			cancel()
			w.mu.Lock()
			if rev > 0 {
				w.rev, w.n = max(w.rev, rev), w.n+1
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *steadyWriter) last() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rev
}

func (w *steadyWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func (w *steadyWriter) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// grepLines returns up to n lines of log that contain s.
func grepLines(log, s string, n int) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) && len(out) < n {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCaptureCatchesUp: capture reads etcd in passes, each from a watch
// that starts behind, which etcd answers in batches of up to 1000
// revisions from its sync loop (every 100ms). A backlog of 2500
// revisions takes several batches and is cut by size as it goes, with a
// cut interval (10ms) far shorter than etcd's sync loop; then a paced
// writer is kept up with. Every revision is in the store exactly once,
// in order, chained.
func TestCaptureCatchesUp(t *testing.T) {
	etcd := startSegmentSource(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := openStore(t, "file://"+t.TempDir())
	base := headRevision(t, ctx, etcd)
	const backlog, workers = 2500, 10
	var wg sync.WaitGroup
	value := strings.Repeat("v", 200)
	for w := range workers {
		wg.Go(func() {
			for i := range backlog / workers {
				if _, err := etcd.Put(ctx, fmt.Sprintf("/catch-up/%d/%d", w, i), value); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	head := headRevision(t, ctx, etcd)

	cfg := changelog.Default()
	cfg.CutInterval = 10 * time.Millisecond
	cfg.MaxSegmentBytes = 64 << 10
	c := startCapture(t, ctx, cfg, s, changelog.Etcd(etcd), "catchup", base, slog.LevelWarn)
	harness.WaitFor(t, time.Minute, fmt.Sprintf("the backlog to revision %d in the store", head), func() bool {
		return c.Status().Durable >= head
	})
	for i := range 100 { // about 100 writes a second
		if _, err := etcd.Put(ctx, fmt.Sprintf("/catch-up/paced/%d", i), value); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	head = headRevision(t, ctx, etcd)
	harness.WaitFor(t, time.Minute, fmt.Sprintf("the paced writes to revision %d in the store", head), func() bool {
		return c.Status().Durable >= head
	})
	c.stop(t)

	next, prev, bySize := base+1, changelog.RunStart("catchup", base), 0
	segments := eachStoredRecord(t, ctx, s, "catchup", func(key string, h changelog.Header) {
		if h.Prev != prev {
			t.Fatalf("%s does not follow the segment before it", key)
		}
		prev = h.Chain
		if h.BodySize >= cfg.MaxSegmentBytes {
			bySize++
		}
	}, func(key string, rec changelog.Record) {
		next = nextRevision(t, key, rec, next)
	})
	if next != head+1 {
		t.Fatalf("the store holds revisions %d to %d, want %d to %d", base+1, next-1, base+1, head)
	}
	if bySize == 0 {
		t.Errorf("no segment of the %d-revision backlog was cut by size (%d bytes)", backlog, cfg.MaxSegmentBytes)
	}
	t.Logf("revisions %d to %d in %d segments, %d cut by size", base+1, head, segments, bySize)
}

// eachStoredRecord reads timeline's segments from the store in order,
// calls segment (when set) with each one's header, then record with each
// of its records, whose events hold only during the call. It returns how
// many segments it read.
func eachStoredRecord(t *testing.T, ctx context.Context, s *store.Store, timeline string, segment func(key string, h changelog.Header), record func(key string, rec changelog.Record)) int {
	t.Helper()
	refs, err := changelog.List(ctx, s, timeline)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range refs {
		r, err := s.Reader(ctx, ref.Key)
		if err != nil {
			t.Fatal(err)
		}
		sr, err := changelog.NewReader(r, ref.Key, nil)
		if err != nil {
			r.Close()
			t.Fatal(err)
		}
		if segment != nil {
			segment(ref.Key, sr.Header)
		}
		for {
			rec, err := sr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				r.Close()
				t.Fatalf("%s: %v", ref.Key, err)
			}
			record(ref.Key, rec)
		}
		r.Close()
	}
	return len(refs)
}

// nextRevision checks that a revision record is the one due next, and
// returns the one due after it; other records change nothing.
func nextRevision(t *testing.T, key string, rec changelog.Record, next int64) int64 {
	t.Helper()
	if rec.Kind != changelog.KindRevision {
		return next
	}
	if rec.Revision != next {
		t.Fatalf("%s holds revision %d where %d was due", key, rec.Revision, next)
	}
	return next + 1
}

// capturing is a changelog capture of one timeline, and its upload, running
// against a real etcd until stop.
type capturing struct {
	*changelog.Capture
	timeline string
	ran      chan error
	uploaded chan struct{}
	cancel   context.CancelFunc
}

// startCapture runs capture of timeline after base with cfg, from a fresh
// spool, reading etcd through cl, and its upload into s; it logs at
// level and above.
func startCapture(t *testing.T, ctx context.Context, cfg changelog.Config, s *store.Store, cl changelog.Client, timeline string, base int64, level slog.Level) *capturing {
	t.Helper()
	c, err := changelog.New(cfg, t.TempDir(), s, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level})))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	r := &capturing{Capture: c, timeline: timeline, ran: make(chan error, 1), uploaded: make(chan struct{}), cancel: cancel}
	go func() { r.ran <- c.Run(cctx, cl, timeline, &changelog.Base{Backup: "full-backup", Revision: base}) }()
	go func() { c.Upload(cctx); close(r.uploaded) }()
	return r
}

// stop ends the capture and its upload, and fails unless the run ended
// for the cancellation alone.
func (r *capturing) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	if err := <-r.ran; !errors.Is(err, context.Canceled) {
		t.Fatalf("capture of %s ended with %v", r.timeline, err)
	}
	<-r.uploaded
}

// countingWatches is etcd's client for capture, counting the watch
// streams opened, keeping the size of the largest message any sent, and
// counting the revisions a fragment boundary split.
type countingWatches struct {
	changelog.Client
	watches atomic.Int64
	largest atomic.Int64
	splits  atomic.Int64
}

func (c *countingWatches) WatchStream(ctx context.Context) (pb.Watch_WatchClient, error) {
	c.watches.Add(1)
	s, err := c.Client.WatchStream(ctx)
	if err != nil {
		return nil, err
	}
	return &sizedStream{Watch_WatchClient: s, c: c}, nil
}

type sizedStream struct {
	pb.Watch_WatchClient
	c       *countingWatches
	lastRev int64 // of the last event of a fragment that has more to come
}

func (s *sizedStream) Recv() (*pb.WatchResponse, error) {
	resp, err := s.Watch_WatchClient.Recv()
	if err != nil {
		return resp, err
	}
	n := int64(proto.Size(resp))
	for old := s.c.largest.Load(); n > old && !s.c.largest.CompareAndSwap(old, n); old = s.c.largest.Load() {
	}
	if len(resp.Events) > 0 {
		if s.lastRev != 0 && resp.Events[0].Kv.ModRevision == s.lastRev {
			s.c.splits.Add(1)
		}
		s.lastRev = 0
		if resp.Fragment {
			s.lastRev = resp.Events[len(resp.Events)-1].Kv.ModRevision
		}
	}
	return resp, nil
}

// TestCaptureIdleKeepsOneWatch: an idle cluster's capture keeps the
// watch of its last pass open rather than open one every cut interval,
// and the next change, arriving on that watch, is captured at once;
// after it, capture is idle on one watch again.
func TestCaptureIdleKeepsOneWatch(t *testing.T) {
	etcd := startSegmentSource(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := openStore(t, "file://"+t.TempDir())
	base := headRevision(t, ctx, etcd)
	cfg := changelog.Default()
	cfg.CutInterval = 10 * time.Millisecond
	cl := &countingWatches{Client: changelog.Etcd(etcd)}
	c := startCapture(t, ctx, cfg, s, cl, "idle", base, slog.LevelWarn)

	// idleFor checks that capture opens at most one watch in a second,
	// a hundred cut intervals.
	idleFor := func(what string) {
		t.Helper()
		before := cl.watches.Load()
		time.Sleep(time.Second)
		if n := cl.watches.Load() - before; n > 1 {
			t.Fatalf("%s: capture opened %d watches in a second of an idle cluster, want at most 1", what, n)
		}
	}
	time.Sleep(200 * time.Millisecond) // the first passes
	idleFor("from the start")
	for i := range 3 {
		if _, err := etcd.Put(ctx, fmt.Sprintf("/idle/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
		head := headRevision(t, ctx, etcd)
		harness.WaitFor(t, 10*time.Second, fmt.Sprintf("revision %d in the store", head), func() bool {
			return c.Status().Durable >= head
		})
		time.Sleep(100 * time.Millisecond) // the pass after the change
		idleFor(fmt.Sprintf("after change %d", i+1))
	}
	c.stop(t)
	if n := cl.watches.Load(); n < 4 {
		t.Errorf("capture opened %d watches for 3 changes, want a new one after each", n)
	}
}

// TestCaptureDigestsWhileIdle: a digest that falls due while the cluster
// is quiet, after a burst of writes, is taken then, at the burst's last
// revision, not only once the next change arrives; the segment of that
// next change carries it into the store, so a restore to the next
// change checks it.
func TestCaptureDigestsWhileIdle(t *testing.T) {
	etcd := startSegmentSource(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := openStore(t, "file://"+t.TempDir())
	base := headRevision(t, ctx, etcd)
	cfg := changelog.Default()
	cfg.CutInterval = 10 * time.Millisecond
	cfg.DigestInterval = 2 * time.Second
	c := startCapture(t, ctx, cfg, s, changelog.Etcd(etcd), "quiet", base, slog.LevelWarn)

	// The burst lands within the first digest's interval: no digest of
	// it is due before the cluster goes quiet.
	for i := range 10 {
		if _, err := etcd.Put(ctx, fmt.Sprintf("/quiet/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	burst := headRevision(t, ctx, etcd)
	harness.WaitFor(t, 10*time.Second, fmt.Sprintf("the burst to revision %d in the store", burst), func() bool {
		return c.Status().Durable >= burst
	})
	time.Sleep(2*cfg.DigestInterval + time.Second) // quiet: the digest falls due and finishes
	if _, err := etcd.Put(ctx, "/quiet/next", "v"); err != nil {
		t.Fatal(err)
	}
	head := headRevision(t, ctx, etcd)
	harness.WaitFor(t, 10*time.Second, fmt.Sprintf("revision %d in the store", head), func() bool {
		return c.Status().Durable >= head
	})
	c.stop(t)

	var digests []int64
	eachStoredRecord(t, ctx, s, "quiet", nil, func(_ string, rec changelog.Record) {
		if rec.Kind == changelog.KindDigest {
			digests = append(digests, rec.Revision)
		}
	})
	if !slices.Contains(digests, burst) {
		t.Fatalf("the store holds digests at revisions %v, want one at %d, the last revision before the quiet spell", digests, burst)
	}
}

// TestCaptureCatchesUpInFragments: capture that starts behind a backlog
// of large values reads etcd's catch-up response (up to 1000 revisions
// in one) in fragments of about etcd's --max-request-bytes, not
// as one message of the whole backlog, and puts every revision in the
// store whole, including transactions a fragment boundary split.
func TestCaptureCatchesUpInFragments(t *testing.T) {
	// etcd takes requests of up to 6 MiB: one value below is larger than
	// gRPC's default 4 MiB message, and etcd sends it whole.
	etcd, _, _ := startBareSource(t, "--max-request-bytes=6291456")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := openStore(t, "file://"+t.TempDir())
	base := headRevision(t, ctx, etcd)

	// want holds each revision's keys and value sizes, a tombstone as -1.
	want := map[int64]map[string]int{}
	large := strings.Repeat("v", 512<<10)
	half := strings.Repeat("t", 700<<10)
	for i := range 60 {
		key := fmt.Sprintf("/fragments/%03d", i)
		switch {
		case i < 12: // transactions of two values, 1.4 MiB in all: a fragment of 9 values splits one
			resp, err := etcd.Txn(ctx).Then(clientv3.OpPut(key+"/a", half), clientv3.OpPut(key+"/b", half)).Commit()
			if err != nil {
				t.Fatal(err)
			}
			want[resp.Header.Revision] = map[string]int{key + "/a": len(half), key + "/b": len(half)}
		case i == 30: // one value larger than gRPC's default message
			value := strings.Repeat("x", 5<<20)
			resp, err := etcd.Put(ctx, key, value)
			if err != nil {
				t.Fatal(err)
			}
			want[resp.Header.Revision] = map[string]int{key: len(value)}
		case i%10 == 5: // a delete of an earlier key
			prev := fmt.Sprintf("/fragments/%03d", i-1)
			resp, err := etcd.Delete(ctx, prev)
			if err != nil {
				t.Fatal(err)
			}
			want[resp.Header.Revision] = map[string]int{prev: -1}
		default:
			resp, err := etcd.Put(ctx, key, large)
			if err != nil {
				t.Fatal(err)
			}
			want[resp.Header.Revision] = map[string]int{key: len(large)}
		}
	}
	head := headRevision(t, ctx, etcd)
	if n := int64(len(want)); head-base != n {
		t.Fatalf("the backlog is revisions %d to %d, want %d revisions", base+1, head, n)
	}

	cfg := changelog.Default()
	cfg.CutInterval = 10 * time.Millisecond
	cl := &countingWatches{Client: changelog.Etcd(etcd)}
	c := startCapture(t, ctx, cfg, s, cl, "fragments", base, slog.LevelWarn)
	harness.WaitFor(t, time.Minute, fmt.Sprintf("the backlog to revision %d in the store", head), func() bool {
		return c.Status().Durable >= head
	})
	c.stop(t)

	// etcd's fragments stay under its --max-request-bytes plus its 512
	// KiB allowance for gRPC, 6.5 MiB here, but for one event larger than
	// that (none here). Whole, the backlog is one 36 MiB message.
	if largest := cl.largest.Load(); largest > 13<<19 {
		t.Errorf("capture received a watch message of %d bytes while catching up on %d revisions, want fragments of at most %d", largest, head-base, 13<<19)
	}
	if cl.splits.Load() == 0 {
		t.Errorf("no fragment boundary split a transaction: the test does not cover a revision split across fragments")
	}
	got := map[int64]map[string]int{}
	segments := eachStoredRecord(t, ctx, s, "fragments", nil, func(_ string, rec changelog.Record) {
		if rec.Kind != changelog.KindRevision {
			return
		}
		if got[rec.Revision] != nil {
			t.Fatalf("revision %d is in the store twice", rec.Revision)
		}
		kvs := map[string]int{}
		for _, ev := range rec.Events {
			var kv mvccpb.KeyValue
			if err := proto.Unmarshal(ev.Value, &kv); err != nil {
				t.Fatalf("revision %d: %v", rec.Revision, err)
			}
			kvs[string(kv.Key)] = len(kv.Value)
			if ev.Tombstone {
				kvs[string(kv.Key)] = -1
			}
		}
		got[rec.Revision] = kvs
	})
	for rev := base + 1; rev <= head; rev++ {
		if !maps.Equal(got[rev], want[rev]) {
			t.Errorf("revision %d in the store holds %v, want %v", rev, got[rev], want[rev])
		}
	}
	t.Logf("%d revisions caught up in %d segments, the largest watch message %d KiB, %d revisions split across fragments", head-base, segments, cl.largest.Load()>>10, cl.splits.Load())
}

// TestCaptureAcrossAnEtcdRestart: etcd restarts under a running capture,
// which breaks its watch and fails its lease polls. Capture watches again
// once etcd serves, and its run goes on: every revision, before, during
// and after, reaches the store once, in order.
func TestCaptureAcrossAnEtcdRestart(t *testing.T) {
	etcd, member, etcdBin := startBareSource(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := openStore(t, "file://"+t.TempDir())
	base := headRevision(t, ctx, etcd)
	cfg := changelog.Default()
	cfg.CutInterval = 10 * time.Millisecond
	cl := &countingWatches{Client: changelog.Etcd(etcd)}
	c := startCapture(t, ctx, cfg, s, cl, "restart", base, slog.LevelDebug)

	for i := range 20 {
		put(t, etcd, fmt.Sprintf("/restart/before/%d", i), "v")
	}
	before := headRevision(t, ctx, etcd)
	harness.WaitFor(t, 10*time.Second, fmt.Sprintf("revision %d in the store", before), func() bool { return c.Status().Durable >= before })
	opened := cl.watches.Load()

	member.Stop()
	time.Sleep(2 * time.Second) // several of capture's tries to watch again
	select {
	case err := <-c.ran:
		t.Fatalf("capture ended while etcd was down: %v", err)
	default:
	}
	member.Start(etcdBin)
	waitEtcd(t, etcd)
	for i := range 20 {
		put(t, etcd, fmt.Sprintf("/restart/after/%d", i), "v")
	}
	head := headRevision(t, ctx, etcd)
	harness.WaitFor(t, time.Minute, fmt.Sprintf("revision %d in the store", head), func() bool {
		select {
		case err := <-c.ran:
			t.Fatalf("capture ended with %v, want its one run to go on across the restart", err)
		default:
		}
		return c.Status().Durable >= head
	})
	c.stop(t)
	if n := cl.watches.Load() - opened; n < 2 {
		t.Errorf("capture opened %d watches across the restart, want it to watch again", n)
	}

	next := base + 1
	eachStoredRecord(t, ctx, s, "restart", nil, func(key string, rec changelog.Record) {
		next = nextRevision(t, key, rec, next)
	})
	if next != head+1 {
		t.Fatalf("the store holds revisions %d to %d, want %d to %d", base+1, next-1, base+1, head)
	}
}
