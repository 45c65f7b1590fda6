package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// defragTimeout bounds one member's defragmentation: etcd rewrites its
// whole database, about a second per few hundred MiB on a slow disk.
const defragTimeout = 10 * time.Minute

// isolatedDefragRetry is how long a node whose isolated defragmentation
// failed is defragmented in place instead.
const isolatedDefragRetry = time.Hour

// defragger is what an isolated defragmentation asks of a member's node,
// this agent's own or a peer.
type defragger interface {
	Defrag(ctx context.Context, req peer.DefragRequest) (peer.DefragResult, error)
}

// defrag defragments one member, which is not the raft leader: the
// leader hands leadership on before its own turn. In place, the leader
// asks the member's etcd; isolated, the member's agent stops its etcd
// and defragments the database offline (see node.Defrag).
func (lp *loop) defrag(ctx context.Context, obs plan.Observed, act plan.DefragMember) error {
	c, err := lp.members.leader(ctx)
	if err != nil {
		return err
	}
	// This agent's etcd leads (checked just now), so another member's
	// does not; its own is defragmented only when it is the only voter.
	if act.MemberID == obs.Self.MemberID && voters(obs) > 1 {
		return fmt.Errorf("controller: defrag %s: its member leads raft; leadership is handed on first", act.NodeID)
	}
	s, err := lp.openStore(ctx)
	if err != nil && len(act.CommandIDs) > 0 {
		return err
	}
	mode := "in place"
	if act.Isolate {
		mode = "isolated"
	}
	lp.log.Info("defragmenting a member", "node", act.NodeID, "mode", mode, "reason", act.Reason)
	start := lp.now()
	var before, after int64
	if act.Isolate {
		var res peer.DefragResult
		res, err = lp.defragIsolated(ctx, obs, act)
		before, after = res.SizeBefore, res.SizeAfter
	} else {
		before = memberDBSize(ctx, c, act.ClientURL)
		dctx, cancel := context.WithTimeout(ctx, defragTimeout)
		_, err = c.Defragment(dctx, act.ClientURL)
		cancel()
		if err == nil {
			after = memberDBSize(ctx, c, act.ClientURL)
		}
	}
	took := lp.now().Sub(start)
	if err != nil {
		lp.met.defrags.WithLabelValues("failure").Inc()
		return fmt.Errorf("controller: defrag %s %s: %w", act.NodeID, mode, err)
	}
	lp.met.defrags.WithLabelValues("success").Inc()
	lp.met.defragLastOK.Set(float64(lp.now().Unix()))
	lp.met.defragLastDuration.Set(took.Seconds())
	if before > 0 && after > 0 {
		lp.met.defragLastReclaimed.Set(float64(max(before-after, 0)))
	}
	lp.maint.LastDefrag = &peer.DefragRecord{Node: act.NodeID, At: start.UTC(), Duration: took, SizeBefore: before, SizeAfter: after, Isolated: act.Isolate}
	lp.log.Info("member defragmented", "node", act.NodeID, "mode", mode, "duration", took.Round(time.Millisecond), "db-size-before", before, "db-size-after", after)
	for _, c := range obs.Commands {
		if !slices.Contains(act.CommandIDs, c.ID) {
			continue
		}
		done := slices.Clone(c.Status.Defragmented)
		if !slices.Contains(done, act.NodeID) {
			done = append(done, act.NodeID)
		}
		st := spec.CommandStatus{State: spec.CommandRunning, Message: "defragmenting one member at a time", Defragmented: done}
		if err := s.SetCommandStatus(ctx, c.ID, st, lp.now()); err != nil {
			return err
		}
	}
	return nil
}

