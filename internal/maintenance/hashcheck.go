package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// HashChecker compares the voting members' HashKV at one revision for the
// leader (plan.CheckHashes); the planner judges the result. Create it with
// NewHashChecker.
type HashChecker struct {
	log *slog.Logger
	now func() time.Time
	met hashMetrics
}

// NewHashChecker returns a hash checker whose metrics reg takes.
func NewHashChecker(log *slog.Logger, now func() time.Time, reg prometheus.Registerer) *HashChecker {
	return &HashChecker{log: log, now: now, met: newHashMetrics(reg)}
}

// HashEtcd is what a comparison asks of the leader's etcd client.
type HashEtcd interface {
	etcdproc.Statuser
	etcdproc.HashKVer
}

// DataHasher hashes the data of n, a member whose etcd is kept stopped
// (a failed initial check), at rev (0: its newest), through its agent.
type DataHasher func(ctx context.Context, n plan.Node, rev int64) (peer.DataHash, error)

// HashJob is one comparison.
type HashJob struct {
	Act plan.CheckHashes
	Obs plan.Observed
	// Etcd is the leader's client, and Endpoint the leader's own URL, at
	// whose current revision the members are compared.
	Etcd     HashEtcd
	Endpoint string
	Data     DataHasher
}

// Check asks every voting member for its HashKV at the leader's current
// revision; a member still behind that revision is asked again for a few
// seconds. Members whose etcd is kept stopped are hashed from their data,
// at a revision their data holds: the comparison goes no further than the
// one furthest behind. It returns the hashes, and the record of the
// comparison for the status.
func (h *HashChecker) Check(ctx context.Context, job HashJob) (*plan.HashCheck, peer.HashCheckRecord, error) {
	started := h.now()
	st, err := etcdproc.AskStatus(ctx, job.Etcd, job.Endpoint)
	if err != nil {
		return nil, peer.HashCheckRecord{}, fmt.Errorf("maintenance: hash check: etcd status: %w", err)
	}
	obs := job.Obs
	r := &plan.HashCheck{Revision: st.Header.Revision, Hashes: map[uint64]plan.MemberHash{}}
	offline := map[uint64]plan.Node{}
	for _, m := range obs.Cluster.Members {
		if m.IsLearner || m.Healthy {
			continue
		}
		n, ok := plan.NodeOfMember(obs, m)
		if !ok || !n.InitialCheckFailed {
			continue
		}
		offline[m.ID] = n
		dh, err := job.Data(ctx, n, 0)
		if err != nil {
			h.met.checks.WithLabelValues("inconclusive").Inc()
			return nil, peer.HashCheckRecord{}, fmt.Errorf("maintenance: hash check: the data of %s: %w", m.Name, err)
		}
		r.Revision = min(r.Revision, dh.CurrentRevision)
	}
	for _, m := range obs.Cluster.Members {
		if m.IsLearner {
			continue
		}
		var mh plan.MemberHash
		var err error
		switch n, ok := offline[m.ID]; {
		case ok:
			var dh peer.DataHash
			dh, err = job.Data(ctx, n, r.Revision)
			mh = plan.MemberHash{Hash: dh.Hash, CompactRevision: dh.CompactRevision}
		case len(m.ClientURLs) == 0:
			continue
		default:
			mh, err = memberHash(ctx, job.Etcd, m.ClientURLs[0], r.Revision)
		}
		if err != nil {
			h.met.checks.WithLabelValues("inconclusive").Inc()
			return nil, peer.HashCheckRecord{}, fmt.Errorf("maintenance: hash check: HashKV of %s at revision %d: %w", m.Name, r.Revision, err)
		}
		r.Hashes[m.ID] = mh
	}
	h.met.disagreement.Set(0)
	if v := plan.JudgeHashes(r, obs.Cluster.Members); v.NoMajority() {
		h.met.disagreement.Set(1)
	}
	outcome := "agree"
	seen := map[plan.MemberHash]bool{}
	for _, mh := range r.Hashes {
		seen[mh] = true
	}
	if len(seen) > 1 {
		outcome = "mismatch"
	}
	h.met.checks.WithLabelValues(outcome).Inc()
	rec := peer.HashCheckRecord{At: started.UTC(), Revision: r.Revision, Outcome: outcome}
	if outcome == "agree" {
		h.met.lastAgree.Set(float64(h.now().Unix()))
		h.log.Info("the voting members' HashKV agree", "revision", r.Revision, "members", len(r.Hashes), "reason", job.Act.Reason)
	} else {
		h.log.Warn("the voting members' HashKV differ", "revision", r.Revision, "hashes", fmt.Sprint(r.Hashes), "reason", job.Act.Reason)
	}
	return r, rec, nil
}

// memberHash is a member's HashKV at rev, asked again while the member
// has not applied rev yet.
func memberHash(ctx context.Context, c etcdproc.HashKVer, endpoint string, rev int64) (plan.MemberHash, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := etcdproc.HashKV(ctx, c, endpoint, rev)
		if err == nil {
			return plan.MemberHash{Hash: resp.Hash, CompactRevision: resp.CompactRevision}, nil
		}
		if !errors.Is(err, rpctypes.ErrFutureRev) || time.Now().After(deadline) {
			return plan.MemberHash{}, err
		}
		select {
		case <-ctx.Done():
			return plan.MemberHash{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
