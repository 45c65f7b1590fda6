package changelog

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Config configures continuous capture.
type Config struct {
	// Enabled turns capture on.
	Enabled bool
	// CutInterval is how often the segment being written is cut and made
	// durable; MaxSegmentBytes cuts it earlier.
	CutInterval     time.Duration
	MaxSegmentBytes int64
	// MaxSpoolBytes bounds the local spool of segments not yet uploaded.
	MaxSpoolBytes int64
	// LeasePollInterval is how often the leases are listed.
	LeasePollInterval time.Duration
	// MergeInterval is how often the capturing agent merges closed
	// windows of segments; MergeWindows are the windows of levels 1, 2...
	MergeInterval time.Duration
	MergeWindows  []time.Duration
	// DigestInterval is how often capture records a digest of every key
	// live at a revision it cut, read from etcd, for restores to check.
	DigestInterval time.Duration
	// MaxClockOffset bounds how far this agent's clock may be off its
	// peers' (or, by a second more, the store's) for it to capture: each
	// revision's time comes from the capturing agent's clock, and
	// --to-time is only as exact as that.
	MaxClockOffset time.Duration
}

// Default returns the defaults: capture on, a cut every 200ms.
func Default() Config {
	return Config{Enabled: true, CutInterval: 200 * time.Millisecond, MaxSegmentBytes: 4 << 20,
		MaxSpoolBytes: 1 << 30, LeasePollInterval: time.Second,
		MergeInterval: time.Minute, MergeWindows: DefaultMergeWindows, DigestInterval: 10 * time.Minute,
		MaxClockOffset: time.Second}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case c.CutInterval < 10*time.Millisecond || c.CutInterval > time.Minute:
		return fmt.Errorf("changelog: --capture-cut-interval %s is outside 10ms..1m", c.CutInterval)
	case c.MaxSegmentBytes < 64<<10:
		return fmt.Errorf("changelog: --capture-max-segment-bytes %d is under 64 KiB", c.MaxSegmentBytes)
	case c.MaxSpoolBytes < c.MaxSegmentBytes:
		return fmt.Errorf("changelog: --capture-max-spool-bytes %d is under one segment (%d)", c.MaxSpoolBytes, c.MaxSegmentBytes)
	case c.LeasePollInterval < 10*time.Millisecond:
		return fmt.Errorf("changelog: --capture-lease-poll-interval %s is under 10ms", c.LeasePollInterval)
	case c.MaxClockOffset <= 0:
		return fmt.Errorf("changelog: --capture-max-clock-offset %s must be positive", c.MaxClockOffset)
	case c.DigestInterval < 0:
		return fmt.Errorf("changelog: --capture-digest-interval %s is negative", c.DigestInterval)
	case c.MergeInterval < 0:
		return fmt.Errorf("changelog: --capture-merge-interval %s is negative", c.MergeInterval)
	case len(c.MergeWindows) > 9:
		return fmt.Errorf("changelog: --capture-merge-windows has %d levels; at most 9", len(c.MergeWindows))
	}
	for i, w := range c.MergeWindows {
		if w < time.Second || (i > 0 && w <= c.MergeWindows[i-1]) {
			return fmt.Errorf("changelog: --capture-merge-windows %v: each window must be at least 1s and longer than the one before", c.MergeWindows)
		}
	}
	return nil
}

// Errors that tell the caller what capture needs.
var (
	// ErrNeedBase means capture cannot continue from what the store holds
	// (nothing yet, or the next revision is compacted away): a full
	// backup must be taken, and capture starts a new run after it.
	ErrNeedBase = errors.New("changelog: capture needs a fresh full backup to start from")
	// ErrSpoolFull means the spool reached its bound: capture stopped.
	ErrSpoolFull = errors.New("changelog: capture spool is full")
	// ErrClockBehind means this agent's clock is further behind the last
	// time captured on the timeline than MaxClockOffset: its times would
	// put --to-time's boundaries in the wrong place, so it does not
	// capture until its clock agrees.
	ErrClockBehind = errors.New("changelog: this agent's clock is behind the last time captured on the timeline")
	// ErrRunEnded means a spooled segment of the run did not read and was
	// set aside: the run ends before it, and capture starts again from
	// the last revision the store holds whole (a new run after a fresh
	// backup, when etcd has compacted that away).
	ErrRunEnded = errors.New("changelog: a spooled segment was set aside; the run ends before it")
)

// Client is what capture needs of etcd.
type Client interface {
	// WatchStream opens a raw watch stream: capture reads etcd's
	// fragments of a large response one at a time, where clientv3's
	// watcher joins them into one response in memory first.
	WatchStream(ctx context.Context) (pb.Watch_WatchClient, error)
	Leases(ctx context.Context) (*clientv3.LeaseLeasesResponse, error)
	TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error)
	Ranger
}

