package controller

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// setMemberVersion has a member's node restart etcd on another version.
func (a *Agent) setMemberVersion(ctx context.Context, obs plan.Observed, act plan.SetMemberVersion) error {
	n, err := findNode(obs.Peers, act.NodeID)
	if err != nil {
		return err
	}
	if err := a.confirmLeader(ctx); err != nil {
		return err
	}
	a.log.Info("restarting a member on another etcd version", "node", n.ID, "version", act.Version)
	err = a.askNode(ctx, n, func(ctx context.Context, api nodeAPI) error {
		return api.SetVersion(ctx, peer.VersionRequest{LeaderID: a.lock.NodeID, Token: obs.Cluster.Token, Version: act.Version})
	})
	crashPoint(a.log, "version-member-restarted")
	return err
}

// moveLeader hands raft leadership from the local etcd to another member.
func (a *Agent) moveLeader(ctx context.Context, act plan.MoveLeader) error {
	if err := a.confirmLeader(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
	defer cancel()
	if _, err := a.client.MoveLeader(ctx, act.To); err != nil {
		return fmt.Errorf("controller: move leadership to %x: %w", act.To, err)
	}
	a.log.Info("raft leadership handed on", "to", fmt.Sprintf("%x", act.To), "reason", act.Reason)
	return nil
}

// enableDowngrade validates, then enables, etcd's cluster downgrade.
func (a *Agent) enableDowngrade(ctx context.Context, act plan.EnableDowngrade) error {
	if err := a.confirmLeader(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
	defer cancel()
	if _, err := a.client.Downgrade(ctx, clientv3.DowngradeValidate, act.Version); err != nil {
		return fmt.Errorf("controller: etcd refuses a downgrade to %s: %w", act.Version, err)
	}
	if _, err := a.client.Downgrade(ctx, clientv3.DowngradeEnable, act.Version); err != nil {
		return fmt.Errorf("controller: enable the downgrade to %s: %w", act.Version, err)
	}
	a.log.Warn("etcd downgrade enabled; members move to the older version once their data is rewritten", "version", act.Version)
	return nil
}

// SetVersion serves the peer API: run etcd of another version on this
// member's data. The binary is checked before etcd stops.
func (a *Agent) SetVersion(ctx context.Context, req peer.VersionRequest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.state.Member
	if cur == nil || cur.ClusterToken != req.Token {
		return fmt.Errorf("controller: set version for cluster %s: this node is not its member", req.Token)
	}
	v, err := spec.ParseSupportedVersion(req.Version)
	if err != nil {
		return err
	}
	bins, err := etcdproc.FindBinaries(a.cfg.EtcdBinDir, v)
	if err != nil {
		return err
	}
	if err := bins.CheckVersion(ctx); err != nil {
		return err
	}
	if cur.EtcdVersion == v.String() && a.proc.Status().Wanted {
		return nil
	}
	m := *cur
	from := m.EtcdVersion
	m.EtcdVersion = v.String()
	st := a.state
	st.Member = &m
	if err := a.setState(st); err != nil {
		return err
	}
	a.log.Warn("restarting etcd on another version", "from", from, "to", v.String(), "leader", req.LeaderID)
	defer a.poke()
	if err := a.startEtcdLocked(ctx); err != nil {
		return err
	}
	if old, err := spec.ParseVersion(from); err == nil && old.Minor <= 5 && v.Minor >= 6 {
		// Remember how far the log reached under 3.5: it may hold v2
		// entries up to here, which etcd 3.7 cannot replay.
		return a.recordV2UntilLocked(ctx)
	}
	return nil
}

// recordV2UntilLocked waits for the restarted etcd to report its raft
// index and records it as the member's V2Until. Callers hold a.mu.
func (a *Agent) recordV2UntilLocked(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := a.localStatus(ctx)
		if err == nil && st.RaftIndex > 0 {
			m := *a.state.Member
			m.V2Until = st.RaftIndex
			s := a.state
			s.Member = &m
			return a.setState(s)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("controller: etcd did not report its raft index after the upgrade: %v", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
