package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// hashResultFresh is how long a comparison's result is acted on: a later
// alarm, or a change of members, needs a new one.
const hashResultFresh = time.Minute

// hashCheck is the leader's schedule of HashKV comparisons and its last
// result, handed to the planner once.
type hashCheck struct {
	last   time.Time
	result *plan.HashCheck
	// recheck asks for a comparison at once: a member resumed after its
	// initial check failed, and the verdict that resumed it named a
	// minority still to set aside.
	recheck bool
	// checked is set once this agent compared the hashes (last is also
	// set when it begins to lead, to wait out the first interval).
	checked bool
}

// checkHashes asks every voting member for its HashKV at the leader's
// current revision. A member still behind that revision is asked again
// for a few seconds. The result is observed next cycle.
func (lp *loop) checkHashes(ctx context.Context, obs plan.Observed, act plan.CheckHashes) error {
	c, err := lp.members.leader(ctx)
	if err != nil {
		return err
	}
	lp.hash.last, lp.hash.checked = lp.now(), true
	lp.hash.recheck = false
	st, err := etcdproc.AskStatus(ctx, c, lp.clientEndpoint)
	if err != nil {
		return fmt.Errorf("controller: hash check: etcd status: %w", err)
	}
	r := &plan.HashCheck{Revision: st.Header.Revision, Hashes: map[uint64]plan.MemberHash{}}
	// Members whose etcd is kept stopped (a failed initial check) are
	// hashed from their data, at a revision their data holds: the
	// comparison goes no further than the one that is furthest behind.
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
		h, err := lp.dataHash(ctx, obs, n, 0)
		if err != nil {
			lp.met.hashChecks.WithLabelValues("inconclusive").Inc()
			return fmt.Errorf("controller: hash check: the data of %s: %w", m.Name, err)
		}
		r.Revision = min(r.Revision, h.CurrentRevision)
	}
	for _, m := range obs.Cluster.Members {
		if m.IsLearner {
			continue
		}
		var h plan.MemberHash
		var err error
		switch n, ok := offline[m.ID]; {
		case ok:
			var dh peer.DataHash
			dh, err = lp.dataHash(ctx, obs, n, r.Revision)
			h = plan.MemberHash{Hash: dh.Hash, CompactRevision: dh.CompactRevision}
		case len(m.ClientURLs) == 0:
			continue
		default:
			h, err = memberHash(ctx, lp.client, m.ClientURLs[0], r.Revision)
		}
		if err != nil {
			lp.met.hashChecks.WithLabelValues("inconclusive").Inc()
			return fmt.Errorf("controller: hash check: HashKV of %s at revision %d: %w", m.Name, r.Revision, err)
		}
		r.Hashes[m.ID] = h
	}
	lp.hash.result = r
	lp.met.dataDisagreement.Set(0)
	if v := plan.JudgeHashes(r, obs.Cluster.Members); v.NoMajority() {
		lp.met.dataDisagreement.Set(1)
	}
	outcome := "agree"
	seen := map[plan.MemberHash]bool{}
	for _, h := range r.Hashes {
		seen[h] = true
	}
	if len(seen) > 1 {
		outcome = "mismatch"
	}
	lp.met.hashChecks.WithLabelValues(outcome).Inc()
	lp.maint.LastHashCheck = &peer.HashCheckRecord{At: lp.hash.last.UTC(), Revision: r.Revision, Outcome: outcome}
	if outcome == "agree" {
		lp.met.hashCheckLast.Set(float64(lp.now().Unix()))
		lp.log.Info("the voting members' HashKV agree", "revision", r.Revision, "members", len(r.Hashes), "reason", act.Reason)
		return nil
	}
	lp.log.Warn("the voting members' HashKV differ", "revision", r.Revision, "hashes", fmt.Sprint(r.Hashes), "reason", act.Reason)
	return nil
}

// dataHash asks the agent of n, whose etcd is kept stopped, for the HashKV
// of its data at rev (0: its newest).
func (lp *loop) dataHash(ctx context.Context, obs plan.Observed, n plan.Node, rev int64) (peer.DataHash, error) {
	var h peer.DataHash
	err := lp.members.call(ctx, n, func(ctx context.Context, api memberAPI) error {
		var err error
		h, err = api.HashData(ctx, peer.HashDataRequest{LeaderID: lp.members.selfID, Token: obs.Cluster.Token, Revision: rev})
		return err
	})
	return h, err
}

// resumeMember has a member whose initial check failed, and whose data
// the majority's agrees with, start etcd without that check; the minority
// is compared again once it serves.
func (lp *loop) resumeMember(ctx context.Context, obs plan.Observed, act plan.ResumeMember) error {
	if _, err := lp.members.leader(ctx); err != nil {
		return err
	}
	n, err := plan.FindNode(obs.Peers, act.NodeID)
	if err != nil {
		return err
	}
	lp.log.Warn("a member whose initial corruption check failed holds the majority's data: it starts again without the check",
		"node", act.NodeID, "member", fmt.Sprintf("%x", act.MemberID), "reason", act.Reason)
	err = lp.members.call(ctx, n, func(ctx context.Context, api memberAPI) error {
		return api.Resume(ctx, peer.ResumeRequest{LeaderID: lp.members.selfID, Token: obs.Cluster.Token, MemberID: act.MemberID, Reason: act.Reason})
	})
	if err != nil {
		return err
	}
	lp.hash.recheck = true
	return nil
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

// discardMemberData has a member's node set its data aside: its HashKV
// disagreed with the majority's. The lost-data rule then rebuilds it.
func (lp *loop) discardMemberData(ctx context.Context, obs plan.Observed, act plan.DiscardMemberData) error {
	if _, err := lp.members.leader(ctx); err != nil {
		return err
	}
	n, err := plan.FindNode(obs.Peers, act.NodeID)
	if err != nil {
		return err
	}
	lp.log.Error("a member's data disagrees with the majority's: setting it aside to rebuild the member from its peers",
		"node", act.NodeID, "member", fmt.Sprintf("%x", act.MemberID), "reason", act.Reason)
	err = lp.members.call(ctx, n, func(ctx context.Context, api memberAPI) error {
		return api.DiscardData(ctx, peer.DiscardRequest{LeaderID: lp.members.selfID, Token: obs.Cluster.Token, MemberID: act.MemberID, Reason: act.Reason})
	})
	if err != nil {
		return err
	}
	lp.hash.result = nil // judged; the next comparison is a new one
	lp.met.corruptDiscarded.Inc()
	lp.maint.LastDiscard = &peer.DiscardRecord{Node: act.NodeID, At: lp.now().UTC(), Reason: act.Reason}
	return nil
}

// disarmCorrupt disarms etcd's CORRUPT alarms: the members they name are
// gone, or every member's data agrees.
func (lp *loop) disarmCorrupt(ctx context.Context, act plan.DisarmCorrupt) error {
	if err := lp.disarmAlarms(ctx, act.MemberIDs, etcdserverpb.AlarmType_CORRUPT); err != nil {
		return err
	}
	lp.hash.result = nil
	lp.log.Warn("etcd's CORRUPT alarm disarmed: the cluster takes requests again", "members", fmt.Sprintf("%x", act.MemberIDs), "reason", act.Reason)
	return nil
}