// Etcd is a Client over a clientv3 client: its watch streams use the
// client's connection, with its endpoints, TLS and interceptors.
func Etcd(c *clientv3.Client) Client { return etcdClient{c} }

type etcdClient struct{ *clientv3.Client }

// WatchStream waits for a connection, as clientv3's watches do, and
// takes a message of any size, as clientv3 does: etcd's fragments are
// bounded by its --max-request-bytes, but a single event is sent whole.
func (c etcdClient) WatchStream(ctx context.Context) (pb.Watch_WatchClient, error) {
	return pb.NewWatchClient(c.ActiveConnection()).Watch(ctx, grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(math.MaxInt32))
}

// Status is capture's state, for metrics.
type Status struct {
	Running bool
	// Durable is the last revision in the store, DurableTime when
	// capture observed it.
	Durable     int64
	DurableTime time.Time
	SpoolBytes  int64
	SpoolFull   bool
	// Gaps counts the times capture had to start a new run; SetAside the
	// spooled segments that did not read and were set aside.
	Gaps     int
	SetAside int
}

// Capture writes segments: Run follows one member, Upload ships the
// spool. They share the spool directory and a status.
type Capture struct {
	Config
	Dir   string
	Store Store
	Log   *slog.Logger
	Now   func() time.Time
	// Keys, with a writing key, encrypt the segments uploaded.
	Keys *crypt.Keyring

	mu     sync.Mutex
	status Status
	// durable is the last revision in the store per timeline.
	durable map[string]int64
	// holes are, per timeline, the first revision of a spooled segment
	// set aside, until a run resumes before it; spoolMu orders the
	// spool's listings, so that no listing misses a hole another found.
	holes    map[string]int64
	holeWake chan struct{}
	spoolMu  sync.Mutex
	wake     chan struct{}
	lock     *os.File // held for the process's life
}

// ErrSpoolBusy means another process uses the spool directory.
var ErrSpoolBusy = errors.New("changelog: another process uses the capture spool")

// New returns a capture spooling into dir, which it locks for the
// process's life: two processes must never share a spool.
func New(cfg Config, dir string, s Store, log *slog.Logger) (*Capture, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("changelog: spool: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("changelog: spool: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("%w: %s is locked: %w", ErrSpoolBusy, dir, err)
	}
	if err := clearSpoolTemp(dir); err != nil {
		lock.Close()
		return nil, err
	}
	return &Capture{Config: cfg, Dir: dir, Store: s, Log: log, Now: time.Now, wake: make(chan struct{}, 1), holeWake: make(chan struct{}, 1), lock: lock}, nil
}

// DurableRevision is the last revision of timeline this capture made
// durable in the store since it was made, 0 if none: compaction up to the
// next one leaves a restarted capture nothing to miss.
func (c *Capture) DurableRevision(timeline string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.durable[timeline]
}

// noteDurable records that the store holds timeline up to rev: a segment
// ends there, or a full backup that a run starts after.
func (c *Capture) noteDurable(timeline string, rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.durable == nil {
		c.durable = map[string]int64{}
	}
	c.durable[timeline] = max(c.durable[timeline], rev)
}

// listSpool lists the spool. A segment that does not read is set aside,
// logged and counted, and ends its run there: every later segment of its
// timeline is set aside too, since its chain can never be whole in the
// store, and is not listed.
func (c *Capture) listSpool() ([]spooled, int64, error) {
	c.spoolMu.Lock()
	defer c.spoolMu.Unlock()
	segs, total, aside, err := readSpool(c.Dir)
	if err != nil {
		return nil, 0, err
	}
	c.mu.Lock()
	for _, a := range aside {
		c.status.SetAside++
		if a.Timeline == "" {
			continue
		}
		if c.holes == nil {
			c.holes = map[string]int64{}
		}
		if h, ok := c.holes[a.Timeline]; !ok || a.First < h {
			c.holes[a.Timeline] = a.First
		}
		select { // a follower that idles ends its run now
		case c.holeWake <- struct{}{}:
		default:
		}
	}
	holes := maps.Clone(c.holes)
	c.mu.Unlock()
	for _, a := range aside {
		c.Log.Error("a spooled segment does not read: it is set aside, and its run ends before it", "file", a.Path,
			"timeline", a.Timeline, "first-revision", a.First)
	}
	kept := segs[:0]
	orphaned := map[string]int{}
	for _, s := range segs {
		h, ok := holes[s.Header.Timeline]
		if !ok || s.Header.First < h {
			kept = append(kept, s)
			continue
		}
		if err := s.orphan(); err != nil {
			return nil, 0, err
		}
		total -= s.size()
		orphaned[s.Header.Timeline]++
	}
	for t, n := range orphaned {
		c.Log.Warn("spooled segments after one that does not read are set aside: their chain cannot be whole in the store",
			"timeline", t, "from-revision", holes[t], "segments", n)
	}
	return kept, total, nil
}

