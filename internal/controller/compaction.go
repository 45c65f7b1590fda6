package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// CompactionConfig is how the agent leading etcd carries out the spec's
// compaction policy.
type CompactionConfig struct {
	// Interval is the time between checks: each reads etcd's revision,
	// and compacts when the policy and capture allow.
	Interval time.Duration
	// CaptureWait is how long continuous capture may hold compaction
	// back before availability wins and compaction goes past it.
	CaptureWait time.Duration
	// QuotaShare is the share of the backend quota (the spec's
	// quota-backend-bytes, else etcd's default) the database's bytes in
	// use may reach while a stalled capture holds compaction back; above
	// it compaction goes past capture at once.
	QuotaShare float64
}

// Compaction defaults.
const (
	DefaultCompactionInterval    = 5 * time.Minute
	DefaultCompactionCaptureWait = 10 * time.Minute
	DefaultCompactionQuotaShare  = 0.5
)

// DefaultCompactionConfig returns the defaults.
func DefaultCompactionConfig() CompactionConfig {
	return CompactionConfig{Interval: DefaultCompactionInterval, CaptureWait: DefaultCompactionCaptureWait, QuotaShare: DefaultCompactionQuotaShare}
}

// Validate reports every problem with the compaction settings.
func (c CompactionConfig) Validate() []error {
	var errs []error
	if c.Interval < time.Second {
		errs = append(errs, errors.New("--compaction-interval must be at least 1s"))
	}
	if c.CaptureWait < 0 {
		errs = append(errs, errors.New("--compaction-capture-wait must not be negative"))
	}
	if c.QuotaShare <= 0 || c.QuotaShare > 1 {
		errs = append(errs, fmt.Errorf("--compaction-quota-share %g must be above 0 and at most 1", c.QuotaShare))
	}
	return errs
}

// revisionSample is etcd's head revision as seen at a time.
type revisionSample struct {
	At  time.Time
	Rev int64
}

// compactionInput is what a compaction decision rests on.
type compactionInput struct {
	Policy spec.CompactionPolicy
	Now    time.Time
	// Head is etcd's revision now; Compacted the revision this agent last
	// compacted it to (0: not yet).
	Head, Compacted int64
	// Samples are head revisions seen, oldest first: a periodic policy
	// compacts to the newest at least Policy.Period old.
	Samples []revisionSample
	// Capture is set when continuous capture runs: compaction keeps at or
	// below Captured+1, the last revision capture made durable in the
	// store (0: none known yet), unless capture has made no progress
	// since HeldSince for CaptureWait, or it is Stalled (no progress
	// since the last check) while the database's bytes in use (DBInUse)
	// reach QuotaShare of Quota.
	Capture     bool
	Captured    int64
	Stalled     bool
	HeldSince   time.Time
	CaptureWait time.Duration
	DBInUse     int64
	Quota       int64
	QuotaShare  float64
}

// compactionPlan is a compaction decision.
type compactionPlan struct {
	// Revision is the revision to compact to; 0 for none.
	Revision int64
	// Wanted is the revision the policy asks for.
	Wanted int64
	// Held is set when capture holds Wanted back.
	Held bool
	// Overtake says why compaction goes past capture, when it does.
	Overtake string
}

// planCompaction decides whether, and how far, to compact.
func planCompaction(in compactionInput) compactionPlan {
	var p compactionPlan
	switch {
	case in.Policy.Period > 0:
		for _, s := range in.Samples {
			if s.At.After(in.Now.Add(-in.Policy.Period)) {
				break
			}
			p.Wanted = s.Rev
		}
	case in.Policy.Revisions > 0:
		p.Wanted = in.Head - in.Policy.Revisions
	}
	p.Wanted = min(p.Wanted, in.Head)
	if p.Wanted <= in.Compacted {
		return compactionPlan{}
	}
	floor := in.Captured + 1
	if !in.Capture || p.Wanted <= floor {
		p.Revision = p.Wanted
		return p
	}
	p.Held = true
	switch {
	case in.Stalled && in.Quota > 0 && float64(in.DBInUse) >= in.QuotaShare*float64(in.Quota):
		p.Overtake = fmt.Sprintf("capture is stalled and the database's %d bytes in use reach %.0f%% of its %d-byte quota", in.DBInUse, 100*float64(in.DBInUse)/float64(in.Quota), in.Quota)
	case !in.HeldSince.IsZero() && in.Now.Sub(in.HeldSince) >= in.CaptureWait:
		p.Overtake = fmt.Sprintf("capture has made no progress for %s", in.Now.Sub(in.HeldSince).Round(time.Second))
	}
	if p.Overtake != "" {
		p.Revision = p.Wanted
		return p
	}
	if floor > in.Compacted && in.Captured > 0 {
		p.Revision = min(floor, in.Head)
	}
	return p
}

