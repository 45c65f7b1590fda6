package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// hashTimeout bounds one member's HashKV: it reads the member's whole
// keyspace.
const hashTimeout = 2 * time.Minute

// hashResultFresh is how long a comparison's result is acted on: a later
// alarm, or a change of members, needs a new one.
const hashResultFresh = time.Minute

// hashCheck is the leader's schedule of HashKV comparisons and its last
// result, handed to the planner once.
type hashCheck struct {
	last   time.Time
	result *plan.HashCheck
}

// checkHashes asks every voting member for its HashKV at the leader's
// current revision. A member still behind that revision is asked again
// for a few seconds. The result is observed next cycle.
func (lp *loop) checkHashes(ctx context.Context, obs plan.Observed, act plan.CheckHashes) error {
	c, err := lp.members.leader(ctx)
	if err != nil {
		return err
	}
	lp.hash.last = lp.now()
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	st, err := c.Status(sctx, lp.clientEndpoint)
	cancel()
	if err != nil {
		return fmt.Errorf("controller: hash check: etcd status: %w", err)
	}
	r := &plan.HashCheck{Revision: st.Header.Revision, Hashes: map[uint64]plan.MemberHash{}}
	for _, m := range obs.Cluster.Members {
		if m.IsLearner || len(m.ClientURLs) == 0 {
			continue
		}
		h, err := memberHash(ctx, lp.client, m.ClientURLs[0], r.Revision)
		if err != nil {
			lp.met.hashChecks.WithLabelValues("inconclusive").Inc()
			return fmt.Errorf("controller: hash check: HashKV of %s at revision %d: %w", m.Name, r.Revision, err)
		}
		r.Hashes[m.ID] = h
	}
	lp.hash.result = r
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

// hashKVer is the part of the etcd client a hash check needs.
type hashKVer interface {
	HashKV(ctx context.Context, endpoint string, rev int64) (*clientv3.HashKVResponse, error)
}

// memberHash is a member's HashKV at rev, asked again while the member
// has not applied rev yet.
func memberHash(ctx context.Context, c hashKVer, endpoint string, rev int64) (plan.MemberHash, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		hctx, cancel := context.WithTimeout(ctx, hashTimeout)
		resp, err := c.HashKV(hctx, endpoint, rev)
		cancel()
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
