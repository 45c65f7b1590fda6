package controller

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/maintenance"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// defrag defragments one member, which is not the raft leader: the
// leader hands leadership on before its own turn. In place, the leader
// asks the member's etcd; isolated, the member's agent stops its etcd
// and defragments the database offline (see node.Defrag). Then the defrag
// commands it serves record the member as done.
func (lp *loop) defrag(ctx context.Context, obs plan.Observed, act plan.DefragMember) error {
	c, err := lp.members.Leader(ctx)
	if err != nil {
		return err
	}
	// This agent's etcd leads (checked just now), so another member's
	// does not; its own is defragmented only when it is the only voter.
	if act.MemberID == obs.Self.MemberID && plan.Voters(obs) > 1 {
		return fmt.Errorf("controller: defrag %s: its member leads raft; leadership is handed on first", act.NodeID)
	}
	s, err := lp.openStore(ctx)
	if err != nil && len(act.CommandIDs) > 0 {
		return err
	}
	job := maintenance.Job{Act: act, Etcd: c}
	if act.Isolate {
		job.Member = func() (maintenance.Member, error) {
			n, err := plan.Reached(act.NodeID, act.On.Node)
			if err != nil {
				return nil, err
			}
			return lp.callee(n)
		}
		job.Request = peer.DefragRequest{LeaderID: lp.members.SelfID, Token: obs.Cluster.Token, MemberID: act.MemberID, InUseBytes: act.InUseBytes}
		job.Others = lp.othersStatus(obs, act.MemberID) // the loop's connections
	}
	rec, err := lp.defragger.Defrag(ctx, job)
	if err != nil {
		return err
	}
	lp.maint.LastDefrag = &rec
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

// othersStatus are probes of every voter but member id: the members an
// isolated defragmentation of id leaves to keep quorum.
func (lp *loop) othersStatus(obs plan.Observed, id uint64) map[string]maintenance.Probe {
	probes := map[string]maintenance.Probe{}
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
		probes[name] = maintenance.StatusProbe(mc, url)
	}
	return probes
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

// recoverSpace compacts etcd to its head revision for a NOSPACE alarm.
// Availability wins over continuous capture: what it had not stored is
// lost to restores, and a full backup follows.
func (lp *loop) recoverSpace(ctx context.Context, act plan.RecoverSpace) error {
	c, err := lp.members.Leader(ctx)
	if err != nil {
		return err
	}
	head, err := etcdproc.CompactToHead(ctx, c, lp.client, lp.clientEndpoint)
	if err != nil {
		return fmt.Errorf("controller: NOSPACE: %w", err)
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
	if _, err := lp.members.Leader(ctx); err != nil {
		return err
	}
	return etcdproc.DisarmAlarms(ctx, lp.client, ids, alarm)
}
