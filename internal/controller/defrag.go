package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// defragTimeout bounds one member's defragmentation: etcd rewrites its
// whole database, about a second per few hundred MiB on a slow disk.
const defragTimeout = 10 * time.Minute

// defrag defragments one member, which is not the raft leader: the
// leader hands leadership on before its own turn.
func (lp *loop) defrag(ctx context.Context, obs plan.Observed, act plan.DefragMember) error {
	c, err := lp.members.leader(ctx)
	if err != nil {
		return err
	}
	if act.MemberID == obs.Self.MemberID {
		return fmt.Errorf("controller: defrag %s: its member leads raft; leadership is handed on first", act.NodeID)
	}
	s, err := lp.openStore(ctx)
	if err != nil && len(act.CommandIDs) > 0 {
		return err
	}
	before := memberDBSize(ctx, c, act.ClientURL)
	lp.log.Info("defragmenting a member", "node", act.NodeID, "reason", act.Reason, "db-size", before)
	dctx, cancel := context.WithTimeout(ctx, defragTimeout)
	start := lp.now()
	_, err = c.Defragment(dctx, act.ClientURL)
	cancel()
	took := lp.now().Sub(start)
	if err != nil {
		lp.met.defrags.WithLabelValues("failure").Inc()
		return fmt.Errorf("controller: defrag %s: %w", act.NodeID, err)
	}
	after := memberDBSize(ctx, c, act.ClientURL)
	lp.met.defrags.WithLabelValues("success").Inc()
	lp.met.defragLastOK.Set(float64(lp.now().Unix()))
	lp.met.defragLastDuration.Set(took.Seconds())
	if before > 0 && after > 0 {
		lp.met.defragLastReclaimed.Set(float64(max(before-after, 0)))
	}
	lp.log.Info("member defragmented", "node", act.NodeID, "duration", took.Round(time.Millisecond), "db-size-before", before, "db-size-after", after)
	for _, c := range obs.Commands {
		if !slices.Contains(act.CommandIDs, c.ID) {
			continue
		}
		done := append(slices.Clone(c.Status.Defragmented), act.NodeID)
		st := spec.CommandStatus{State: spec.CommandRunning, Message: "defragmenting one member at a time", Defragmented: done}
		if err := s.SetCommandStatus(ctx, c.ID, st, lp.now()); err != nil {
			return err
		}
	}
	return nil
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
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, err := c.Status(sctx, endpoint)
	if err != nil {
		return 0
	}
	return st.DbSize
}
