package controller

import (
	"context"
	"fmt"

	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// The leader's side of a peer URL switch (planned in package plan) and the
// node's side, the peer API's SetPeerURLs.

// setPeerURLs registers the member's new peer URLs, then has its node
// restart etcd serving them.
func (a *Agent) setPeerURLs(ctx context.Context, obs plan.Observed, act plan.SetPeerURLs) error {
	n, err := findNode(obs.Peers, act.NodeID)
	if err != nil {
		return err
	}
	if err := a.confirmLeader(ctx); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
	_, err = a.client.MemberUpdate(cctx, act.MemberID, act.URLs)
	cancel()
	if err != nil {
		return fmt.Errorf("controller: register peer URLs %v for member %x: %w", act.URLs, act.MemberID, err)
	}
	a.log.Warn("registered a member's new peer URLs; its node restarts etcd to serve them", "node", n.ID, "urls", act.URLs)
	return a.askNode(ctx, n, func(ctx context.Context, api nodeAPI) error {
		return api.SetPeerURLs(ctx, peer.PeerURLsRequest{LeaderID: a.lock.NodeID, Token: obs.Cluster.Token, URLs: act.URLs})
	})
}

// SetPeerURLs serves the peer API: the member is now registered with this
// node's configured peer URLs; restart etcd serving them.
func (a *Agent) SetPeerURLs(ctx context.Context, req peer.PeerURLsRequest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.state.Member
	if cur == nil || cur.ClusterToken != req.Token {
		return fmt.Errorf("controller: set peer URLs for cluster %s: this node is not its member", req.Token)
	}
	if !plan.SameURLs(req.URLs, a.cfg.PeerURLs) {
		return fmt.Errorf("controller: set peer URLs %v: this node is configured with %v", req.URLs, a.cfg.PeerURLs)
	}
	if plan.SameURLs(cur.PeerURLs, req.URLs) && a.proc.Status().Wanted {
		return nil
	}
	m := *cur
	from := m.PeerURLs
	m.PeerURLs = a.cfg.PeerURLs
	st := a.state
	st.Member = &m
	if err := a.setState(st); err != nil {
		return err
	}
	a.log.Warn("restarting etcd to serve new peer URLs", "from", from, "to", m.PeerURLs, "leader", req.LeaderID)
	defer a.poke()
	return a.startEtcdLocked(ctx)
}
