package bench

// Continuous capture benchmarks (issue #17): how far behind a write its
// capture is durable in the store (RPO), what capture costs a writer and
// the leading agent's memory, and how long a restore to the latest point
// takes against restoring the full backup alone.

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

const (
	// captureCut is the agents' --capture-cut-interval: the default.
	captureCut = 200 * time.Millisecond
	// storePollEvery is how often the RPO observer lists the store's wal/.
	storePollEvery = 20 * time.Millisecond
	// durableTimeout bounds the wait, after a load, for its last
	// acknowledged write to be durable in the store.
	durableTimeout = 2 * time.Minute
	// probeBytes is the size of the object the RPO baseline writes.
	probeBytes = 64 << 10
	// rssSampleEvery is how often the agent's VmRSS is sampled.
	rssSampleEvery = 100 * time.Millisecond

	// The load: loadClients clients (each on every member's client URL)
	// overwrite loadKeys keys with values of loadValueBytes.
	loadClients    = 4
	loadKeys       = 10_000
	loadValueBytes = 100
	loadPutTimeout = 5 * time.Second
	// pitrWorkers are the concurrent Puts that write the revisions the
	// point-in-time restore replays, as fast as the cluster takes them,
	// for at most pitrWriteMax.
	pitrWorkers  = 256
	pitrWriteMax = 6 * time.Minute

	rpoGoal      = time.Second
	overheadGoal = 1.1
	applyGoal    = 20_000.0
)

// loadWorkers is how many Puts a paced load keeps in flight at most:
// enough that a Put of 50ms still keeps up with rate.
func loadWorkers(rate int) int { return max(16, rate/20) }

// loadAck is one acknowledged write: its revision and when its Put returned.
type loadAck struct {
	rev int64
	at  time.Time
}

// loadRun is what one load measured.
type loadRun struct {
	rate       float64 // planned writes/s; 0: as fast as the workers go
	start, end time.Time
	lat        []time.Duration // of the acknowledged Puts
	acks       []loadAck
	failed     int
	missed     int // paced sends dropped because every worker was busy
	firstErr   string
}

func (l loadRun) achieved() float64 {
	if d := l.end.Sub(l.start).Seconds(); d > 0 {
		return float64(len(l.acks)) / d
	}
	return 0
}

func (l loadRun) maxRev() int64 {
	var m int64
	for _, a := range l.acks {
		m = max(m, a.rev)
	}
	return m
}

// describe is the load's outcome for a note.
func (l loadRun) describe() string {
	s := fmt.Sprintf("%d acknowledged at %.0f/s", len(l.acks), l.achieved())
	if l.failed > 0 {
		s += fmt.Sprintf(", %d failed (first: %s)", l.failed, l.firstErr)
	}
	if l.missed > 0 {
		s += fmt.Sprintf(", %d not sent (every worker busy)", l.missed)
	}
	return s
}

// runLoad writes count Puts through endpoints from up to workers
// goroutines, paced at rate a second (0: unpaced), bounded by count and
// maxTime. Each Put overwrites one of loadKeys keys under prefix.
func runLoad(t *testing.T, endpoints []string, cfg *tls.Config, prefix string, rate float64, count, workers int, maxTime time.Duration) loadRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), maxTime)
	defer cancel()
	clients := make([]*clientv3.Client, loadClients)
	for i := range clients {
		c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	type out struct {
		lat      []time.Duration
		acks     []loadAck
		failed   int
		firstErr string
		last     time.Time
	}
	outs := make([]out, workers)
	tokens := make(chan int, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &outs[w]
			o.lat = make([]time.Duration, 0, count/workers+1)
			o.acks = make([]loadAck, 0, count/workers+1)
			c := clients[w%loadClients]
			for i := range tokens {
				key := fmt.Sprintf("%s%05d", prefix, i%loadKeys)
				val := fmt.Sprintf("%0*d", loadValueBytes, i)
				pctx, pcancel := context.WithTimeout(ctx, loadPutTimeout)
				sent := time.Now()
				resp, err := c.Put(pctx, key, val)
				at := time.Now()
				pcancel()
				o.last = at
				if err != nil {
					if o.failed == 0 {
						o.firstErr = err.Error()
					}
					o.failed++
					continue
				}
				o.lat = append(o.lat, at.Sub(sent))
				o.acks = append(o.acks, loadAck{rev: resp.Header.Revision, at: at})
			}
		}()
	}
	r := loadRun{rate: rate, start: time.Now()}
send:
	for i := range count {
		if ctx.Err() != nil {
			break
		}
		if rate <= 0 {
			select {
			case tokens <- i:
			case <-ctx.Done():
				break send
			}
			continue
		}
		if d := time.Until(r.start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
			time.Sleep(d)
		}
		select {
		case tokens <- i:
		default:
			r.missed++
		}
	}
	close(tokens)
	wg.Wait()
	for _, o := range outs {
		r.lat = append(r.lat, o.lat...)
		r.acks = append(r.acks, o.acks...)
		if o.failed > 0 && r.failed == 0 {
			r.firstErr = o.firstErr
		}
		r.failed += o.failed
		if o.last.After(r.end) {
			r.end = o.last
		}
	}
	return r
}