// hole is the first revision of a segment of timeline set aside, if any.
func (c *Capture) hole(timeline string) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.holes[timeline]
	return h, ok
}

// Status returns a copy of the current status.
func (c *Capture) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

func (c *Capture) update(f func(*Status)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.status)
}

func (c *Capture) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Point is where a timeline's capture stands: its last revision and
// chain value, from the spool or the store.
type Point struct {
	Revision int64
	Chain    []byte
	// Time is when the revision was captured, in unix nanoseconds (0:
	// unknown): the times a writer goes on with never go back before it.
	Time int64
}

// runStart is the point a run after base starts from.
func runStart(timeline string, base *Base) Point {
	chain, _ := hex.DecodeString(RunStart(timeline, base.Revision))
	return Point{Revision: base.Revision, Chain: chain}
}

// Resume finds the last revision of timeline held in the spool or the
// store; ok is false when there is none.
func (c *Capture) Resume(ctx context.Context, timeline string) (Point, bool, error) {
	var p Point
	found := false
	segs, _, err := c.listSpool()
	if err != nil {
		return p, false, err
	}
	for _, s := range segs {
		if s.Header.Timeline == timeline && s.Header.Last > p.Revision {
			p, found = point(s.Header), true
		}
	}
	refs, err := List(ctx, c.Store, timeline)
	if err != nil {
		return p, false, err
	}
	if len(refs) > 0 {
		h, err := ReadHeaderAt(ctx, c.Store, refs[len(refs)-1].Key)
		if err != nil {
			return p, false, err
		}
		// The newest by first revision may be a short one of a writer that
		// overlapped an older, longer one: look a little further back.
		for i := len(refs) - 2; i >= 0 && refs[i].First > h.First-resumeLookBack; i-- {
			if o, err := ReadHeaderAt(ctx, c.Store, refs[i].Key); err == nil && o.Last > h.Last {
				h = o
			}
		}
		c.noteDurable(timeline, h.Last)
		if h.Last > p.Revision {
			p, found = point(h), true
		}
	}
	return p, found, nil
}

// resumeLookBack is how many revisions before the newest segment Resume
// looks for a longer one that overlaps it.
const resumeLookBack = 1000

func point(h Header) Point {
	chain, _ := hex.DecodeString(h.Chain)
	return Point{Revision: h.Last, Chain: chain, Time: h.LastTime}
}

// Run follows client's changes on timeline into the spool until ctx
// ends or the watch fails. It continues after the last captured
// revision; when there is none, or it is compacted away, it starts a run
// after base (the newest full backup of the timeline), and returns
// ErrNeedBase when base is nil or also compacted away.
func (c *Capture) Run(ctx context.Context, cl Client, timeline string, base *Base) error {
	if !ValidTimeline(timeline) {
		return fmt.Errorf("changelog: capture: %q is not a cluster token", timeline)
	}
	c.update(func(s *Status) { s.Running = true })
	defer c.update(func(s *Status) { s.Running = false })
	return c.run(ctx, cl, timeline, base)
}

func (c *Capture) run(ctx context.Context, cl Client, timeline string, base *Base) error {
	at, found, err := c.Resume(ctx, timeline)
	if err != nil {
		return err
	}
	// Resume listed no segment at or after a hole: this run rewrites
	// those revisions from etcd, or starts after a fresh backup.
	c.mu.Lock()
	if h, ok := c.holes[timeline]; ok && at.Revision < h {
		delete(c.holes, timeline)
		c.Log.Warn("capture resumes before a spooled segment that was set aside", "timeline", timeline, "from-revision", at.Revision+1, "set-aside-from", h)
	}
	c.mu.Unlock()
	// Continue after the last captured revision, even when a full backup
	// is newer, so that the history between stays reachable; the watch
	// says if it is compacted away.
	var runBase *Base
	if !found {
		if base == nil {
			return fmt.Errorf("%w: timeline %s has no full backup yet", ErrNeedBase, timeline)
		}
		at, runBase = runStart(timeline, base), base
		c.noteDurable(timeline, base.Revision)
	}
	err = c.follow(ctx, cl, timeline, at, runBase)
	var compacted *compactedError
	if errors.As(err, &compacted) {
		if runBase == nil && base != nil && base.Revision+1 >= compacted.rev {
			c.Log.Warn("capture cannot continue: the next revision is compacted; starting a new run after the newest full backup",
				"timeline", timeline, "next-revision", at.Revision+1, "compacted-to", compacted.rev, "backup", base.Backup, "gap-to", base.Revision)
			c.update(func(s *Status) { s.Gaps++ })
			c.noteDurable(timeline, base.Revision)
			next := runStart(timeline, base)
			next.Time = at.Time // the timeline's times go on from its last
			return c.follow(ctx, cl, timeline, next, base)
		}
		c.update(func(s *Status) { s.Gaps++ })
		return fmt.Errorf("%w: revision %d of timeline %s is compacted (etcd is compacted to %d)", ErrNeedBase, at.Revision+1, timeline, compacted.rev)
	}
	return err
}

