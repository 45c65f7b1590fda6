package capture

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

// Capturer runs continuous capture beside the control loop: the upload of
// the spool always (so a former leader's segments still land), and the
// capture itself while this agent leads the cluster, on its own etcd.
type Capturer struct {
	cfg changelog.Config
	log *slog.Logger
	now func() time.Time
	dir string
	url string
	// Keys encrypt the segments uploaded and merged, and decrypt those
	// merged; set before Upload runs.
	Keys *crypt.Keyring

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

// New returns the capturer of a node whose data dir is dataDir (its
// spool is dataDir/capture), for the store at url; its metrics reg takes.
func New(cfg changelog.Config, dataDir, url string, log *slog.Logger, now func() time.Time, reg prometheus.Registerer) *Capturer {
	c := &Capturer{cfg: cfg, log: log, now: now, dir: filepath.Join(dataDir, "capture"), url: url}
	c.register(reg)
	return c
}

// Upload opens the store and ships the spool until ctx ends.
func (c *Capturer) Upload(ctx context.Context) {
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
			w.Keys = c.Keys
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

// NeedsBase reports whether capture waits for a full backup to start a
// run from.
func (c *Capturer) NeedsBase() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.needBase
}

// wantBase records that capture needs a full backup taken from now on to
// go on from. Callers hold c.mu.
func (c *Capturer) wantBase() {
	if !c.needBase {
		c.needBaseSince = c.now()
	}
	c.needBase = true
}

// BaseStored records that the store holds a full backup of this
// agent's cluster begun at: one another agent took (the driver of a
// restore, say) serves as the base as well as one of this agent's own.
// Backup times are whole seconds, so one begun in the same second as
// the need counts; should it be too old after all, capture says so again.
func (c *Capturer) BaseStored(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.needBase && !at.Before(c.needBaseSince.Truncate(time.Second)) {
		c.needBase = false
	}
}

// BackedUp records that a full backup was just taken.
func (c *Capturer) BackedUp() {
	c.mu.Lock()
	defer c.mu.Unlock()
	// The retry backoff stays: a capture that keeps failing must not
	// turn into a stream of backups.
	c.needBase = false
}

// Follow captures the cluster token through its endpoints while want
// holds, and stops otherwise or when they change. Capture starts at once
// from the newest full backup it can find, even when another is due (a
// new lock holder's first), so that the revisions until that backup stay
// reachable; when it finds none, it waits quietly for the due one.
func (c *Capturer) Follow(want bool, token string, endpoints []string, tlsCfg *tls.Config, backupDue bool) {
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
func (c *Capturer) capture(ctx context.Context, r *captureRun, w *changelog.Capture, s *store.Store, tlsCfg *tls.Config) {
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

func (c *Capturer) captureOnce(ctx context.Context, r *captureRun, w *changelog.Capture, s *store.Store, tlsCfg *tls.Config) error {
	base, err := newestBackup(ctx, s, r.token, c.now())
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
func (c *Capturer) merge(ctx context.Context, s *store.Store, token string) {
	if c.cfg.MergeInterval <= 0 || len(c.cfg.MergeWindows) == 0 {
		return
	}
	m := &changelog.Merger{Store: s, Dir: filepath.Join(c.dir, "merge"), Windows: c.cfg.MergeWindows, Log: c.log, Keys: c.Keys}
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

// newestBackup is the newest full backup of the cluster token, or nil;
// one dated after now (and the skew allowed) is no base.
func newestBackup(ctx context.Context, s *store.Store, token string, now time.Time) (*changelog.Base, error) {
	in, err := backup.Newest(ctx, s, backup.Want{Token: token, NotAfter: now.Add(spec.FutureSkew)})
	if err != nil || in == nil {
		return nil, err
	}
	return &changelog.Base{Backup: in.Name, Revision: changelog.SnapshotRevision(in.Meta.Revision)}, nil
}

// Stop ends capture and waits for it.
func (c *Capturer) Stop() {
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
func (c *Capturer) Durable(token string) (rev int64, on bool) {
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
func (c *Capturer) RequestBase() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wantBase()
}
