package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// recoverWait bounds how long a survivor waits for its etcd, restarted
// with --force-new-cluster, to lead.
const recoverWait = time.Minute

// executeRecover performs a recover-quorum step, fenced by the store lock.
func (a *Agent) executeRecover(ctx context.Context, obs plan.Observed, act plan.Action) error {
	s, err := a.fencedStore(ctx)
	if err != nil {
		return err
	}
	switch act := act.(type) {
	case plan.RecoverMember:
		c := findCommand(obs.Commands, act.ID)
		if c == nil {
			return fmt.Errorf("controller: command %s is gone", act.ID)
		}
		if c.Status.Node == "" {
			st := spec.CommandStatus{State: spec.CommandRunning, Node: act.NodeID,
				Message: fmt.Sprintf("rebuilding cluster %s from the data of %s", act.Token, act.NodeID)}
			if err := s.SetCommandStatus(ctx, act.ID, st, a.now()); err != nil {
				return err
			}
			a.log.Warn("recovering quorum from one survivor's data", "command", act.ID, "node", act.NodeID, "cluster-token", act.Token)
			crashPoint(a.log, "recover-chosen")
		}
		n, err := findNode(obs.Peers, act.NodeID)
		if err != nil {
			return err
		}
		return a.askNodeFor(ctx, n, recoverWait+peerCallTimeoutLong, func(ctx context.Context, api nodeAPI) error {
			return api.Recover(ctx, peer.RecoverRequest{LeaderID: a.lock.NodeID, Token: act.Token})
		})
	case plan.FinishRecover:
		if err := s.DeleteCommand(ctx, act.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		a.log.Info("quorum recovered; the command is removed, and the other nodes rejoin as new members", "command", act.ID)
		return nil
	}
	return fmt.Errorf("controller: not a recover-quorum action: %T", act)
}

// Recover serves the peer API: restart this member's etcd with
// --force-new-cluster, wait until it leads its one-member cluster, then
// drop the flag so that later restarts are ordinary. It is idempotent: a
// member already leading after a recovery does nothing.
func (a *Agent) Recover(ctx context.Context, req peer.RecoverRequest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.state.Member
	if cur == nil || cur.ClusterToken != req.Token || !a.layout.HasEtcdData(req.Token) {
		return fmt.Errorf("controller: recover cluster %s: this node holds none of its data", req.Token)
	}
	if !cur.ForceNewCluster {
		if st, err := a.localStatus(ctx); err == nil && st.LeaderID != 0 {
			return nil // recovered already, or never lost quorum
		}
		m := *cur
		m.ForceNewCluster = true
		st := a.state
		st.Member = &m
		if err := a.setState(st); err != nil {
			return err
		}
		a.log.Warn("restarting etcd with --force-new-cluster to recover quorum", "cluster-token", req.Token, "leader", req.LeaderID)
		if err := a.startEtcdLocked(ctx); err != nil {
			return err
		}
	} else if !a.proc.Status().Wanted {
		if err := a.startEtcdLocked(ctx); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(recoverWait)
	for {
		st, err := a.localStatus(ctx)
		if err == nil && st.LeaderID == st.MemberID {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("controller: etcd did not lead after --force-new-cluster within %s (last status error: %v)", recoverWait, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	m := *a.state.Member
	m.ForceNewCluster = false
	st := a.state
	st.Member = &m
	if err := a.setState(st); err != nil {
		return err
	}
	if cur := a.proc.Status().Spec; cur != nil {
		a.proc.Update(a.etcdSpec(cur.Binaries, &m))
	}
	a.log.Warn("quorum recovered: this member now leads a one-member cluster with all its data", "cluster-token", req.Token)
	crashPoint(a.log, "recover-forced")
	defer a.poke()
	return nil
}

// localStatus asks the local etcd for its status, on whichever URLs it
// serves.
func (a *Agent) localStatus(ctx context.Context) (etcdproc.MemberStatus, error) {
	ps := a.proc.Status()
	if !ps.Wanted || ps.Spec == nil {
		return etcdproc.MemberStatus{}, errors.New("controller: etcd is not running")
	}
	endpoint := ps.Spec.ServedClientURL()
	c, err := etcdproc.NewClient([]string{endpoint}, a.etcdTLS)
	if err != nil {
		return etcdproc.MemberStatus{}, err
	}
	defer c.Close()
	return etcdproc.LocalStatus(ctx, c, endpoint)
}

// askNodeFor is askNode with its own timeout.
func (a *Agent) askNodeFor(ctx context.Context, n plan.Node, timeout time.Duration, call func(context.Context, nodeAPI) error) error {
	var api nodeAPI = a
	if n.ID != a.lock.NodeID {
		c, err := a.peerClient(n.Address)
		if err != nil {
			return err
		}
		api = c
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return call(ctx, api)
}