// defragIsolated has the member's agent defragment its database offline,
// its etcd stopped meanwhile. The cluster has one voter fewer for that
// long, so the leader watches the others throughout (see watchOthers):
// should one stop answering, the member's agent is told to stop, and its
// etcd starts again on the database as it was. Another failure turns the
// member to defragmentation in place for isolatedDefragRetry.
func (lp *loop) defragIsolated(ctx context.Context, obs plan.Observed, act plan.DefragMember) (peer.DefragResult, error) {
	n, err := plan.FindNode(obs.Peers, act.NodeID)
	if err != nil {
		return peer.DefragResult{}, err
	}
	api, err := lp.callee(n)
	if err != nil {
		return peer.DefragResult{}, err
	}
	dctx, cancel := context.WithTimeout(ctx, defragTimeout)
	defer cancel()
	wctx, stop := context.WithCancelCause(dctx)
	defer stop(nil)
	probes := lp.othersStatus(obs, act.MemberID) // the loop's connections: made here, not in the goroutine
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watchOthers(wctx, probes, defragWatchInterval, stop)
	}()
	res, err := api.Defrag(wctx, peer.DefragRequest{LeaderID: lp.members.selfID, Token: obs.Cluster.Token, MemberID: act.MemberID, InUseBytes: act.InUseBytes})
	stop(nil)
	<-watched
	if err == nil {
		lp.isolatedDefragDone(act.NodeID)
		return res, nil
	}
	if cause := context.Cause(wctx); errors.Is(cause, errClusterDegraded) {
		lp.isolatedDefragStopped(act.NodeID, cause)
		return res, fmt.Errorf("controller: defrag %s stopped: %w", act.NodeID, cause)
	}
	lp.isolatedDefragInPlace(act.NodeID, err)
	return res, err
}

// isolatedDefragDone ends node's run of stopped isolated
// defragmentations.
func (lp *loop) isolatedDefragDone(node string) {
	delete(lp.defragStops, node)
}

// isolatedDefragStopped counts a stop of node's isolated defragmentation
// for a degraded cluster. A member that keeps stopping the copy (one that
// flaps, or answers too slowly) would have this one restarted for
// nothing, round after round: after maxDefragStops in a row, the node is
// defragmented in place for isolatedDefragRetry.
func (lp *loop) isolatedDefragStopped(node string, cause error) {
	if lp.defragStops == nil {
		lp.defragStops = map[string]int{}
	}
	lp.defragStops[node]++
	lp.log.Warn("isolated defragmentation stopped: another member stopped answering; the member serves again on its database as it was",
		"node", node, "stops-in-a-row", lp.defragStops[node], "error", cause)
	if lp.defragStops[node] >= maxDefragStops {
		delete(lp.defragStops, node)
		lp.isolatedDefragInPlace(node, fmt.Errorf("stopped %d times in a row: %w", maxDefragStops, cause))
	}
}

// maxDefragStops is how many isolated defragmentations of a node in a
// row may be stopped for a degraded cluster before it is defragmented in
// place for isolatedDefragRetry instead.
const maxDefragStops = 3

// isolatedDefragInPlace has node be defragmented in place, not
// isolated, for isolatedDefragRetry.
func (lp *loop) isolatedDefragInPlace(node string, why error) {
	if lp.isolatedDefragFailed == nil {
		lp.isolatedDefragFailed = map[string]time.Time{}
	}
	lp.isolatedDefragFailed[node] = lp.now()
	lp.log.Warn("isolated defragmentation failed: the member is defragmented in place for a while instead",
		"node", node, "for", isolatedDefragRetry, "error", why)
}

// defragWatchInterval is how often the leader reads the other voters'
// status while a member is defragmented offline; defragWatchTimeout
// bounds each read, and defragWatchMisses reads in a row that one voter
// fails stop the defragmentation.
const (
	defragWatchInterval = 500 * time.Millisecond
	defragWatchTimeout  = time.Second
	defragWatchMisses   = 2
)

// errClusterDegraded is the cause of an isolated defragmentation stopped
// because another voter stopped answering.
var errClusterDegraded = errors.New("controller: the cluster degraded during an isolated defragmentation")

// errNoLeader is a probe's answer from a member that sees no raft leader.
var errNoLeader = errors.New("controller: the member sees no raft leader")

// memberProbe reads one member's status.
type memberProbe func(ctx context.Context) error

// othersStatus are probes of every voter but member id: the members an
// isolated defragmentation of id leaves to keep quorum.
func (lp *loop) othersStatus(obs plan.Observed, id uint64) map[string]memberProbe {
	probes := map[string]memberProbe{}
	if obs.Cluster == nil {
		return probes
	}
	for _, m := range obs.Cluster.Members {
		if m.ID == id || m.IsLearner || len(m.ClientURLs) == 0 {
			continue
		}
		url := m.ClientURLs[0]
		mc, err := lp.memberClient(url)
		name := cmp.Or(m.Name, fmt.Sprintf("%x", m.ID))
		if err != nil {
			probes[name] = func(context.Context) error { return err }
			continue
		}
		probes[name] = func(ctx context.Context) error {
			sctx, cancel := context.WithTimeout(ctx, defragWatchTimeout)
			defer cancel()
			st, err := etcdproc.MemberStatusOf(sctx, mc, url)
			if err != nil {
				return err
			}
			// A member cut off from the others answers on its client
			// port, but sees no leader once its election timeout passes.
			if st.Leader == 0 {
				return errNoLeader
			}
			return nil
		}
	}
	return probes
}