type compactedError struct{ rev int64 }

func (e *compactedError) Error() string {
	return fmt.Sprintf("changelog: the watch start is compacted (compacted to revision %d)", e.rev)
}

// follow watches from after at and spools what it sees.
func (c *Capture) follow(ctx context.Context, cl Client, timeline string, at Point, base *Base) error {
	ctx, cancel := context.WithCancel(ctx)
	f := &follower{c: c, cl: cl, timeline: timeline, chain: at.Chain, last: at.Revision, lastTime: at.Time, base: base, known: map[int64]bool{},
		digests: make(chan digestResult, 1), nextDigest: c.Now()}
	defer f.abandon()
	defer func() {
		cancel() // a running digest stops too
		f.waitDigest()
	}()
	tick := time.NewTicker(c.CutInterval)
	defer tick.Stop()
	poll := time.NewTicker(c.LeasePollInterval)
	defer poll.Stop()
	behind := make(chan time.Time, 1)
	if err := f.pollLeases(ctx); err != nil {
		return err
	}
	c.Log.Info("capture started", "timeline", timeline, "from-revision", at.Revision+1, "new-run", base != nil)
	defer f.quiet.close()
	var brokeAt time.Time // the first of consecutive broken watches
	for {
		caughtUp, err := f.catchUp(ctx)
		if errors.Is(err, errWatchBroke) && ctx.Err() == nil {
			// A member that restarts or loses its leader breaks the
			// watch: what was taken is cut, and the next pass watches
			// again, through any endpoint, for a while.
			if brokeAt.IsZero() {
				brokeAt = time.Now()
			}
			if time.Since(brokeAt) < watchRetryFor {
				c.Log.Debug("capture's watch broke; watching again", "timeline", timeline, "after-revision", f.last, "error", err)
				if err := f.cut(); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(watchRetryDelay):
				}
				continue
			}
		}
		if err != nil {
			return err
		}
		brokeAt = time.Time{}
		if err := f.cut(); err != nil {
			return err
		}
		if h, ok := c.hole(timeline); ok && h <= f.last {
			return fmt.Errorf("%w: timeline %s, a segment from revision %d; capture is at %d", ErrRunEnded, timeline, h, f.last)
		}
		f.maybeDigest(ctx)
		next := tick.C
		switch {
		case !caughtUp: // behind still: the next pass starts at once
			behind <- time.Time{}
			next = behind
		case f.quiet.ch != nil: // nothing new: the next pass starts with the next change
			next = nil
		}
		if err := f.idle(ctx, next, poll.C); err != nil {
			return err
		}
	}
}

// idle records finished digests and polls leases until next fires or,
// while a quiet pass's watch stays open, until that watch has news. A
// digest that falls due meanwhile starts then: a cluster that goes quiet
// after a burst of writes still gets a digest of the burst's last
// revision, which the next change's segment carries.
func (f *follower) idle(ctx context.Context, next, poll <-chan time.Time) error {
	due := time.NewTimer(time.Hour)
	defer due.Stop()
	for {
		due.Stop()
		var dueC <-chan time.Time
		if f.c.DigestInterval > 0 && !f.digestRunning && f.last > f.digestRev {
			due.Reset(max(f.nextDigest.Sub(f.c.Now()), 0))
			dueC = due.C
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-next:
			return nil
		case <-dueC:
			f.maybeDigest(ctx)
		case m, ok := <-f.quiet.ch:
			f.quiet.pending, f.quiet.closed = &m, !ok
			return nil
		case <-f.c.holeWake:
			if h, ok := f.c.hole(f.timeline); ok && h <= f.last {
				return fmt.Errorf("%w: timeline %s, a segment from revision %d; capture is at %d", ErrRunEnded, f.timeline, h, f.last)
			}
		case d := <-f.digests:
			if err := f.digested(d); err != nil {
				return err
			}
		case <-poll:
			err := f.pollLeases(ctx)
			switch {
			case err == nil:
				f.pollFailedAt = time.Time{}
			case !errors.Is(err, errLeasesUnlisted) || ctx.Err() != nil:
				return err
			default:
				// etcd restarts, or has no leader: no lease changes
				// meanwhile, and the next poll learns what changed.
				if f.pollFailedAt.IsZero() {
					f.pollFailedAt = time.Now()
				}
				if time.Since(f.pollFailedAt) >= watchRetryFor {
					return err
				}
				f.c.Log.Debug("capture cannot list leases; trying again at the next poll", "timeline", f.timeline, "error", err)
			}
		}
	}
}

