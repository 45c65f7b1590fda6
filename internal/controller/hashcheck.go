package controller

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcd-manager/etcd-manager/internal/maintenance"
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

// checkHashes has the members' HashKV compared at the leader's current
// revision (see maintenance.HashChecker). The result is observed next
// cycle.
func (lp *loop) checkHashes(ctx context.Context, obs plan.Observed, act plan.CheckHashes) error {
	c, err := lp.members.Leader(ctx)
	if err != nil {
		return err
	}
	lp.hash.last, lp.hash.checked = lp.now(), true
	lp.hash.recheck = false
	r, rec, err := lp.hasher.Check(ctx, maintenance.HashJob{Act: act, Obs: obs, Etcd: c, Endpoint: lp.clientEndpoint,
		Data: func(ctx context.Context, n plan.Node, rev int64) (peer.DataHash, error) {
			return lp.members.HashData(ctx, obs, n, rev)
		}})
	if err != nil {
		return err
	}
	lp.hash.result = r
	lp.maint.LastHashCheck = &rec
	return nil
}

// resumeMember has a member whose initial check failed, and whose data
// the majority's agrees with, start etcd without that check; the minority
// is compared again once it serves.
func (lp *loop) resumeMember(ctx context.Context, obs plan.Observed, act plan.ResumeMember) error {
	if err := lp.members.Resume(ctx, obs, act); err != nil {
		return err
	}
	lp.hash.recheck = true
	return nil
}

// discardMemberData has a member's node set its data aside: its HashKV
// disagreed with the majority's. The lost-data rule then rebuilds it.
func (lp *loop) discardMemberData(ctx context.Context, obs plan.Observed, act plan.DiscardMemberData) error {
	if err := lp.members.DiscardData(ctx, obs, act); err != nil {
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
