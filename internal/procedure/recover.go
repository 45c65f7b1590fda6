package procedure

import (
	"context"
	"fmt"

	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// The recover-quorum procedure rebuilds a cluster that lost a majority of
// its members from one survivor's data, with etcd's --force-new-cluster:
// nothing the survivor holds is lost, writes after the last backup
// included. The survivor, once chosen, is recorded in the command's
// status (phase "forcing") before it is told anything.

// recoverMember chooses the survivor (once: an earlier driver's choice
// wins), records it, then has it restart etcd with --force-new-cluster
// and waits until it leads.
func (e *Executor) recoverMember(ctx context.Context, obs plan.Observed, act plan.RecoverMember) error {
	c, d, err := command(act.ID, act.On.Command)
	if err != nil {
		return err
	}
	return e.Runner.Do(ctx, d, c, phaseOf(c), func(ctx context.Context, term int64) error {
		if c.Status.Node == "" {
			got, err := e.Runner.Choose(ctx, act.ID, spec.Choice{Survivor: act.NodeID, SurvivorToken: act.Token})
			if err != nil {
				return err
			}
			if got.Survivor != act.NodeID {
				// Another driver chose first; its choice is the one. The
				// next cycle plans from it.
				return fmt.Errorf("procedure: recover-quorum %s: %s was chosen as the survivor already, not %s", act.ID, got.Survivor, act.NodeID)
			}
			st := spec.CommandStatus{State: spec.CommandRunning, Node: act.NodeID, NodeToken: act.Token,
				Message: fmt.Sprintf("rebuilding cluster %s from the data of %s", act.Token, act.NodeID)}
			e.Log.Warn("recovering quorum from one survivor's data", "command", act.ID, "node", act.NodeID, "cluster-token", act.Token, "lock-term", term)
			if err := e.Runner.Record(ctx, d, act.ID, "", st, PhaseForcing, "recover-chosen"); err != nil {
				return err
			}
		}
		n, err := plan.Reached(act.NodeID, act.On.Node)
		if err != nil {
			return err
		}
		// The lease still holds now: a driver paused since it planned,
		// whose lease ran out, forces nothing (the node checks the
		// deadline too, by its clock).
		if _, err := e.Runner.Fence.Hold(ctx); err != nil {
			return err
		}
		return e.call(ctx, n, peer.RecoverWait+callTimeout, func(ctx context.Context, api NodeAPI) error {
			return api.Recover(ctx, peer.RecoverRequest{LeaderID: e.SelfID, Term: term, Token: act.Token, NotAfter: e.Runner.NotAfter()})
		})
	})
}

// finishRecover removes the completed recover-quorum command.
func (e *Executor) finishRecover(ctx context.Context, act plan.FinishRecover) error {
	if err := e.Runner.Finish(ctx, RecoverQuorum, act.ID); err != nil {
		return err
	}
	e.Log.Info("quorum recovered; the command is removed, and the other nodes rejoin as new members", "command", act.ID)
	return nil
}