// errLeasesUnlisted is a failed listing of the leases: idle tries again
// at each poll for up to watchRetryFor before the run ends with it.
var errLeasesUnlisted = errors.New("changelog: capture: list leases")

// catchUp reads every revision after the last one captured up to etcd's
// current revision, from a watch opened for this pass alone, and reports
// whether it got there. A watch that stays open costs etcd and the agent
// one message per transaction, about 0.13ms of agent CPU each on a
// loaded 2-core machine (benchmark capture-overhead). A watch that
// starts behind is served in batches of up to 1000 revisions, from
// etcd's sync loop (every 100ms): one message per pass when capture
// keeps up. That also bounds how fast capture reads, to about 10,000
// revisions a second: a cluster written faster for long leaves capture
// behind until the rate drops (compaction then waits, up to
// --compaction-capture-wait). A pass ends after CutInterval once it has taken a revision,
// so that a long backlog is cut into segments as it goes; before that,
// it waits for etcd's next sync rather than start over.
//
// A pass that finds nothing new keeps its watch open (f.quiet) rather
// than open another every CutInterval: an idle cluster costs nothing
// that way, and its next change starts the next pass at once, on that
// watch. A pass that takes a revision closes its watch, as above.
func (f *follower) catchUp(ctx context.Context) (bool, error) {
	wch, cancel, pending := f.quiet.take()
	if wch == nil {
		wch, cancel = f.openWatch(ctx, f.last+1)
	}
	deadline := time.NewTimer(f.c.CutInterval)
	defer deadline.Stop()
	// inFragments is set between the fragments of one response, which a
	// pass takes whole: a cut inside it would make etcd scan the whole
	// backlog again for the next watch.
	from, expired, inFragments := f.last, false, false
	done := func(caughtUp bool) (bool, error) {
		if caughtUp && f.last == from && pending == nil {
			f.quiet.keep(wch, cancel)
		} else {
			cancel()
			f.split = nil // the next watch starts at its revision again
		}
		return caughtUp, nil
	}
	fail := func(err error) (bool, error) {
		cancel()
		f.split = nil
		return false, err
	}
	for {
		var m watchMsg
		ok := true
		// The message a quiet watch held comes before any that follow it.
		next := wch
		if pending != nil {
			next = nil
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-deadline.C:
			expired = true
			if f.last > from && !inFragments {
				return done(false)
			}
			continue
		case m, ok = <-pending:
			pending = nil
		case m, ok = <-next:
		}
		if ctx.Err() != nil {
			return fail(ctx.Err()) // the stream's own error is the cancel's
		}
		if !ok {
			return fail(fmt.Errorf("%w: it closed", errWatchBroke))
		}
		if m.err != nil {
			return fail(fmt.Errorf("%w: %w", errWatchBroke, m.err))
		}
		resp := m.resp
		if resp.CompactRevision > 0 { // the watch start is compacted away
			return fail(&compactedError{rev: resp.CompactRevision})
		}
		if resp.Canceled {
			return fail(fmt.Errorf("changelog: capture: etcd cancelled the watch: %s", resp.CancelReason))
		}
		if err := f.events(ctx, resp.Events, resp.Fragment); err != nil {
			return fail(err)
		}
		if f.w != nil && f.w.header.BodySize >= f.c.MaxSegmentBytes {
			if err := f.cut(); err != nil {
				return fail(err)
			}
		}
		if inFragments = resp.Fragment; inFragments {
			continue // the rest of the response follows
		}
		// The header holds etcd's revision when it sent the response:
		// every revision up to it has been sent, in this response or
		// an earlier one.
		if resp.Header != nil && resp.Header.Revision <= f.last {
			return done(true)
		}
		if expired && f.last > from {
			return done(false)
		}
	}
}

// errWatchBroke is a watch stream that failed or ended: the next pass
// opens another from the last revision taken, every watchRetryDelay for
// up to watchRetryFor, after which the run ends with the error.
var errWatchBroke = errors.New("changelog: capture: the watch broke")

const (
	watchRetryDelay = 500 * time.Millisecond
	watchRetryFor   = 30 * time.Second
)

