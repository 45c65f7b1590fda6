package controller

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"github.com/etcd-manager/etcd-manager/internal/peer"
)

// Switching peer URLs. When an agent restarts with other --peer-urls than
// its member is registered with (going from --etcd-insecure to TLS turns
// http into https), its etcd keeps serving the registered ones, so the
// cluster keeps talking to it. The leader then switches the members one
// at a time, every member healthy first: it registers the new URLs
// (MemberUpdate) and has the node restart etcd serving them. Members that
// have TLS files dial https peers and serve http ones alike, so a cluster
// part way through keeps its quorum; each member is away only for its own
// restart, and the leader's own member goes last, after it hands
// leadership on.

// SetPeerURLs registers a member's new peer URLs and has its node serve
// them.
type SetPeerURLs struct {
	NodeID   string
	MemberID uint64
	URLs     []string
}

func (a SetPeerURLs) String() string {
	return fmt.Sprintf("set-peer-urls %s %s", a.NodeID, strings.Join(a.URLs, ","))
}
func (SetPeerURLs) Mutates() bool { return true }

// planPeerURLs returns the next step of a peer URL switch, or nothing.
func planPeerURLs(o Observed) []Action {
	type cand struct {
		m Member
		n Node
	}
	var todo []cand
	for _, m := range o.Cluster.Members {
		n, ok := nodeOfMember(o, m)
		if !ok || n.Member == nil || n.Member.ClusterToken != o.Cluster.Token || len(n.PeerURLs) == 0 || m.IsLearner {
			continue
		}
		if !sameURLs(m.PeerURLs, n.PeerURLs) {
			todo = append(todo, cand{m, n})
		}
	}
	if len(todo) == 0 {
		return nil
	}
	for _, m := range o.Cluster.Members {
		if !m.Healthy {
			return []Action{Report{Level: slog.LevelInfo, Msg: "peer URL switch waits for every member to be healthy", Attrs: []any{"member", m.Name}}}
		}
	}
	sort.Slice(todo, func(i, j int) bool { return todo[i].n.ID < todo[j].n.ID })
	next := todo[0]
	if i := slices.IndexFunc(todo, func(c cand) bool { return c.n.ID != o.Self.ID }); i >= 0 {
		next = todo[i]
	}
	if next.n.ID == o.Self.ID && len(o.Cluster.Members) > 1 {
		for _, m := range o.Cluster.Members {
			if m.ID != next.m.ID {
				return []Action{MoveLeader{To: m.ID, Reason: "before switching the leader's own peer URLs"}}
			}
		}
	}
	return []Action{SetPeerURLs{NodeID: next.n.ID, MemberID: next.m.ID, URLs: next.n.PeerURLs}}
}

// setPeerURLs registers the member's new peer URLs, then has its node
// restart etcd serving them.
func (a *Agent) setPeerURLs(ctx context.Context, obs Observed, act SetPeerURLs) error {
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
	if !sameURLs(req.URLs, a.cfg.PeerURLs) {
		return fmt.Errorf("controller: set peer URLs %v: this node is configured with %v", req.URLs, a.cfg.PeerURLs)
	}
	if sameURLs(cur.PeerURLs, req.URLs) && a.proc.Status().Wanted {
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
