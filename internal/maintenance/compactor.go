package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

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

// checkTimeout bounds one compaction check: etcd's status and the
// compaction.
const checkTimeout = 10 * time.Second

// Compactor carries out the compaction policy on the agent that leads
// etcd, beside capture; plan.PlanCompaction decides each step. It belongs
// to the loop's goroutine.
type Compactor struct {
	cfg CompactionConfig
	log *slog.Logger
	now func() time.Time
	// token is the cluster the samples and the rest are of.
	token     string
	samples   []plan.RevisionSample
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

	met compactorMetrics
}

// NewCompactor returns a compactor with its metrics registered on reg.
func NewCompactor(cfg CompactionConfig, log *slog.Logger, now func() time.Time, reg prometheus.Registerer) *Compactor {
	return &Compactor{cfg: cfg, log: log, now: now, quota: spec.DefaultQuotaBytes, met: newCompactorMetrics(reg)}
}

// CompactionClient is the part of etcd's client a compaction check uses.
type CompactionClient interface {
	// Status returns etcd's head revision and the bytes its database
	// has in use.
	Status(ctx context.Context) (head, dbInUse int64, err error)
	Compact(ctx context.Context, rev int64) error
}

// CaptureFloor says what capture has made durable, when it runs.
type CaptureFloor interface {
	Durable(token string) (rev int64, on bool)
	// RequestBase asks capture for a full backup to start a new run
	// from, after compaction went past it.
	RequestBase()
}

// maxSamples bounds the samples a periodic policy keeps.
const maxSamples = 1024

// Tend runs one compaction check when one is due and lead is set (this
// agent leads etcd, and has a client to it), through cl.
func (c *Compactor) Tend(ctx context.Context, obs plan.Observed, lead bool, cl CompactionClient, cf CaptureFloor) {
	if !lead || obs.Cluster == nil {
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
	if c.now().Sub(c.lastCheck) < c.sampleEvery(policy) {
		return
	}
	c.lastCheck = c.now()
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	c.check(cctx, cl, cf, policy)
}

// Compacted records that etcd was compacted to rev by another path (a
// recovery of space), so that the policy does not ask for it again.
func (c *Compactor) Compacted(rev int64) { c.compacted = max(c.compacted, rev) }

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
func (c *Compactor) sampleEvery(p spec.CompactionPolicy) time.Duration {
	return max(c.cfg.Interval, p.Period/maxSamples)
}

// reset forgets what was learnt of another cluster.
func (c *Compactor) reset(token string) {
	c.token, c.samples, c.compacted, c.lastCheck = token, nil, 0, time.Time{}
	c.idle()
}

// idle is the state while this agent does not compact: nothing held, and
// a wait for capture starts afresh.
func (c *Compactor) idle() {
	c.heldSince, c.lastCaptured = time.Time{}, 0
	c.met.held.Set(0)
	c.met.revision.Set(0)
}

func (c *Compactor) check(ctx context.Context, cl CompactionClient, cf CaptureFloor, policy spec.CompactionPolicy) {
	now := c.now()
	head, dbInUse, err := cl.Status(ctx)
	if err != nil {
		c.log.Warn("compaction check: cannot read etcd's status", "error", err)
		return
	}
	c.samples = append(c.samples, plan.RevisionSample{At: now, Rev: head})
	// Keep the newest sample at least the period old, and those after.
	for len(c.samples) > 1 && !c.samples[1].At.After(now.Add(-policy.Period)) {
		c.samples = c.samples[1:]
	}
	if len(c.samples) > maxSamples {
		c.samples = c.samples[len(c.samples)-maxSamples:]
	}
	captured, captureOn := cf.Durable(c.token)
	// Capture that makes progress is not stalled, however far behind:
	// the wait for it starts again.
	progressed := captured > c.lastCaptured
	if progressed && !c.heldSince.IsZero() {
		c.heldSince = now
	}
	c.lastCaptured = captured
	p := plan.PlanCompaction(plan.CompactionInput{Policy: policy, Now: now, Head: head, Compacted: c.compacted, Samples: c.samples,
		Capture: captureOn, Captured: captured, Stalled: !progressed, HeldSince: c.heldSince, CaptureWait: c.cfg.CaptureWait,
		DBInUse: dbInUse, Quota: c.quota, QuotaShare: c.cfg.QuotaShare})
	switch {
	case !p.Held || p.Overtake != "":
		c.heldSince = time.Time{}
	case c.heldSince.IsZero():
		c.heldSince = now
		c.log.Info("compaction waits for continuous capture", "cluster-token", c.token, "policy-revision", p.Wanted, "captured-revision", captured)
	}
	setBool(c.met.held, p.Held && p.Overtake == "")
	if p.Revision == 0 {
		return
	}
	err = cl.Compact(ctx, p.Revision)
	if errors.Is(err, rpctypes.ErrCompacted) {
		// A client compacted as far already: nothing went past capture
		// by this agent's doing.
		c.compacted = p.Revision
		c.log.Info("etcd was compacted this far already, by a client", "cluster-token", c.token, "revision", p.Revision)
		return
	}
	if err != nil {
		c.met.compactions.WithLabelValues("error").Inc()
		c.log.Warn("compaction failed; trying again at the next check", "cluster-token", c.token, "revision", p.Revision, "error", err)
		return
	}
	c.met.compactions.WithLabelValues("ok").Inc()
	c.compacted = p.Revision
	c.met.revision.Set(float64(p.Revision))
	if p.Overtake != "" {
		c.met.overtaken.Inc()
		cf.RequestBase()
		c.log.Warn("compaction went past continuous capture: availability wins; a full backup follows, and a restore cannot reach the revisions capture had not stored",
			"cluster-token", c.token, "revision", p.Revision, "captured-revision", captured, "reason", p.Overtake)
		return
	}
	c.log.Info("compacted etcd", "cluster-token", c.token, "revision", p.Revision, "policy", policy.String(), "held-by-capture", p.Held)
}