// watchMsg is one message of a watch stream, or the error that ended it.
type watchMsg struct {
	resp *pb.WatchResponse
	err  error
}

// openWatch watches every key from revision rev on a stream of its own,
// asking etcd to fragment large responses: a watch that starts behind is
// served up to 1000 revisions in one response, which fragments keep to
// etcd's --max-request-bytes a message. The messages arrive on the
// channel, one at a time as they are taken, and the one after an error
// closes it; cancel ends the stream.
func (f *follower) openWatch(ctx context.Context, rev int64) (<-chan watchMsg, context.CancelFunc) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	ch := make(chan watchMsg)
	go func() {
		defer close(ch)
		send := func(m watchMsg) bool {
			select {
			case ch <- m:
				return true
			case <-wctx.Done():
				return false
			}
		}
		stream, err := f.cl.WatchStream(wctx)
		if err != nil {
			send(watchMsg{err: err})
			return
		}
		req := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
			Key: []byte{0}, RangeEnd: []byte{0}, StartRevision: rev, Fragment: true}}}
		if err := stream.Send(req); err != nil {
			send(watchMsg{err: err})
			return
		}
		for {
			resp, err := stream.Recv()
			if !send(watchMsg{resp: resp, err: err}) || err != nil {
				return
			}
		}
	}()
	return ch, cancel
}

// quietWatch is the watch of a pass that found nothing new, kept open
// until its next message, which idle holds for the next pass.
type quietWatch struct {
	ch      <-chan watchMsg
	cancel  context.CancelFunc
	pending *watchMsg
	closed  bool // the watch closed instead of sending a message
}

func (q *quietWatch) keep(ch <-chan watchMsg, cancel context.CancelFunc) {
	q.ch, q.cancel = ch, cancel
}

// take hands the kept watch, its cancel and its message, as a channel
// holding it (closed if the watch closed), to a pass. It returns nils
// when no watch is kept or it has no message yet, which closes it.
func (q *quietWatch) take() (<-chan watchMsg, context.CancelFunc, <-chan watchMsg) {
	if q.pending == nil && !q.closed {
		q.close()
		return nil, nil, nil
	}
	p := make(chan watchMsg, 1)
	if q.closed {
		close(p)
	} else {
		p <- *q.pending
	}
	ch, cancel := q.ch, q.cancel
	*q = quietWatch{}
	return ch, cancel, p
}

func (q *quietWatch) close() {
	if q.cancel != nil {
		q.cancel()
	}
	*q = quietWatch{}
}

// follower is one run's state.
type follower struct {
	c        *Capture
	cl       Client
	timeline string
	quiet    quietWatch
	w        *segmentWriter
	chain    []byte
	last     int64
	// lastTime is the capture time of last: a revision's time is never
	// before it, even when this agent's clock is behind the writer's
	// before it, so that times are monotonic on the timeline.
	lastTime  int64
	clockBack bool  // said once per follower
	base      *Base // set until the run's first segment is cut
	known     map[int64]bool
	rec       Record
	split     []*mvccpb.Event // a revision a fragment split, until its rest arrives
	// pollFailedAt is the first of consecutive failed lease polls.
	pollFailedAt time.Time

	// A digest runs beside the watch: one at a time, every
	// DigestInterval.
	digests       chan digestResult
	digestRunning bool
	nextDigest    time.Time
	digestRev     int64 // the last revision a digest was started at
}

type digestResult struct {
	rev    int64
	digest Digest
	err    error
}

// maybeDigest starts a digest of the last cut revision when one is due.
func (f *follower) maybeDigest(ctx context.Context) {
	if f.c.DigestInterval <= 0 || f.digestRunning || f.c.Now().Before(f.nextDigest) || f.last <= f.digestRev {
		return
	}
	f.digestRunning, f.nextDigest, f.digestRev = true, f.c.Now().Add(f.c.DigestInterval), f.last
	rev := f.last
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		d, err := DigestAt(dctx, f.cl, rev)
		f.digests <- digestResult{rev: rev, digest: d, err: err}
	}()
}

// digested records a finished digest in the segment being written.
func (f *follower) digested(d digestResult) error {
	f.digestRunning = false
	if d.err != nil {
		f.c.Log.Warn("capture could not take a digest; restores check the next one", "revision", d.rev, "error", d.err)
		return nil
	}
	w, err := f.writer()
	if err != nil {
		return err
	}
	return w.add(Record{Kind: KindDigest, Revision: d.rev, Digest: d.digest})
}

// waitDigest waits for a running digest, so none outlives the follower.
func (f *follower) waitDigest() {
	if f.digestRunning {
		<-f.digests
	}
}

