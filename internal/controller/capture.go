package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

// capturer runs continuous capture beside the control loop: the upload of
// the spool always (so a former leader's segments still land), and the
// capture itself while this agent leads the cluster, on its own etcd.
type capturer struct {
	cfg changelog.Config
	log *slog.Logger
	now func() time.Time
	dir string
	url string
	// keys encrypt the segments uploaded and merged, and decrypt those
	// merged; set before upload runs.
	keys *crypt.Keyring
	// clockRefused is why capture was last refused for the clocks, said
	// once; "" while it is not (loop goroutine only).
	clockRefused string

	mu       sync.Mutex
	changes  *changelog.Capture // set once the store is open
	store    *store.Store
	run      *captureRun
	needBase bool
	// needBaseSince is when needBase was last set: a full backup taken
	// from then on is a base capture can start from.
	needBaseSince time.Time
	retryAt       time.Time
	failures      int
	// lastMerge is when the last merge pass began.
	lastMerge time.Time
}

// captureRun is one capture of one timeline.
type captureRun struct {
	token     string
	endpoints []string
	// backupDue is set when a full backup was due as the run started.
	backupDue bool
	cancel    context.CancelFunc
	done      chan struct{}
}

func newCapturer(cfg changelog.Config, dataDir, url string, log *slog.Logger, now func() time.Time, reg prometheus.Registerer) *capturer {
	c := &capturer{cfg: cfg, log: log, now: now, dir: filepath.Join(dataDir, "capture"), url: url}
	status := func(f func(changelog.Status) float64) func() float64 {
		return func() float64 {
			c.mu.Lock()
			w := c.changes
			c.mu.Unlock()
			if w == nil {
				return 0
			}
			return f(w.Status())
		}
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_enabled",
			Help: "1 when this agent runs with continuous capture (--capture): its leader's capture is expected to follow every change."},
			func() float64 { return b2f(cfg.Enabled) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_set_aside",
			Help: "Spooled segments that did not read and were set aside, since the agent started: each ended its run there."},
			status(func(s changelog.Status) float64 { return float64(s.SetAside) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_running",
			Help: "1 while this agent captures its cluster's changes into the store (the leader, with --capture)."},
			status(func(s changelog.Status) float64 { return b2f(s.Running) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_durable_revision",
			Help: "The last revision this agent's capture made durable in the store."},
			status(func(s changelog.Status) float64 { return float64(s.Durable) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_durable_timestamp_seconds",
			Help: "Unix time capture observed the last revision it made durable in the store: a restore can reach it."},
			status(func(s changelog.Status) float64 {
				if s.DurableTime.IsZero() {
					return 0
				}
				return float64(s.DurableTime.UnixNano()) / 1e9
			})),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_spool_bytes",
			Help: "Captured changes on local disk waiting for the store."},
			status(func(s changelog.Status) float64 { return float64(s.SpoolBytes) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_spool_full",
			Help: "1 while capture is stopped because its spool reached --capture-max-spool-bytes."},
			status(func(s changelog.Status) float64 { return b2f(s.SpoolFull) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_gaps",
			Help: "Times capture could not continue from the last captured revision and started again after a full backup, since the agent started."},
			status(func(s changelog.Status) float64 { return float64(s.Gaps) })),
	)
	return c
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// upload opens the store and ships the spool until ctx ends.
func (c *capturer) upload(ctx context.Context) {
	if !c.cfg.Enabled {
		return
	}
	for {
		s, err := store.Open(ctx, c.url, store.Options{Create: true})
		if err == nil {
			defer s.Close()
			w, err := changelog.New(c.cfg, c.dir, s, c.log)
			if err != nil {
				c.log.Error("continuous capture is off: its spool is unusable", "dir", c.dir, "error", err)
				return
			}
			w.Keys = c.keys
			// The tests can set capture's clock back (a release build
			// ignores it).
			w.Now = testhook.Clock(w.Now)
			c.mu.Lock()
			c.changes, c.store = w, s
			c.mu.Unlock()
			w.Upload(ctx)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

// needsBase reports whether capture waits for a full backup to start a
// run from.
func (c *capturer) needsBase() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.needBase
}

// wantBase records that capture needs a full backup taken from now on to
// go on from. Callers hold c.mu.
func (c *capturer) wantBase() {
	if !c.needBase {
		c.needBaseSince = c.now()
	}
	c.needBase = true
}

// baseStored records that the store holds a full backup of this
// agent's cluster begun at: one another agent took (the driver of a
// restore, say) serves as the base as well as one of this agent's own.
// Backup times are whole seconds, so one begun in the same second as
// the need counts; should it be too old after all, capture says so again.
func (c *capturer) baseStored(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.needBase && !at.Before(c.needBaseSince.Truncate(time.Second)) {
		c.needBase = false
	}
}

// backedUp records that a full backup was just taken.
func (c *capturer) backedUp() {
	c.mu.Lock()
	defer c.mu.Unlock()
	// The retry backoff stays: a capture that keeps failing must not
	// turn into a stream of backups.
	c.needBase = false
}

// sync starts capture while this agent leads a serving cluster, and stops
// it otherwise or when the cluster changes.
func (c *capturer) sync(lp *loop, obs plan.Observed) {
	want := obs.Cluster != nil && obs.Self.Member != nil && !obs.Self.Member.Quarantined && lp.clientEndpoint != ""
	if err := lp.captureClockErr(); want && err != nil {
		// A revision's time is this agent's clock: one far off would put
		// --to-time's boundaries in the wrong place.
		want = false
		if msg := err.Error(); msg != c.clockRefused {
			c.clockRefused = msg
			c.log.Error("capture refused: this agent's clock is too far off; fix the clocks (NTP)", "error", err)
		}
	} else if err == nil && c.clockRefused != "" {
		c.clockRefused = ""
		c.log.Info("capture may go on: the clocks agree again")
	}
	token := ""
	if want {
		token = obs.Cluster.Token
	}
	c.follow(want, token, []string{lp.clientEndpoint}, lp.etcdTLS, obs.BackupDue)
}

// follow captures the cluster token through its endpoints while want
// holds, and stops otherwise or when they change. Capture starts at once
// from the newest full backup it can find, even when another is due (a
// new lock holder's first), so that the revisions until that backup stay
// reachable; when it finds none, it waits quietly for the due one.
func (c *capturer) follow(want bool, token string, endpoints []string, tlsCfg *tls.Config, backupDue bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	want = want && c.cfg.Enabled && c.changes != nil
	if r := c.run; r != nil {
		select {
		case <-r.done:
			c.run = nil
		default:
			if want && r.token == token && slices.Equal(r.endpoints, endpoints) {
				return
			}
			r.cancel()
			c.mu.Unlock()
			<-r.done
			c.mu.Lock()
			c.run = nil
		}
	}
	if !want || c.now().Before(c.retryAt) || c.needBase {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &captureRun{token: token, endpoints: endpoints, backupDue: backupDue, cancel: cancel, done: make(chan struct{})}
	c.run = r
	go c.capture(ctx, r, c.changes, c.store, tlsCfg)
}

// capture runs one capture until it fails or is stopped.
func (c *capturer) capture(ctx context.Context, r *captureRun, w *changelog.Capture, s *store.Store, tlsCfg *tls.Config) {
	defer close(r.done)
	mctx, stopMerging := context.WithCancel(ctx)
	merged := make(chan struct{})
	go func() {
		defer close(merged)
		c.merge(mctx, s, r.token)
	}()
	err := c.captureOnce(ctx, r, w, s, tlsCfg)
	stopMerging()
	<-merged
	if ctx.Err() != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(err, changelog.ErrNeedBase) && r.backupDue {
		// The backup already due is the base: no failure, no delay.
		c.wantBase()
		c.log.Info("capture waits for the full backup that is due", "cluster-token", r.token, "reason", err)
		return
	}
	c.failures++
	delay := min(time.Duration(c.failures)*2*time.Second, 30*time.Second)
	c.retryAt = c.now().Add(delay)
	switch {
	case errors.Is(err, changelog.ErrNeedBase):
		c.wantBase()
		c.log.Warn("capture needs a fresh full backup to go on from; taking one", "cluster-token", r.token, "reason", err)
	case errors.Is(err, changelog.ErrClockBehind):
		c.log.Error("capture refused: this agent's clock is behind the last time captured; fix the clocks (NTP)", "cluster-token", r.token, "error", err, "retry-in", delay)
	case errors.Is(err, changelog.ErrSpoolFull):
		c.wantBase()
		c.log.Error("capture stopped: its spool is full while the store is unreachable; a full backup follows once the store is back", "error", err)
	default:
		c.log.Warn("capture stopped; it resumes from the last captured revision", "cluster-token", r.token, "error", err, "retry-in", delay)
	}
}

func (c *capturer) captureOnce(ctx context.Context, r *captureRun, w *changelog.Capture, s *store.Store, tlsCfg *tls.Config) error {
	base, err := newestBackup(ctx, s, r.token)
	if err != nil {
		return err
	}
	cl, err := etcdproc.NewClient(r.endpoints, tlsCfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	started := c.now()
	err = w.Run(ctx, changelog.Etcd(cl), r.token, base)
	if c.now().Sub(started) > time.Minute {
		c.mu.Lock()
		c.failures = 0 // it ran well for a while
		c.mu.Unlock()
	}
	return err
}

// merge merges the timeline's segments every MergeInterval while this
// agent captures it.
func (c *capturer) merge(ctx context.Context, s *store.Store, token string) {
	if c.cfg.MergeInterval <= 0 || len(c.cfg.MergeWindows) == 0 {
		return
	}
	m := &changelog.Merger{Store: s, Dir: filepath.Join(c.dir, "merge"), Windows: c.cfg.MergeWindows, Log: c.log, Keys: c.keys}
	// A disagreement that persists is said again hourly, not every pass.
	lastKept, keptSaid := 0, time.Time{}
	for {
		// From the last pass, whichever run made it: a capture that
		// restarts often still merges.
		c.mu.Lock()
		wait := c.lastMerge.Add(c.cfg.MergeInterval).Sub(c.now())
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, 0)):
		}
		c.mu.Lock()
		c.lastMerge = c.now()
		c.mu.Unlock()
		res, err := m.Once(ctx, token, c.now())
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			c.log.Warn("cannot merge captured segments; trying again later", "cluster-token", token, "error", err)
		case res.Kept > 0 && (res.Kept != lastKept || c.now().Sub(keptSaid) >= time.Hour):
			c.log.Error("merged segments disagree with segments they should hold; both are kept for a person to look at",
				"cluster-token", token, "segments", res.Kept)
			keptSaid = c.now()
		}
		if err == nil {
			lastKept = res.Kept
		}
	}
}

// newestBackup is the newest full backup of the cluster token, or nil.
func newestBackup(ctx context.Context, s *store.Store, token string) (*changelog.Base, error) {
	in, err := backup.Newest(ctx, s, func(m backup.Meta) bool { return m.ClusterToken == token }, 0)
	if err != nil || in == nil {
		return nil, err
	}
	return &changelog.Base{Backup: in.Name, Revision: changelog.SnapshotRevision(in.Meta.Revision)}, nil
}

// stop ends capture and waits for it.
func (c *capturer) stop() {
	c.mu.Lock()
	r := c.run
	c.run = nil
	c.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
	}
}

// Durable is the last revision of the cluster token that capture made
// durable in the store (0: none known yet); on is false when capture is
// off, so that compaction need not wait for it.
func (c *capturer) Durable(token string) (rev int64, on bool) {
	if !c.cfg.Enabled {
		return 0, false
	}
	c.mu.Lock()
	w := c.changes
	c.mu.Unlock()
	if w == nil {
		return 0, true
	}
	return w.DurableRevision(token), true
}

// RequestBase asks for a full backup for capture to start a run from:
// compaction went past what capture had stored.
func (c *capturer) RequestBase() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wantBase()
}

// captureClockErr says why this agent's clock is too far off its peers'
// or the store's for it to capture, or nil.
func (lp *loop) captureClockErr() error {
	limit := lp.cfg.Capture.MaxClockOffset
	if limit <= 0 {
		return nil
	}
	// Stores keep modification times to the second.
	if off, storeLimit := lp.storeOffset, limit+time.Second; off > storeLimit || off < -storeLimit {
		return fmt.Errorf("controller: the backup store's clock is %s off this agent's, more than %s (--capture-max-clock-offset and a second)", off.Round(time.Millisecond), storeLimit)
	}
	// Off most peers: this agent's clock is the one that is wrong. One
	// peer off among agreeing ones is that peer's problem, not ours.
	var off []string
	for _, id := range slices.Sorted(maps.Keys(lp.offsets)) {
		if d := lp.offsets[id]; d > limit || d < -limit {
			off = append(off, fmt.Sprintf("%s by %s", id, d.Round(time.Millisecond)))
		}
	}
	if 2*len(off) > len(lp.offsets) {
		return fmt.Errorf("controller: this agent's clock is off the clocks of %s (of %d peers), more than --capture-max-clock-offset=%s",
			strings.Join(off, ", "), len(lp.offsets), limit)
	}
	return nil
}