// compactor carries out the compaction policy on the agent that leads
// etcd, beside capture. It belongs to the loop's goroutine.
type compactor struct {
	cfg CompactionConfig
	log *slog.Logger
	now func() time.Time
	// token is the cluster the samples and the rest are of.
	token     string
	samples   []revisionSample
	compacted int64
	// heldSince is when capture, holding compaction back, last made
	// progress; lastCaptured what it had stored at the last check.
	heldSince    time.Time
	lastCaptured int64
	lastCheck    time.Time
	// policy is the spec's policy as last read, kept through a store
	// outage or a spec that cannot be read.
	policy     spec.CompactionPolicy
	havePolicy bool
	// quota is the backend quota as last read: the spec's, or the one
	// this agent's member still runs with when that is smaller.
	quota int64

	revision    prometheus.Gauge
	held        prometheus.Gauge
	overtaken   prometheus.Counter
	compactions *prometheus.CounterVec
}

func newCompactor(cfg CompactionConfig, log *slog.Logger, now func() time.Time, reg prometheus.Registerer) *compactor {
	c := &compactor{
		cfg:   cfg,
		log:   log,
		now:   now,
		quota: spec.DefaultQuotaBytes,
		revision: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_compaction_revision",
			Help: "The revision this agent last compacted etcd to, while it leads etcd."}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_compaction_held_by_capture",
			Help: "1 while continuous capture holds compaction back: the policy asks for more than capture has made durable in the store."}),
		overtaken: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_compaction_overtook_capture_total",
			Help: "Times compaction went past what capture had made durable in the store (capture lagged too long, or the database neared its quota); each is followed by a full backup."}),
		compactions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "etcd_manager_compactions_total",
			Help: "Compactions this agent asked etcd for, by result."}, []string{"result"}),
	}
	reg.MustRegister(c.revision, c.held, c.overtaken, c.compactions)
	return c
}

// compactionClient is the part of etcd's client a compaction check uses.
type compactionClient interface {
	// status returns etcd's head revision and the bytes its database
	// has in use.
	status(ctx context.Context) (head, dbInUse int64, err error)
	compact(ctx context.Context, rev int64) error
}

// captureFloor says what capture has made durable, when it runs.
type captureFloor interface {
	durable(token string) (rev int64, on bool)
	requestBase()
}

// maxSamples bounds the samples a periodic policy keeps.
const maxSamples = 1024

// compact runs one compaction check when one is due, on the agent that
// leads etcd.
func (lp *loop) compact(ctx context.Context, obs plan.Observed) {
	c := lp.compaction
	lead := obs.Cluster != nil && obs.Self.Member != nil && !obs.Self.Member.Quarantined && lp.client != nil
	if !lead {
		// The samples stay: they are facts about the cluster, and a
		// moment without leadership must not restart a period.
		c.idle()
		return
	}
	if c.token != obs.Cluster.Token {
		c.reset(obs.Cluster.Token)
	}
	// The last policy read holds while the store is unreachable or the
	// spec unreadable: compaction goes on through a long outage.
	if obs.Spec != nil {
		if policy, err := obs.Spec.Compaction(); err == nil {
			if !c.havePolicy || policy != c.policy {
				c.log.Info("compaction policy", "cluster-token", c.token, "policy", policy.String())
			}
			c.policy, c.havePolicy = policy, true
		}
		c.quota = backendQuota(*obs.Spec, obs.Self.Member)
	}
	if !c.havePolicy || c.policy.Off() {
		c.idle()
		return
	}
	policy := c.policy
	if lp.now().Sub(c.lastCheck) < c.sampleEvery(policy) {
		return
	}
	c.lastCheck = lp.now()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c.check(cctx, etcdCompaction{lp}, lp.capture, policy)
}

// backendQuota is the backend quota that binds member under the spec s:
// the spec's, or the one the member still runs with when that is smaller
// (a quota the spec raised binds only once the roll has restarted the
// member with it).
func backendQuota(s spec.ClusterSpec, member *plan.Membership) int64 {
	q := s.QuotaBytes()
	if member != nil {
		q = min(q, member.Settings.QuotaBytes())
	}
	return q
}

// sampleEvery is the time between checks: the configured interval, or
// longer so that a long period keeps at most maxSamples.
func (c *compactor) sampleEvery(p spec.CompactionPolicy) time.Duration {
	return max(c.cfg.Interval, p.Period/maxSamples)
}