func (f *follower) writer() (*segmentWriter, error) {
	if f.w != nil {
		return f.w, nil
	}
	// Upload keeps the spool's size current: cut adds, an upload
	// subtracts, and every upload pass counts it afresh.
	total := f.c.Status().SpoolBytes
	if total >= f.c.MaxSpoolBytes {
		f.c.update(func(s *Status) { s.SpoolFull = true })
		return nil, fmt.Errorf("%w: %d bytes of segments wait for the store in %s (bound %d)", ErrSpoolFull, total, f.c.Dir, f.c.MaxSpoolBytes)
	}
	f.c.update(func(s *Status) { s.SpoolFull = false })
	w, err := newSegmentWriter(f.c.Dir, f.timeline, f.chain, f.last+1, f.base)
	if err != nil {
		return nil, err
	}
	f.w = w
	return w, nil
}

// events spools one watch message: whole revisions, as etcd sends them.
// A fragment (more set) may end inside a revision: its events wait in
// f.split for the rest, which the next message brings.
func (f *follower) events(ctx context.Context, evs []*mvccpb.Event, more bool) error {
	if len(f.split) > 0 {
		evs = append(f.split, evs...)
		f.split = nil
	}
	for i := 0; i < len(evs); {
		rev := evs[i].Kv.ModRevision
		j := i
		for j < len(evs) && evs[j].Kv.ModRevision == rev {
			j++
		}
		if j == len(evs) && more {
			f.split = slices.Clone(evs[i:])
			return nil
		}
		if err := f.revision(ctx, rev, evs[i:j]); err != nil {
			return err
		}
		i = j
	}
	return nil
}

func (f *follower) revision(ctx context.Context, rev int64, evs []*mvccpb.Event) error {
	w, err := f.writer()
	if err != nil {
		return err
	}
	r := &f.rec
	now := f.c.Now().UnixNano()
	if behind := time.Duration(f.lastTime - now); behind > f.c.MaxClockOffset && f.c.MaxClockOffset > 0 {
		return fmt.Errorf("%w: by %s, more than --capture-max-clock-offset=%s (timeline %s, revision %d)", ErrClockBehind, behind.Round(time.Millisecond),
			f.c.MaxClockOffset, f.timeline, rev)
	}
	if now < f.lastTime && !f.clockBack {
		f.clockBack = true
		f.c.Log.Warn("this agent's clock is a little behind the time capture last wrote on the timeline; revisions take that time until the clock passes it",
			"timeline", f.timeline, "behind", time.Duration(f.lastTime-now).String())
	}
	f.lastTime = max(now, f.lastTime)
	*r = Record{Kind: KindRevision, Revision: rev, Time: f.lastTime, Events: r.Events[:0]}
	for _, ev := range evs {
		var kv *mvccpb.KeyValue
		if ev.Type == mvccpb.DELETE {
			kv = &mvccpb.KeyValue{Key: ev.Kv.Key}
		} else {
			kv = ev.Kv
			if kv.Lease != 0 && !f.known[kv.Lease] {
				if err := f.learnLease(ctx, kv.Lease); err != nil {
					return err
				}
			}
		}
		v, err := proto.Marshal(kv)
		if err != nil {
			return fmt.Errorf("changelog: capture: encode revision %d: %w", rev, err)
		}
		r.Events = append(r.Events, Event{Tombstone: ev.Type == mvccpb.DELETE, Value: v})
	}
	if err := w.add(*r); err != nil {
		return err
	}
	f.last, f.chain = rev, w.chain
	return nil
}

// learnLease records a lease first seen on a key, before that key.
func (f *follower) learnLease(ctx context.Context, id int64) error {
	w, err := f.writer()
	if err != nil {
		return err
	}
	ttl := int64(-1)
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	resp, err := f.cl.TimeToLive(tctx, clientv3.LeaseID(id))
	cancel()
	if err == nil && resp.TTL >= 0 {
		ttl = resp.GrantedTTL
	}
	f.known[id] = true
	return w.add(Record{Kind: KindGrant, Revision: f.last, Lease: id, TTL: ttl})
}

// pollLeases records leases granted since the last poll (from the
// current position: possibly early, never late) and those gone (by the
// poll's revision: possibly late, never early), so that every key live
// at a point has its lease.
func (f *follower) pollLeases(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := f.cl.Leases(pctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errLeasesUnlisted, err)
	}
	w, err := f.writer()
	if err != nil {
		return err
	}
	now := map[int64]bool{}
	for _, l := range resp.Leases {
		id := int64(l.ID)
		now[id] = true
		if f.known[id] {
			continue
		}
		t, err := f.cl.TimeToLive(pctx, l.ID)
		if err != nil || t.TTL < 0 {
			continue // gone already
		}
		f.known[id] = true
		if err := w.add(Record{Kind: KindGrant, Revision: f.last, Lease: id, TTL: t.GrantedTTL}); err != nil {
			return err
		}
	}
	for id := range f.known {
		if !now[id] {
			delete(f.known, id)
			if err := w.add(Record{Kind: KindRevoke, Revision: max(resp.GetRevision(), f.last), Lease: id}); err != nil {
				return err
			}
		}
	}
	return nil
}