// percentile is the nearest-rank p-th percentile (0 < p ≤ 1) of xs.
func percentile(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s))*p+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func maxDur(xs []time.Duration) time.Duration {
	var m time.Duration
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func fmtDurs(xs []time.Duration, unit time.Duration) string {
	var s []string
	for _, x := range xs {
		s = append(s, strconv.FormatFloat(float64(x)/float64(unit), 'f', 1, 64))
	}
	return strings.Join(s, ", ")
}

// captureCluster is a managed 3-member cluster on a file:// store, with
// continuous capture on or off, and the agents' metrics served.
type captureCluster struct {
	env     *harness.Env
	agents  []*harness.Agent
	cfg     *tls.Config
	capture bool
}

func startCaptureCluster(t *testing.T, capture bool) *captureCluster {
	t.Helper()
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	args := []string{"--backup-interval=24h"}
	if !capture {
		args = append(args, "--capture=false")
	} else if extra := strings.Fields(os.Getenv("BENCH_CAPTURE_ARGS")); len(extra) > 0 {
		// An experiment: flags for the capture-on cluster's agents only.
		// The note names them.
		args = append(args, extra...)
	}
	agents := env.StartAgents(3, harness.AgentOptions{Defaults: true, Metrics: true, ExtraArgs: args})
	harness.WaitSettled(t, agents, 3, 2*time.Minute)
	cfg := env.ClientTLS()
	untilWritable(t, harness.Endpoints(agents), cfg, time.Minute)
	return &captureCluster{env: env, agents: agents, cfg: cfg, capture: capture}
}

func (c *captureCluster) String() string {
	if c.capture {
		return "capture on"
	}
	return "capture off"
}

// leader is the leading agent: the one whose metrics say it captures
// (capture on) or acts as the manager leader (capture off).
func (c *captureCluster) leader(t *testing.T, timeout time.Duration) *harness.Agent {
	t.Helper()
	metric := "etcd_manager_leader"
	if c.capture {
		metric = "etcd_manager_capture_running"
	}
	var found *harness.Agent
	harness.WaitFor(t, timeout, "an agent reporting "+metric+" 1", func() bool {
		for _, a := range c.agents {
			if v, ok := metricValue(a.MetricsURL, metric); ok && v == 1 {
				found = a
				return true
			}
		}
		return false
	})
	return found
}

// metricValue reads one unlabelled metric from an agent's /metrics.
func metricValue(url, name string) (float64, bool) {
	hc := http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// segSeen is a segment the observer found in the store, and when.
type segSeen struct {
	first, last int64
	bodySize    int64
	at          time.Time
}

// storeWatch polls a timeline's segments in the store every
// storePollEvery and records when each first appears: the store as a
// restore would see it, not the agent's metrics.
type storeWatch struct {
	s        *store.Store
	timeline string
	mu       sync.Mutex
	seen     map[string]bool
	segs     []segSeen
	err      error
	polls    int
	slowest  time.Duration // the longest poll (listing and new headers)
	cancel   context.CancelFunc
	done     chan struct{}
}

// watchStore marks what the store holds now as old, then polls until
// stop is called.
func watchStore(t *testing.T, s *store.Store, timeline string) *storeWatch {
	t.Helper()
	w := &storeWatch{s: s, timeline: timeline, seen: map[string]bool{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	if err := w.poll(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	w.segs = nil
	go func() {
		defer close(w.done)
		tick := time.NewTicker(storePollEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := w.poll(ctx); err != nil && ctx.Err() == nil {
				w.mu.Lock()
				if w.err == nil {
					w.err = err
				}
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *storeWatch) poll(ctx context.Context) error {
	begin := time.Now()
	refs, err := changelog.List(ctx, w.s, w.timeline)
	if err != nil {
		return err
	}
	at := time.Now() // every segment listed was durable by now
	for _, r := range refs {
		w.mu.Lock()
		old := w.seen[r.Key]
		w.mu.Unlock()
		if old {
			continue
		}
		h, err := changelog.ReadHeaderAt(ctx, w.s, r.Key)
		if err != nil {
			return fmt.Errorf("read the header of %s: %w", r.Key, err)
		}
		w.mu.Lock()
		w.seen[r.Key] = true
		w.segs = append(w.segs, segSeen{first: h.First, last: h.Last, bodySize: h.BodySize, at: at})
		w.mu.Unlock()
	}
	w.mu.Lock()
	w.polls++
	w.slowest = max(w.slowest, time.Since(begin))
	w.mu.Unlock()
	return nil
}

// durable is the highest revision the segments seen hold with no hole
// before it, back to the first seen: a segment counts only with its whole
// chain, as the agent's own durable revision and its RPO metric count it.
func (w *storeWatch) durable() int64 {
	w.mu.Lock()
	sorted := slices.Clone(w.segs)
	w.mu.Unlock()
	if len(sorted) == 0 {
		return 0
	}
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].first < sorted[j].first })
	covered := sorted[0].first - 1
	for _, s := range sorted {
		if s.first > covered+1 {
			break
		}
		covered = max(covered, s.last)
	}
	return covered
}

// stop waits until rev is durable (bounded by durableTimeout), stops
// polling and returns the segments seen since watchStore.
func (w *storeWatch) stop(t *testing.T, rev int64) []segSeen {
	t.Helper()
	deadline := time.Now().Add(durableTimeout)
	for w.durable() < rev && time.Now().Before(deadline) {
		time.Sleep(storePollEvery)
	}
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		t.Fatalf("observing the store: %v", w.err)
	}
	return append([]segSeen(nil), w.segs...)
}

// rpos is, for each acknowledged write, the time from its
// acknowledgement until a segment holding its revision, and every
// revision before it back to the first write's, was seen in the store. early counts writes seen durable before their Put returned
// (their RPO is 0); missing those never seen.
func rpos(acks []loadAck, segs []segSeen) (out []time.Duration, early, missing int) {
	if len(acks) == 0 {
		return nil, 0, 0
	}
	lo, hi := acks[0].rev, acks[0].rev
	for _, a := range acks {
		lo, hi = min(lo, a.rev), max(hi, a.rev)
	}
	seen := make([]time.Time, hi-lo+1)
	sorted := append([]segSeen(nil), segs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].at.Before(sorted[j].at) })
	for _, s := range sorted {
		for r := max(s.first, lo); r <= min(s.last, hi); r++ {
			if seen[r-lo].IsZero() {
				seen[r-lo] = s.at
			}
		}
	}
	// Durable only with the whole chain before it: a revision counts once
	// every one from the first write's on is in the store.
	var whole time.Time
	for i := range seen {
		if seen[i].IsZero() || (i > 0 && seen[i-1].IsZero()) {
			seen[i] = time.Time{}
			continue
		}
		whole = maxTime(whole, seen[i])
		seen[i] = whole
	}
	for _, a := range acks {
		at := seen[a.rev-lo]
		switch {
		case at.IsZero():
			missing++
		case at.Before(a.at):
			early++
			out = append(out, 0)
		default:
			out = append(out, at.Sub(a.at))
		}
	}
	return out, early, missing
}

// probeStore is the RPO's baseline: every captureCut, what one cut of an
// ideal capture costs: a probeBytes object written and fsynced (file and
// directory) on the disk the agents spool to, then stored create-once in
// a file:// store on the same disk. It runs until the returned function
// is called, which returns each probe's duration.
func probeStore(t *testing.T, dir string) func() []time.Duration {
	t.Helper()
	spool := filepath.Join(dir, "spool")
	if err := os.MkdirAll(spool, 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(context.Background(), harness.FileURL(filepath.Join(dir, "store")), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, probeBytes)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var lat []time.Duration
	var perr error
	go func() {
		defer close(done)
		tick := time.NewTicker(captureCut)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			start := time.Now()
			if err := probeOnce(ctx, s, spool, fmt.Sprintf("probe/%08d", i), data); err != nil {
				if ctx.Err() == nil && perr == nil {
					perr = err
				}
				continue
			}
			lat = append(lat, time.Since(start))
		}
	}()
	return func() []time.Duration {
		cancel()
		<-done
		s.Close()
		if perr != nil {
			t.Fatalf("the store probe: %v", perr)
		}
		return lat
	}
}

func probeOnce(ctx context.Context, s *store.Store, spool, key string, data []byte) error {
	path := filepath.Join(spool, strings.ReplaceAll(key, "/", "-"))
	if err := os.WriteFile(path+".tmp", data, 0o600); err != nil {
		return err
	}
	f, err := os.OpenFile(path+".tmp", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return err
	}
	d, err := os.Open(spool)
	if err != nil {
		return err
	}
	err = d.Sync()
	d.Close()
	if err != nil {
		return err
	}
	f, err = os.Open(path)
	if err != nil {
		return err
	}
	err = s.CreateFrom(ctx, key, f)
	f.Close()
	if err != nil {
		return err
	}
	return os.Remove(path)
}

// rssSample is one VmRSS reading of a process.
type rssSample struct {
	at  time.Time
	mib float64
}

// rssWatch samples a process's VmRSS every rssSampleEvery, with its
// VmHWM reset first, until stop.
type rssWatch struct {
	pid     int
	samples []rssSample
	stopc   chan struct{}
	done    chan struct{}
}

func watchRSS(t *testing.T, pid int) *rssWatch {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatalf("reset the agent's peak RSS: %v", err)
	}
	w := &rssWatch{pid: pid, stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(rssSampleEvery)
		defer tick.Stop()
		for {
			if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
				if v := statusFieldMiB(string(data), "VmRSS"); v > 0 {
					w.samples = append(w.samples, rssSample{at: time.Now(), mib: v})
				}
			}
			select {
			case <-w.stopc:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// rssRun is the leading agent's memory over one load.
type rssRun struct {
	hwm           float64 // VmHWM at the end: the peak, between samples too
	first, second float64 // the largest VmRSS sampled in each half of the load
	start, end    float64 // the first and last samples
	n             int
}

// stop ends sampling and splits the samples at the middle of the load.
func (w *rssWatch) stop(t *testing.T, l loadRun) rssRun {
	t.Helper()
	close(w.stopc)
	<-w.done
	r := rssRun{hwm: procStatusMiB(t, w.pid, "VmHWM"), n: len(w.samples)}
	mid := l.start.Add(l.end.Sub(l.start) / 2)
	for _, s := range w.samples {
		if s.at.Before(mid) {
			r.first = max(r.first, s.mib)
		} else {
			r.second = max(r.second, s.mib)
		}
	}
	if n := len(w.samples); n > 0 {
		r.start, r.end = w.samples[0].mib, w.samples[n-1].mib
	}
	return r
}

// captureLoadRun is what the capture load benchmarks measured.
type captureLoadRun struct {
	onP99, offP99 []time.Duration // Put latency p99 of each load
	onP50, offP50 []time.Duration
	onLat, offLat []time.Duration // every acknowledged Put's latency, all loads
	onRate        float64         // the sum of the capture-on loads' achieved rates
	onFailed      int
	onMissed      int
	onLoads       []string // describe() of each load
	offLoads      []string
	rpo           []time.Duration // every write of every capture-on load
	early         int
	probe         []time.Duration
	segBytes      []float64 // body sizes of the segments seen, KiB
	polls         int
	slowestPoll   time.Duration
	rssOn, rssOff rssRun  // at sc.rssRate
	atRateOn      float64 // the capturing agent's VmHWM over the captureRate loads
	atRateOff     float64
	rssLoadOn     string
	rssLoadOff    string
	rpoAtRSSRate  []time.Duration
	leaderOn      string
	leaderOff     string
	// stops are the "capture stopped" lines the capturing agent logged
	// during the loads.
	stops []string
	// The CPU time of the loaded cluster's processes over its loads, in
	// CPU-seconds: its 3 agents, its 3 etcds.
	onAgentCPU, onEtcdCPU, offAgentCPU, offEtcdCPU float64
}

// cpu is the CPU time so far of a cluster's agents and of their
// etcds, in 1/userHZ s.
func (c *captureCluster) cpu(t *testing.T) (agents, etcds int64) {
	t.Helper()
	for _, a := range c.agents {
		agents += cpuTicks(t, a.PID())
		etcds += cpuTicks(t, a.EtcdPID())
	}
	return agents, etcds
}

func benchCaptureLoad(t *testing.T, sc scale) []Result {
	var r captureLoadRun
	t.Run("capture-load", func(t *testing.T) {
		r = runCaptureLoad(t, sc)
	})
	if len(r.rpo) == 0 || len(r.onP99) == 0 {
		return []Result{
			{Name: "rpo-p99", Skipped: true, Reason: "the capture load benchmark failed"},
			{Name: "capture-overhead", Skipped: true, Reason: "the capture load benchmark failed"},
			{Name: "agent-capture-rss", Skipped: true, Reason: "the capture load benchmark failed"},
		}
	}
	setup := fmt.Sprintf("two managed 3-member clusters side by side on file:// stores, etcd %s, TLS as shipped, default timings, --backup-interval=24h, "+
		"one with continuous capture as shipped (--capture-cut-interval=%s), the other with --capture=false; "+
		"the load of rpo-p99 and capture-overhead: %d clients on every member's client URL, Puts of %d-byte values over %d keys, paced at %d writes/s for %s from up to %d in flight (scale %s)",
		harness.DefaultEtcdVersion, captureCut, loadClients, loadValueBytes, loadKeys, sc.captureRate, sc.captureWindow, loadWorkers(sc.captureRate), sc.name)
	if extra := strings.TrimSpace(os.Getenv("BENCH_CAPTURE_ARGS")); extra != "" {
		setup += "; an experiment: the capture-on cluster's agents also ran with " + extra
	}

	p50, p99, worst := percentile(r.rpo, 0.5), percentile(r.rpo, 0.99), maxDur(r.rpo)
	probe99 := percentile(r.probe, 0.99)
	base := captureCut + probe99
	verdict := "meets"
	if p99 > rpoGoal {
		verdict = "does NOT meet"
	}
	segKiB := 0.0
	if len(r.segBytes) > 0 {
		segKiB = median(r.segBytes)
	}
	rssRPO := ""
	if len(r.rpoAtRSSRate) > 0 {
		rssRPO = fmt.Sprintf("; under the %d writes/s load of agent-capture-rss the RPO was p50 %.3fs, p99 %.3fs, max %.3fs over %d writes",
			sc.rssRate, percentile(r.rpoAtRSSRate, 0.5).Seconds(), percentile(r.rpoAtRSSRate, 0.99).Seconds(), maxDur(r.rpoAtRSSRate).Seconds(), len(r.rpoAtRSSRate))
	}
	if n := len(r.stops); n > 0 {
		rssRPO += fmt.Sprintf("; the capturing agent logged %d capture stop(s) during the loads, each followed by a restart after a back-off (the first: %s)",
			n, logAttr(r.stops[0], "error"))
	}
	rpo := Result{Name: "rpo-p99", Value: p99.Seconds(), Unit: "s", Baseline: base.Seconds(), Ratio: ratio(p99.Seconds(), base.Seconds()),
		Note: fmt.Sprintf("%s the goal of p99 ≤ %s; for each acknowledged write, the time from its Put's return until a segment holding its revision was first listed in the store "+
			"(wal/<token>/ listed and new segments' headers read every %s by the benchmark, as a restore would see them, not the agent's metrics; %d polls, the slowest %.0fms, so a figure can be up to one poll late): "+
			"p50 %.3fs, p99 %.3fs, max %.3fs over %d writes of %d load(s) on the capture-on cluster (%s; %d seen durable before their Put returned, counted as 0); "+
			"segments seen: median %.1f KiB%s; "+
			"baseline: an ideal capture's RPO, the cut interval %s plus the p99 of what one cut costs, measured every %s during every load of both clusters: a %d KiB object written and fsynced (file, then directory) "+
			"on the disk the agents spool to, then stored create-once in a file:// store on the same disk (p50 %.1fms, p99 %.1fms over %d probes); %s",
			verdict, rpoGoal, storePollEvery, r.polls, float64(r.slowestPoll)/float64(time.Millisecond),
			p50.Seconds(), p99.Seconds(), worst.Seconds(), len(r.rpo), len(r.onP99), r.onSummary(), r.early,
			segKiB, rssRPO, captureCut, captureCut, probeBytes>>10,
			float64(percentile(r.probe, 0.5))/float64(time.Millisecond), float64(probe99)/float64(time.Millisecond), len(r.probe), setup)}

	on, off := percentile(r.onLat, 0.99), percentile(r.offLat, 0.99)
	ov := ratio(on.Seconds(), off.Seconds())
	verdict = "meets"
	if ov > overheadGoal {
		verdict = "does NOT meet"
	}
	overhead := Result{Name: "capture-overhead", Value: ms(on), Unit: "ms", Baseline: ms(off), Ratio: ov,
		Note: fmt.Sprintf("%s the goal of ≤ %.1f×; Put latency p99 with capture on, over the %d Puts acknowledged in %d load(s) of %s (p50 %.1f ms; each load's p99 %s ms, p50 %s ms; loads: %s); "+
			"baseline: the same with --capture=false, the same load on the same cluster shape in the same run, the loads alternating between the two clusters (on, off, off, on, ...) to cancel drift: "+
			"p99 %.1f ms over %d Puts (p50 %.1f ms; each load's p99 %s ms, p50 %s ms; loads: %s); "+
			"CPU time (utime+stime) over these loads of the loaded cluster's 3 agents: %.2f s with capture, %.2f s without; of its 3 etcds: %.2f s with, %.2f s without; %s",
			verdict, overheadGoal, len(r.onLat), len(r.onP99), sc.captureWindow, ms(percentile(r.onLat, 0.5)), fmtDurs(r.onP99, time.Millisecond), fmtDurs(r.onP50, time.Millisecond), strings.Join(r.onLoads, "; "),
			ms(off), len(r.offLat), ms(percentile(r.offLat, 0.5)), fmtDurs(r.offP99, time.Millisecond), fmtDurs(r.offP50, time.Millisecond), strings.Join(r.offLoads, "; "),
			r.onAgentCPU, r.offAgentCPU, r.onEtcdCPU, r.offEtcdCPU, setup)}

	growth := ratio(r.rssOn.second, r.rssOn.first)
	flat := "flat"
	if growth > 1.1 {
		flat = "NOT flat"
	}
	rss := Result{Name: "agent-capture-rss", Value: r.rssOn.hwm, Unit: "MiB", Baseline: r.rssOff.hwm, Ratio: ratio(r.rssOn.hwm, r.rssOff.hwm),
		Note: fmt.Sprintf("peak RSS (VmHWM, reset through clear_refs just before the load) of the leading agent process %s (not its etcd), capturing, under a load paced at %d writes/s for %s (%s; from up to %d in flight, as many as this machine's cluster takes); "+
			"%s over the run: the largest VmRSS sampled every %s was %.1f MiB in the first half and %.1f MiB in the second (%.2f×; %d samples, %.1f MiB at the start, %.1f MiB at the end); "+
			"under the %d writes/s loads of rpo-p99 its peak was %.1f MiB (without capture %.1f MiB); "+
			"baseline: the leading agent %s of the --capture=false cluster under the same load in the same run (%s): VmHWM %.1f MiB, sampled %.1f MiB then %.1f MiB by halves; %s",
			r.leaderOn, sc.rssRate, sc.rssWindow, r.rssLoadOn, loadWorkers(sc.rssRate),
			flat, rssSampleEvery, r.rssOn.first, r.rssOn.second, growth, r.rssOn.n, r.rssOn.start, r.rssOn.end,
			sc.captureRate, r.atRateOn, r.atRateOff,
			r.leaderOff, r.rssLoadOff, r.rssOff.hwm, r.rssOff.first, r.rssOff.second, setup)}
	return []Result{rpo, overhead, rss}
}

// onSummary sums up the capture-on loads of rpo-p99.
func (r captureLoadRun) onSummary() string {
	return fmt.Sprintf("%d acknowledged at %.0f/s on average, %d failed, %d not sent", len(r.onLat), r.onRate/float64(max(len(r.onP99), 1)), r.onFailed, r.onMissed)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// runCaptureLoad starts the capture-on and capture-off clusters, runs the
// paced load on each, alternately, sc.captureIterations times, observing
// the capture-on cluster's store, then the rssRate load on each.
func runCaptureLoad(t *testing.T, sc scale) captureLoadRun {
	var r captureLoadRun
	on := startCaptureCluster(t, true)
	off := startCaptureCluster(t, false)
	onLeader, offLeader := on.leader(t, 2*time.Minute), off.leader(t, time.Minute)
	r.leaderOn, r.leaderOff = onLeader.Name, offLeader.Name

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := store.Open(ctx, on.env.StoreURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	timeline := waitCaptured(t, on, s)
	logFrom := len(onLeader.Log())

	rate := float64(sc.captureRate)
	count := int(rate * sc.captureWindow.Seconds())
	loadMax := 2*sc.captureWindow + time.Minute
	for i := range sc.captureIterations {
		order := []*captureCluster{on, off}
		if i%2 == 1 {
			order = []*captureCluster{off, on}
		}
		for _, c := range order {
			leader := onLeader
			if !c.capture {
				leader = offLeader
			}
			// The observer and the probe run during the loads of both
			// clusters, so that the benchmark's own work weighs the same
			// on both sides of capture-overhead.
			rw := watchRSS(t, leader.PID())
			w := watchStore(t, s, timeline)
			stopProbe := probeStore(t, filepath.Join(c.env.Root, fmt.Sprintf("probe-%d", i)))
			agents0, etcds0 := c.cpu(t)
			l := runLoad(t, harness.Endpoints(c.agents), c.cfg, "/bench/capture/", rate, count, loadWorkers(sc.captureRate), loadMax)
			agents1, etcds1 := c.cpu(t)
			agentCPU, etcdCPU := float64(agents1-agents0)/userHZ, float64(etcds1-etcds0)/userHZ
			peak := rw.stop(t, l).hwm
			probes := stopProbe()
			r.probe = append(r.probe, probes...)
			if len(l.acks) < count/2 {
				t.Fatalf("%s: only %d of %d writes acknowledged: %s", c, len(l.acks), count, l.describe())
			}
			p50, p99 := percentile(l.lat, 0.5), percentile(l.lat, 0.99)
			if !c.capture {
				w.stop(t, 0)
				r.offP99, r.offP50, r.offLoads, r.offLat = append(r.offP99, p99), append(r.offP50, p50), append(r.offLoads, l.describe()), append(r.offLat, l.lat...)
				r.atRateOff = max(r.atRateOff, peak)
				r.offAgentCPU, r.offEtcdCPU = r.offAgentCPU+agentCPU, r.offEtcdCPU+etcdCPU
				t.Logf("load %d, %s: Put p50 %s, p99 %s; %s; store probe p99 %s; leading agent peak RSS %.1f MiB; CPU: agents %.2fs, etcds %.2fs",
					i+1, c, p50, p99, l.describe(), percentile(probes, 0.99), peak, agentCPU, etcdCPU)
				continue
			}
			segs := w.stop(t, l.maxRev())
			rpo, early, missing := rpos(l.acks, segs)
			if missing > 0 {
				t.Fatalf("%s: %d of %d acknowledged writes were not durable in the store %s after the load (durable to %d, the last write %d)",
					c, missing, len(l.acks), durableTimeout, w.durable(), l.maxRev())
			}
			r.onP99, r.onP50, r.onLoads, r.onLat = append(r.onP99, p99), append(r.onP50, p50), append(r.onLoads, l.describe()), append(r.onLat, l.lat...)
			r.onRate, r.onFailed, r.onMissed = r.onRate+l.achieved(), r.onFailed+l.failed, r.onMissed+l.missed
			r.rpo, r.early = append(r.rpo, rpo...), r.early+early
			for _, sg := range segs {
				r.segBytes = append(r.segBytes, float64(sg.bodySize)/1024)
			}
			r.polls, r.slowestPoll = r.polls+w.polls, max(r.slowestPoll, w.slowest)
			r.atRateOn = max(r.atRateOn, peak)
			r.onAgentCPU, r.onEtcdCPU = r.onAgentCPU+agentCPU, r.onEtcdCPU+etcdCPU
			t.Logf("load %d, %s: Put p50 %s, p99 %s; %s; RPO p50 %s, p99 %s, max %s over %d segments; store probe p99 %s; leading agent peak RSS %.1f MiB; CPU: agents %.2fs, etcds %.2fs",
				i+1, c, p50, p99, l.describe(), percentile(rpo, 0.5), percentile(rpo, 0.99), maxDur(rpo), len(segs), percentile(probes, 0.99), peak, agentCPU, etcdCPU)
		}
	}

	// The leading agent's memory at rssRate, each cluster in turn.
	rssCount := sc.rssRate * int(sc.rssWindow/time.Second)
	for _, c := range []*captureCluster{on, off} {
		leader := onLeader
		if !c.capture {
			leader = offLeader
		}
		w := watchStore(t, s, timeline) // on both sides, as above
		rw := watchRSS(t, leader.PID())
		l := runLoad(t, harness.Endpoints(c.agents), c.cfg, "/bench/rss/", float64(sc.rssRate), rssCount, loadWorkers(sc.rssRate), 2*sc.rssWindow+time.Minute)
		rr := rw.stop(t, l)
		if len(l.acks) < rssCount/10 {
			t.Fatalf("%s: only %d of %d writes acknowledged: %s", c, len(l.acks), rssCount, l.describe())
		}
		t.Logf("rss load, %s: %s; Put p99 %s; leading agent %s VmHWM %.1f MiB, sampled %.1f then %.1f MiB",
			c, l.describe(), percentile(l.lat, 0.99), leader.Name, rr.hwm, rr.first, rr.second)
		if c.capture {
			segs := w.stop(t, l.maxRev())
			rpo, _, missing := rpos(l.acks, segs)
			if missing > 0 {
				t.Fatalf("%s: %d of %d acknowledged writes were not durable in the store %s after the load", c, missing, len(l.acks), durableTimeout)
			}
			r.rssOn, r.rssLoadOn, r.rpoAtRSSRate = rr, l.describe(), rpo
			t.Logf("rss load, %s: RPO p50 %s, p99 %s, max %s", c, percentile(rpo, 0.5), percentile(rpo, 0.99), maxDur(rpo))
		} else {
			w.stop(t, 0)
			r.rssOff, r.rssLoadOff = rr, l.describe()
		}
	}

	for _, line := range strings.Split(onLeader.Log()[logFrom:], "\n") {
		if strings.Contains(line, `msg="capture stopped`) {
			r.stops = append(r.stops, line)
			t.Logf("during the loads, agent %s: %s", onLeader.Name, line)
		}
	}

	// The agents measured led throughout.
	if a := on.leader(t, 10*time.Second); a != onLeader {
		t.Fatalf("capture moved from agent %s to %s during the benchmark", onLeader.Name, a.Name)
	}
	if a := off.leader(t, 10*time.Second); a != offLeader {
		t.Fatalf("leadership of the capture-off cluster moved from agent %s to %s during the benchmark", offLeader.Name, a.Name)
	}
	return r
}

// waitCaptured writes one key to the capture-on cluster and waits until
// it is durable in the store, and returns the timeline.
func waitCaptured(t *testing.T, c *captureCluster, s *store.Store) string {
	t.Helper()
	cl, err := clientv3.New(clientv3.Config{Endpoints: harness.Endpoints(c.agents), TLS: c.cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := cl.Put(ctx, "/bench/capture-probe", "x")
	if err != nil {
		t.Fatal(err)
	}
	var timeline string
	harness.WaitFor(t, 2*time.Minute, "capture to make a write durable in the store", func() bool {
		tlines, err := changelog.Timelines(ctx, s)
		if err != nil || len(tlines) != 1 {
			return false
		}
		timeline = tlines[0]
		runs, err := changelog.Runs(ctx, s, timeline)
		return err == nil && len(runs) > 0 && runs[len(runs)-1].Last >= resp.Header.Revision
	})
	return timeline
}

// pitrRun is what the point-in-time restore benchmark measured.
type pitrRun struct {
	dbSize               int64
	fillSecs, backupSecs float64
	backup               string
	baseRev, head        int64
	load                 loadRun
	writeSecs            float64
	durableLag           float64 // from the last write's return until the head was durable
	segments             int
	walBytes             int64
	latest, name         []float64 // restore seconds, until a Get
	latestPhases         []string
	namePhases           []string
	errorLines           int
	applySecs            float64
	applied              changelog.Applied
}

func benchPITR(t *testing.T, sc scale) []Result {
	var r pitrRun
	t.Run("pitr-restore", func(t *testing.T) {
		r = runPITR(t, sc)
	})
	if len(r.latest) == 0 || len(r.name) == 0 || r.applySecs == 0 {
		return []Result{
			{Name: "pitr-restore", Skipped: true, Reason: "the point-in-time restore benchmark failed"},
			{Name: "pitr-apply-rate", Skipped: true, Reason: "the point-in-time restore benchmark failed"},
		}
	}
	n := r.head - r.baseRev
	writeRate := float64(n) / r.writeSecs
	short := ""
	if n < int64(sc.pitrRevisions) {
		short = fmt.Sprintf(" (short of the %d aimed at: the writer stops after %s)", sc.pitrRevisions, pitrWriteMax)
	}
	errs := ""
	if r.errorLines > 0 {
		errs = fmt.Sprintf("; the agents logged %d error line(s) during the restores (see the test log)", r.errorLines)
	}
	latest, name := median(r.latest), median(r.name)
	extra := latest - name
	setup := fmt.Sprintf("a managed 3-member cluster on a file:// store, etcd %s, TLS as shipped, default timings, --backup-interval=24h, capture as shipped; "+
		"DB filled to %.0f MiB (scale %s: %.0f MiB target) with %d KiB values of random hex in %.1fs, then backup-now (%s, %.1fs) at revision %d; "+
		"then %d revisions%s, each a Put of a %d-byte value over %d keys from %d concurrent writers, written in %.1fs (%.0f/s; %s) and durable in the store %.2fs after the last returned, in %d segments of %.1f MiB",
		harness.DefaultEtcdVersion, mib(r.dbSize), sc.name, mib(sc.pitrDBBytes), fillValueBytes>>10, r.fillSecs, r.backup, r.backupSecs, r.baseRev,
		n, short, loadValueBytes, loadKeys, pitrWorkers, r.writeSecs, writeRate, r.load.describe(), r.durableLag, r.segments, mib(r.walBytes))
	added := fmt.Sprintf("the %d revisions added %.1fs, %.0f revisions/s end to end", n, extra, float64(n)/extra)
	if extra <= 0 {
		added = fmt.Sprintf("the %d revisions added no time measurable above the noise", n)
	}
	restore := Result{Name: "pitr-restore", Value: latest, Unit: "s", Baseline: name, Ratio: ratio(latest, name),
		Note: fmt.Sprintf("etcd-manager-ctl restore-backup --latest --timeout=20m over the live cluster, until a linearizable Get succeeds and reports revision %d: the full backup brought forward by %d revisions of captured segments "+
			"(on the driving agent to validate it, then on each of the 3 nodes in parallel), restored on every node, checked, the quarantine lifted, and backed up afresh (the ctl returns once that backup is recorded); "+
			"median of %d (%s s; after the first, --latest --timeline=<the original timeline>, as the cluster restored is on a new one); phases: %s; "+
			"baseline: restore-backup %s, the full backup alone, the same way, the restores alternating (--latest, backup, backup, --latest, ...): median of %d (%s s; phases: %s); "+
			"%s; %s%s",
			r.head, n, len(r.latest), fmtList(r.latest), strings.Join(r.latestPhases, "; "),
			r.backup, len(r.name), fmtList(r.name), strings.Join(r.namePhases, "; "), added, setup, errs)}
	rate := float64(r.applied.Revisions) / r.applySecs
	verdict := "meets"
	if rate < applyGoal {
		verdict = "does NOT meet"
	}
	apply := Result{Name: "pitr-apply-rate", Value: rate, Unit: "revisions/s", Baseline: writeRate, Ratio: ratio(rate, writeRate),
		Note: fmt.Sprintf("%s the goal of ≥ %.0f revisions/s; changelog.Apply, the code restore-backup runs on each node, run alone in the benchmark's process on the fetched %.0f MiB snapshot of backup %s: "+
			"%d revisions from %d segments applied in %.2fs (fetch and gunzip before the clock); "+
			"baseline: the rate at which the live cluster took those revisions from its writers in the same run, %.0f/s; %s",
			verdict, applyGoal, mib(r.dbSize), r.backup, r.applied.Revisions, r.applied.Segments, r.applySecs, writeRate, setup)}
	return []Result{restore, apply}
}

// runPITR fills a capture-on cluster, backs it up, writes
// sc.pitrRevisions revisions, and restores the latest point, then the
// backup alone, then applies the segments in process.
func runPITR(t *testing.T, sc scale) pitrRun {
	var r pitrRun
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{Defaults: true, ExtraArgs: []string{"--backup-interval=24h"}})
	harness.WaitSettled(t, agents, 3, 2*time.Minute)
	cfg := env.ClientTLS()
	endpoints := harness.Endpoints(agents)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s, err := store.Open(ctx, env.StoreURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	fillTimeout := time.Minute
	if sc.pitrDBBytes > 256<<20 {
		fillTimeout = 10 * time.Minute
	}
	start := time.Now()
	r.dbSize = fill(t, agents[0].ClientURL, cfg, sc.pitrDBBytes, fillTimeout)
	r.fillSecs = time.Since(start).Seconds()
	r.backupSecs, r.backup = backupNow(t, env)
	meta, err := backup.ReadMeta(ctx, s, r.backup)
	if err != nil {
		t.Fatal(err)
	}
	r.baseRev = changelog.SnapshotRevision(meta.Revision)
	timeline := meta.ClusterToken
	t.Logf("filled to %.0f MiB in %.1fs; backup %s at revision %d of timeline %s in %.1fs", mib(r.dbSize), r.fillSecs, r.backup, r.baseRev, timeline, r.backupSecs)

	r.load = runLoad(t, endpoints, cfg, "/bench/pitr/", 0, sc.pitrRevisions, pitrWorkers, pitrWriteMax)
	// A Put that timed out may still have been applied: the head is the
	// cluster's, not the last acknowledged.
	r.head = revision(t, endpoints, cfg)
	r.writeSecs = r.load.end.Sub(r.load.start).Seconds()
	if r.head <= r.baseRev {
		t.Fatalf("no revision written after the backup: %s", r.load.describe())
	}
	t.Logf("wrote revisions %d to %d in %.1fs: %s", r.baseRev+1, r.head, r.writeSecs, r.load.describe())
	harness.WaitFor(t, 10*time.Minute, fmt.Sprintf("capture to make revision %d durable", r.head), func() bool {
		runs, err := changelog.Runs(ctx, s, timeline)
		return err == nil && len(runs) > 0 && runs[len(runs)-1].Last >= r.head
	})
	r.durableLag = time.Since(r.load.end).Seconds()
	refs, err := changelog.List(ctx, s, timeline)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range refs {
		h, err := changelog.ReadHeaderAt(ctx, s, ref.Key)
		if err != nil {
			t.Fatal(err)
		}
		if h.Last > r.baseRev {
			r.segments++
			if st, err := os.Stat(filepath.Join(env.StoreDir, filepath.FromSlash(ref.Key))); err == nil {
				r.walBytes += st.Size()
			}
		}
	}

	restore := func(what string, want int64, args ...string) (float64, string) {
		harness.WaitSettled(t, agents, 3, 2*time.Minute)
		// Each restore starts with the backup out of the page cache (see
		// runRestores).
		dropCached(t, filepath.Join(env.StoreDir, r.backup, backup.DataObject))
		start := time.Now()
		id := restoreBackup(t, env, r.backup, args...)
		returned := time.Now()
		if err := untilReadable(endpoints, cfg, readableTimeout, nil); err != nil {
			t.Fatalf("after restore %s: %v", what, err)
		}
		end := time.Now()
		if got := revision(t, endpoints, cfg); got != want {
			t.Fatalf("restore %s: the cluster is at revision %d, want %d", what, got, want)
		}
		phases, errLines := restorePhases(agents, id, start, returned, end)
		r.errorLines += len(errLines)
		for _, l := range errLines {
			t.Logf("agent error during restore %s: %s", what, l)
		}
		if len(errLines) > 0 {
			phases += fmt.Sprintf(" (the agents logged %d error line(s), the first: %s)", len(errLines), errorSummary(errLines[0]))
		}
		secs := end.Sub(start).Seconds()
		t.Logf("restore %s: %.2fs until a Get at revision %d; %s", what, secs, want, phases)
		return secs, phases
	}
	for i := range sc.restoreIterations {
		latestFirst := i%2 == 0
		for _, latest := range []bool{latestFirst, !latestFirst} {
			if !latest {
				secs, phases := restore(r.backup, r.baseRev)
				r.name, r.namePhases = append(r.name, secs), append(r.namePhases, fmt.Sprintf("%d: %s", len(r.name)+1, phases))
				continue
			}
			// Once restored, the cluster is on a new timeline, whose
			// newest backup is the one the restore took.
			args := []string{"--latest"}
			if len(r.latest) > 0 {
				args = append(args, "--timeline="+timeline)
			}
			secs, phases := restore(strings.Join(args, " "), r.head, args...)
			r.latest, r.latestPhases = append(r.latest, secs), append(r.latestPhases, fmt.Sprintf("%d: %s", len(r.latest)+1, phases))
		}
	}

	// changelog.Apply alone, in this process, with nothing else running.
	path, _, err := backup.Fetch(ctx, s, r.backup, t.TempDir(), backup.FetchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	r.applied, err = changelog.Apply(ctx, s, path, timeline, r.head, changelog.ApplyOptions{})
	r.applySecs = time.Since(start).Seconds()
	if err != nil {
		t.Fatalf("apply to %d: %v", r.head, err)
	}
	if r.applied.To != r.head {
		t.Fatalf("apply to %d reached %d", r.head, r.applied.To)
	}
	t.Logf("changelog.Apply: %d revisions from %d segments in %.2fs", r.applied.Revisions, r.applied.Segments, r.applySecs)
	return r
}

// errorSummary is an agent's error line, as restorePhases returns it,
// shortened for a note: the agent, the message and the error.
func errorSummary(line string) string {
	agent, _, _ := strings.Cut(line, ": ")
	s := fmt.Sprintf("%s: %s: %s", agent, logAttr(line, "msg"), logAttr(line, "error"))
	if r := []rune(s); len(r) > 300 {
		s = string(r[:300]) + "…"
	}
	return s
}

// revision is the cluster's current revision, from a linearizable Get.
func revision(t *testing.T, endpoints []string, cfg *tls.Config) int64 {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, "/bench/probe")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// The benchmark's RPO counts a write durable only once the store holds
// every revision before it, as the agent's durable revision does: a
// segment seen after a hole does not make its writes durable.
func TestRPOCountsWholeChains(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	acks := []loadAck{{rev: 10, at: at(0)}, {rev: 11, at: at(0)}, {rev: 12, at: at(0)}, {rev: 13, at: at(0)}}
	// 10-11 seen at 1 s, 13 at 2 s, 12 (the hole) only at 5 s.
	segs := []segSeen{{first: 10, last: 11, at: at(1)}, {first: 13, last: 13, at: at(2)}, {first: 12, last: 12, at: at(5)}}
	got, _, missing := rpos(acks, segs)
	want := []time.Duration{time.Second, time.Second, 5 * time.Second, 5 * time.Second}
	if missing != 0 || !slices.Equal(got, want) {
		t.Errorf("rpos = %v (missing %d), want %v", got, missing, want)
	}
	// Without the hole's segment, 12 and 13 are never durable.
	if _, _, missing := rpos(acks, segs[:2]); missing != 2 {
		t.Errorf("with a hole at 12: %d writes missing, want 2", missing)
	}
	w := &storeWatch{segs: segs[:2]}
	if d := w.durable(); d != 11 {
		t.Errorf("durable with a hole at 12 = %d, want 11", d)
	}
}