// reset forgets what was learnt of another cluster.
func (c *compactor) reset(token string) {
	c.token, c.samples, c.compacted, c.lastCheck = token, nil, 0, time.Time{}
	c.idle()
}

// idle is the state while this agent does not compact: nothing held, and
// a wait for capture starts afresh.
func (c *compactor) idle() {
	c.heldSince, c.lastCaptured = time.Time{}, 0
	c.held.Set(0)
	c.revision.Set(0)
}

func (c *compactor) check(ctx context.Context, cl compactionClient, cf captureFloor, policy spec.CompactionPolicy) {
	now := c.now()
	head, dbInUse, err := cl.status(ctx)
	if err != nil {
		c.log.Warn("compaction check: cannot read etcd's status", "error", err)
		return
	}
	c.samples = append(c.samples, revisionSample{At: now, Rev: head})
	// Keep the newest sample at least the period old, and those after.
	for len(c.samples) > 1 && !c.samples[1].At.After(now.Add(-policy.Period)) {
		c.samples = c.samples[1:]
	}
	if len(c.samples) > maxSamples {
		c.samples = c.samples[len(c.samples)-maxSamples:]
	}
	captured, captureOn := cf.durable(c.token)
	// Capture that makes progress is not stalled, however far behind:
	// the wait for it starts again.
	progressed := captured > c.lastCaptured
	if progressed && !c.heldSince.IsZero() {
		c.heldSince = now
	}
	c.lastCaptured = captured
	p := planCompaction(compactionInput{Policy: policy, Now: now, Head: head, Compacted: c.compacted, Samples: c.samples,
		Capture: captureOn, Captured: captured, Stalled: !progressed, HeldSince: c.heldSince, CaptureWait: c.cfg.CaptureWait,
		DBInUse: dbInUse, Quota: c.quota, QuotaShare: c.cfg.QuotaShare})
	switch {
	case !p.Held || p.Overtake != "":
		c.heldSince = time.Time{}
	case c.heldSince.IsZero():
		c.heldSince = now
		c.log.Info("compaction waits for continuous capture", "cluster-token", c.token, "policy-revision", p.Wanted, "captured-revision", captured)
	}
	boolGauge(c.held, p.Held && p.Overtake == "")
	if p.Revision == 0 {
		return
	}
	err = cl.compact(ctx, p.Revision)
	if errors.Is(err, rpctypes.ErrCompacted) {
		// A client compacted as far already: nothing went past capture
		// by this agent's doing.
		c.compacted = p.Revision
		c.log.Info("etcd was compacted this far already, by a client", "cluster-token", c.token, "revision", p.Revision)
		return
	}
	if err != nil {
		c.compactions.WithLabelValues("error").Inc()
		c.log.Warn("compaction failed; trying again at the next check", "cluster-token", c.token, "revision", p.Revision, "error", err)
		return
	}
	c.compactions.WithLabelValues("ok").Inc()
	c.compacted = p.Revision
	c.revision.Set(float64(p.Revision))
	if p.Overtake != "" {
		c.overtaken.Inc()
		cf.requestBase()
		c.log.Warn("compaction went past continuous capture: availability wins; a full backup follows, and a restore cannot reach the revisions capture had not stored",
			"cluster-token", c.token, "revision", p.Revision, "captured-revision", captured, "reason", p.Overtake)
		return
	}
	c.log.Info("compacted etcd", "cluster-token", c.token, "revision", p.Revision, "policy", policy.String(), "held-by-capture", p.Held)
}

// etcdCompaction compacts through the loop's client to its own etcd.
type etcdCompaction struct{ lp *loop }

func (e etcdCompaction) status(ctx context.Context) (int64, int64, error) {
	resp, err := etcdproc.MemberStatusOf(ctx, e.lp.client, e.lp.clientEndpoint)
	if err != nil {
		return 0, 0, fmt.Errorf("controller: etcd status: %w", err)
	}
	// Compaction frees pages for reuse; only a defragmentation shrinks
	// the file, so the bytes in use are what compaction can help.
	inUse := resp.DbSizeInUse
	if inUse == 0 {
		inUse = resp.DbSize
	}
	return resp.Header.Revision, inUse, nil
}

func (e etcdCompaction) compact(ctx context.Context, rev int64) error {
	if _, err := e.lp.client.Compact(ctx, rev); err != nil {
		return fmt.Errorf("controller: compact to %d: %w", rev, err)
	}
	return nil
}