// cut makes the open segment durable, if it holds a revision.
func (f *follower) cut() error {
	if f.w == nil || !f.w.revision {
		return nil
	}
	h, err := f.w.cut()
	f.w = nil
	if err != nil {
		return err
	}
	f.base = nil
	f.c.update(func(s *Status) { s.SpoolBytes += h.BodySize })
	f.c.poke()
	return nil
}

// abandon drops the open segment: what it held is captured again by the
// next run, which starts after the last cut revision.
func (f *follower) abandon() {
	if f.w != nil {
		f.w.abandon()
		f.w = nil
	}
}

// Upload ships the spool to the store, oldest first, until ctx ends.
// Every agent runs it, leading or not, so a former leader's spool still
// lands.
func (c *Capture) Upload(ctx context.Context) {
	retry := time.Second
	for {
		err := c.UploadOnce(ctx)
		wake := c.wake
		wait := time.Second
		if err != nil && ctx.Err() == nil {
			c.Log.Warn("capture upload failed; segments stay in the spool", "error", err, "retry-in", retry)
			wait, retry = retry, min(retry*2, 30*time.Second)
			// A new cut does not cut the back-off short: during an
			// outage, cuts come every CutInterval. It stays pending.
			wake = nil
		} else {
			retry = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-time.After(wait):
		}
	}
}

// UploadOnce uploads every segment in the spool.
func (c *Capture) UploadOnce(ctx context.Context) error {
	segs, total, err := c.listSpool()
	if err != nil {
		return err
	}
	c.update(func(s *Status) { s.SpoolBytes = total })
	for _, s := range segs {
		size := s.size()
		for {
			err := c.upload(ctx, s)
			var conflict *conflictError
			if !errors.As(err, &conflict) {
				if err != nil {
					return err
				}
				break
			}
			next, left, err := trimSpooled(c.Dir, s, conflict.existing.Last, conflict.existing.Chain)
			if err != nil {
				return err
			}
			if !left {
				break
			}
			s = next
		}
		c.update(func(st *Status) { st.SpoolBytes = max(st.SpoolBytes-size, 0) })
	}
	return nil
}

type conflictError struct{ existing Header }

func (e *conflictError) Error() string {
	return fmt.Sprintf("changelog: another writer's segment holds revisions %d to %d", e.existing.First, e.existing.Last)
}

// upload writes one spooled segment create-once. When another writer's
// segment holds its name, it is dropped if that one covers it, or a
// conflictError says where to trim it.
func (c *Capture) upload(ctx context.Context, s spooled) error {
	key := KeyOf(s.Header)
	r, err := s.object(c.Keys)
	if err != nil {
		return err
	}
	err = c.Store.CreateFrom(ctx, key, r)
	r.Close()
	if errors.Is(err, store.ErrExists) {
		existing, rerr := ReadHeaderAt(ctx, c.Store, key)
		if rerr != nil {
			return rerr
		}
		if existing.Last < s.Header.Last {
			return &conflictError{existing: existing}
		}
		if existing.Last == s.Header.Last && existing.Chain != s.Header.Chain {
			return fmt.Errorf("%w: %s in the store and this agent's spool disagree about revisions %d to %d", ErrCorrupt, key, s.Header.First, s.Header.Last)
		}
		c.Log.Info("segment already in the store, from another writer", "key", key)
		err = nil
	}
	if err != nil {
		return fmt.Errorf("changelog: upload %s: %w", key, err)
	}
	if err := s.remove(); err != nil {
		return err
	}
	// Durable only with its whole chain in the store: a segment that
	// does not follow on from what is known durable (nor starts a run)
	// leaves a hole before it.
	if prev := c.DurableRevision(s.Header.Timeline); s.Header.Base == nil && prev > 0 && s.Header.First > prev+1 {
		c.Log.Error("a segment uploaded does not follow on from the last durable revision: revisions between are missing from the store", "key", key,
			"durable-revision", prev, "first-revision", s.Header.First)
		return nil
	}
	c.update(func(st *Status) {
		if s.Header.Last > st.Durable {
			st.Durable, st.DurableTime = s.Header.Last, time.Unix(0, s.Header.LastTime)
		}
	})
	c.noteDurable(s.Header.Timeline, s.Header.Last)
	return nil
}