// watchOthers probes every member each interval until ctx ends. When one
// fails defragWatchMisses probes in a row, it calls stop with an error
// wrapping errClusterDegraded that names the member, and returns.
func watchOthers(ctx context.Context, probes map[string]memberProbe, interval time.Duration, stop context.CancelCauseFunc) {
	misses := map[string]int{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, name := range slices.Sorted(maps.Keys(probes)) {
			err := probes[name](ctx)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				misses[name] = 0
				continue
			}
			misses[name]++
			if misses[name] >= defragWatchMisses {
				stop(fmt.Errorf("%w: member %s failed %d status reads in a row: %w", errClusterDegraded, name, misses[name], err))
				return
			}
		}
	}
}

// finishDefrag records defrag commands as done.
func (lp *loop) finishDefrag(ctx context.Context, obs plan.Observed, act plan.FinishDefrag) error {
	s, err := lp.openStore(ctx)
	if err != nil {
		return err
	}
	for _, c := range obs.Commands {
		if !slices.Contains(act.CommandIDs, c.ID) {
			continue
		}
		st := spec.CommandStatus{State: spec.CommandDone, Message: "every member defragmented", Defragmented: c.Status.Defragmented}
		if err := s.SetCommandStatus(ctx, c.ID, st, lp.now()); err != nil {
			return err
		}
		lp.log.Info("defrag command done", "command", c.ID, "members", c.Status.Defragmented)
	}
	return nil
}

// memberDBSize is the database size a member reports, 0 when it does not
// answer.
func memberDBSize(ctx context.Context, c leaderEtcd, endpoint string) int64 {
	st, err := etcdproc.AskStatus(ctx, c, endpoint)
	if err != nil {
		return 0
	}
	return st.DbSize
}

// recoverSpace compacts etcd to its head revision for a NOSPACE alarm.
// Availability wins over continuous capture: what it had not stored is
// lost to restores, and a full backup follows.
func (lp *loop) recoverSpace(ctx context.Context, act plan.RecoverSpace) error {
	c, err := lp.members.leader(ctx)
	if err != nil {
		return err
	}
	st, err := etcdproc.AskStatus(ctx, c, lp.clientEndpoint)
	if err != nil {
		return fmt.Errorf("controller: NOSPACE: etcd status: %w", err)
	}
	head := st.Header.Revision
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := lp.client.Compact(cctx, head, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("controller: NOSPACE: compact to %d: %w", head, err)
	}
	lp.spaceCompacted = true
	lp.compaction.Compacted(head)
	lp.capture.RequestBase()
	lp.log.Warn("etcd's NOSPACE alarm is raised: compacted to the head; the members with space to give back are defragmented next",
		"revision", head, "reason", act.Reason)
	return nil
}

// disarmNoSpace disarms the NOSPACE alarms: every database is well under
// the quota again.
func (lp *loop) disarmNoSpace(ctx context.Context, obs plan.Observed, act plan.DisarmNoSpace) error {
	if err := lp.disarmAlarms(ctx, obs.Cluster.NoSpace, etcdserverpb.AlarmType_NOSPACE); err != nil {
		return err
	}
	lp.spaceCompacted = false
	lp.met.noSpaceRecoveries.Inc()
	lp.log.Warn("NOSPACE alarm disarmed: etcd takes writes again", "reason", act.Reason)
	return nil
}

// disarmAlarms disarms etcd's alarm of these members, as the leader.
func (lp *loop) disarmAlarms(ctx context.Context, ids []uint64, alarm etcdserverpb.AlarmType) error {
	if _, err := lp.members.leader(ctx); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, etcdproc.StatusTimeout)
	defer cancel()
	for _, id := range ids {
		if _, err := lp.client.AlarmDisarm(dctx, &clientv3.AlarmMember{MemberID: id, Alarm: alarm}); err != nil {
			return fmt.Errorf("controller: disarm %s of member %x: %w", alarm, id, err)
		}
	}
	return nil
}

// voters counts the cluster's voting members.
func voters(obs plan.Observed) int {
	n := 0
	if obs.Cluster != nil {
		for _, m := range obs.Cluster.Members {
			if !m.IsLearner {
				n++
			}
		}
	}
	return n
}
