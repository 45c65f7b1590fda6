package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/procedure"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

// CallTimeout bounds a node call that may stop or start etcd.
const CallTimeout = 30 * time.Second

// ErrNotLeader means a leadership re-check failed before a mutating step.
var ErrNotLeader = errors.New("membership: no longer the leader")

// LeaderEtcd is the local etcd, the raft leader, as the membership
// steps use it: etcd's own cluster and maintenance APIs, and one read.
type LeaderEtcd interface {
	clientv3.Cluster
	clientv3.Maintenance
	Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error)
}

// NodeAPI is what the membership steps ask of a node, this agent's own
// or a peer.
type NodeAPI interface {
	Join(ctx context.Context, req peer.JoinRequest) error
	Leave(ctx context.Context, req peer.LeaveRequest) error
	SetVersion(ctx context.Context, req peer.VersionRequest) error
	SetSettings(ctx context.Context, req peer.SettingsRequest) error
	DiscardData(ctx context.Context, req peer.DiscardRequest) error
	HashData(ctx context.Context, req peer.HashDataRequest) (peer.DataHash, error)
	Resume(ctx context.Context, req peer.ResumeRequest) error
	SetPeerURLs(ctx context.Context, req peer.PeerURLsRequest) error
	SetPeerCertCheck(ctx context.Context, req peer.PeerCertCheckRequest) error
	SyncCA(ctx context.Context, req peer.CARequest) error
}

// CreationMarker is the store's once-only creation marker, written
// under the store lock.
type CreationMarker interface {
	// Term is the store lock's term held, for the log.
	Term() int64
	// Hold checks that this agent still holds the store lock.
	Hold(ctx context.Context) (int64, error)
	// CreateCreated writes the marker unless it exists (store.ErrExists).
	CreateCreated(ctx context.Context, c spec.ClusterCreated) error
	// ReadCreated reads the marker.
	ReadCreated(ctx context.Context) (spec.ClusterCreated, error)
}

// Executor carries out the leader's membership and version steps. Each
// mutating step re-checks, right before it acts, that the local etcd
// still leads with quorum.
type Executor struct {
	Log    *slog.Logger
	Now    func() time.Time
	SelfID string
	// Etcd is the local etcd's client and endpoint; nil when there is none.
	Etcd func() (LeaderEtcd, string)
	// Self is this node's membership now.
	Self func() *etcdproc.MemberState
	// Call makes one bounded call on a node.
	Call     func(ctx context.Context, n plan.Node, call func(context.Context, NodeAPI) error) error
	Creation CreationMarker
	// Dial returns a client of another member's etcd, and its closer.
	Dial func(endpoints []string) (clientv3.Cluster, func(), error)
}

// Create creates a new cluster. Crash safety comes from the order: every
// chosen node first records the membership as pending, then the once-only
// creation marker names the token, and only then do the nodes start etcd
// (each confirms against the marker itself). A creation that loses the
// marker, or never writes it, is abandoned by its nodes.
func (m *Executor) Create(ctx context.Context, obs plan.Observed, act plan.CreateCluster) error {
	v, err := spec.ParseSupportedVersion(act.Version)
	if err != nil {
		return err
	}
	nodes, err := plan.ReachedAll(act.Members, act.On.Nodes)
	if err != nil {
		return err
	}
	token, err := spec.NewClusterToken()
	if err != nil {
		return err
	}
	member := etcdproc.MemberState{
		ClusterToken:   token,
		EtcdVersion:    v.String(),
		InitialCluster: plan.InitialCluster(nodes),
		NewCluster:     true,
		Pending:        true,
		Settings:       specSettings(obs, v),
		// Every chosen node's certificate carries it (see plan).
		PeerCertHostname: act.PeerCertHostname,
	}
	m.Log.Info("creating cluster", "cluster-token", token, "version", v.String(), "members", act.Members, "lock-term", m.Creation.Term())
	var prepared []plan.Node
	rollback := func(cause error) error {
		for _, n := range prepared {
			if err := m.leave(ctx, n, peer.LeaveRequest{Token: token, Reason: "creation rolled back"}); err != nil {
				m.Log.Warn("cannot roll back a prepared member; it gives up on its own", "node", n.ID, "error", err)
			}
		}
		return cause
	}
	for _, n := range nodes {
		if err := m.join(ctx, n, peer.JoinRequest{Member: member}); err != nil {
			return rollback(fmt.Errorf("membership: prepare %s: %w", n.ID, err))
		}
		prepared = append(prepared, n)
	}
	if _, err := m.Creation.Hold(ctx); err != nil {
		return rollback(fmt.Errorf("membership: before creating the cluster: %w", err))
	}
	err = m.Creation.CreateCreated(ctx, spec.ClusterCreated{Timestamp: spec.Int64(m.Now().UnixNano()), ClusterToken: token})
	if errors.Is(err, store.ErrExists) {
		// A retry of a write that did succeed finds our own marker: that
		// is success, not another creator's win.
		if got, rerr := m.Creation.ReadCreated(ctx); rerr != nil || got.ClusterToken != token {
			return rollback(fmt.Errorf("membership: another agent created the cluster first"))
		}
		err = nil
	}
	if err != nil {
		// The marker may or may not be written; the prepared nodes settle it
		// against the store themselves.
		return err
	}
	m.Log.Info("cluster created", "cluster-token", token, "members", act.Members)
	return nil
}

// isUnhealthy reports etcd's refusal of a membership change while the
// member asked is not connected to a quorum ("unhealthy cluster").
func isUnhealthy(err error) bool {
	return err != nil && (errors.Is(err, rpctypes.ErrUnhealthy) || strings.Contains(err.Error(), rpctypes.ErrUnhealthy.Error()))
}

// addThroughOthers asks each other started voter, in turn, to add a
// learner at peerURLs; it returns the last refusal when all refuse.
func (m *Executor) addThroughOthers(ctx context.Context, members []*etcdserverpb.Member, peerURLs []string) (*clientv3.MemberAddResponse, error) {
	err := rpctypes.ErrUnhealthy
	for _, mm := range members {
		if mm.IsLearner || len(mm.ClientURLs) == 0 || mm.Name == m.SelfID || m.Dial == nil {
			continue
		}
		c, closeFn, derr := m.Dial(mm.ClientURLs)
		if derr != nil {
			m.Log.Warn("cannot reach a voter to add a member through", "member", mm.Name, "error", derr)
			continue
		}
		actx, cancel := context.WithTimeout(ctx, etcdproc.CallTimeout)
		resp, aerr := c.MemberAddAsLearner(actx, peerURLs)
		cancel()
		closeFn()
		if aerr == nil {
			m.Log.Info("a member was added through another voter: the leader's etcd refused it as unhealthy", "through", mm.Name)
			return resp, nil
		}
		err = aerr
	}
	return nil, err
}

// Leader re-checks, right before a membership change, that the local etcd
// is still the raft leader and still has quorum, and returns it.
func (m *Executor) Leader(ctx context.Context) (LeaderEtcd, error) {
	c, endpoint := m.Etcd()
	if c == nil {
		return nil, ErrNotLeader
	}
	// One bound for both calls: a leader that is slow to say so is as
	// good as none.
	cctx, cancel := context.WithTimeout(ctx, etcdproc.StatusTimeout)
	defer cancel()
	st, err := c.Status(cctx, endpoint)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	if st.Leader != st.Header.MemberId {
		return nil, fmt.Errorf("%w: etcd leader is now %x", ErrNotLeader, st.Leader)
	}
	// A linearizable read needs quorum.
	if _, err := c.Get(cctx, "/etcd-manager/leader-check"); err != nil {
		return nil, fmt.Errorf("%w: no quorum: %v", ErrNotLeader, err)
	}
	return c, nil
}

// Add adds a standby node as a learner, then tells it to join.
func (m *Executor) Add(ctx context.Context, obs plan.Observed, act plan.AddMember) error {
	n, err := plan.Reached(act.NodeID, act.On.Node)
	if err != nil {
		return err
	}
	c, err := m.Leader(ctx)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, etcdproc.CallTimeout)
	defer cancel()
	list, err := c.MemberList(lctx)
	if err != nil {
		return fmt.Errorf("membership: member list: %w", err)
	}
	members := list.Members
	exists := false
	for _, mm := range members {
		exists = exists || plan.SameURLs(mm.PeerURLs, n.PeerURLs)
	}
	if !exists {
		actx, cancel := context.WithTimeout(ctx, etcdproc.CallTimeout)
		defer cancel()
		resp, err := c.MemberAddAsLearner(actx, n.PeerURLs)
		if isUnhealthy(err) {
			// etcd refuses a change unless the member asked has been
			// connected to a quorum of voters for a few seconds, by its
			// own view. A leader's view can go stale for good: a send that
			// fails while a peer's streams stay up marks that peer
			// inactive until a stream reconnects. Another voter, connected
			// to a quorum by its own view, may take the change.
			resp, err = m.addThroughOthers(ctx, members, n.PeerURLs)
		}
		if isUnhealthy(err) {
			return fmt.Errorf("membership: etcd reports the cluster not yet settled for adding %s: %w", n.ID, procedure.ErrWait)
		}
		if err != nil {
			return fmt.Errorf("membership: add %s as learner: %w", n.ID, err)
		}
		members = resp.Members
		m.Log.Info("member added as learner", "node", n.ID, "member-id", fmt.Sprintf("%x", resp.Member.ID))
	}
	var initial []string
	for _, mm := range members {
		name := mm.Name
		if plan.SameURLs(mm.PeerURLs, n.PeerURLs) {
			name = n.ID
		}
		if name == "" {
			continue
		}
		for _, u := range mm.PeerURLs {
			initial = append(initial, name+"="+u)
		}
	}
	cur := m.Self()
	if cur == nil {
		return fmt.Errorf("%w: this node left the cluster", ErrNotLeader)
	}
	// A new member starts as the leader runs (version, settings and the
	// peer certificate check, if its certificate allows); a change under
	// way reaches it like any other member.
	check := cur.PeerCertHostname
	if n.CertMarker != check {
		check = ""
	}
	return m.join(ctx, n, peer.JoinRequest{Member: etcdproc.MemberState{
		ClusterToken:     cur.ClusterToken,
		EtcdVersion:      cur.EtcdVersion,
		InitialCluster:   strings.Join(initial, ","),
		Settings:         maps.Clone(cur.Settings),
		PeerCertHostname: check,
	}})
}

// specSettings are the spec's etcd settings that etcd v accepts, for a
// new member.
func specSettings(obs plan.Observed, v spec.Version) map[string]string {
	if obs.Spec == nil {
		return nil
	}
	s, _ := obs.Spec.EtcdSettings.Usable(v)
	return s
}

// Promote promotes a caught-up learner.
func (m *Executor) Promote(ctx context.Context, act plan.PromoteMember) error {
	c, err := m.Leader(ctx)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, etcdproc.CallTimeout)
	defer cancel()
	_, err = c.MemberPromote(pctx, act.MemberID)
	if errors.Is(err, rpctypes.ErrGRPCLearnerNotReady) || (err != nil && strings.Contains(err.Error(), rpctypes.ErrGRPCLearnerNotReady.Error())) {
		return fmt.Errorf("membership: learner %x is still catching up: %w", act.MemberID, procedure.ErrWait)
	}
	if err != nil {
		return fmt.Errorf("membership: promote %x: %w", act.MemberID, err)
	}
	m.Log.Info("learner promoted to voting member", "member-id", fmt.Sprintf("%x", act.MemberID))
	return nil
}

// Remove removes an etcd member, then tells its node (if known) to leave.
func (m *Executor) Remove(ctx context.Context, obs plan.Observed, act plan.RemoveMember) error {
	c, err := m.Leader(ctx)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, etcdproc.CallTimeout)
	defer cancel()
	_, err = c.MemberRemove(rctx, act.MemberID)
	if err != nil && !strings.Contains(err.Error(), rpctypes.ErrGRPCMemberNotFound.Error()) {
		return fmt.Errorf("membership: remove member %x: %w", act.MemberID, err)
	}
	m.Log.Warn("member removed", "member-id", fmt.Sprintf("%x", act.MemberID), "node", act.NodeID, "reason", act.Reason)
	if act.NodeID == "" || obs.Cluster == nil {
		return nil
	}
	if err := m.tellLeave(ctx, act.NodeID, act.On.Node, obs.Cluster.Token, "removed: "+act.Reason); err != nil {
		// It is out of the cluster either way; it is told again when seen.
		m.Log.Warn("cannot tell the removed node to leave; will retry when it is seen", "node", act.NodeID, "error", err)
	}
	return nil
}

// Evict tells a node that is not a member to drop its stale membership,
// after re-checking leadership like every other membership change.
func (m *Executor) Evict(ctx context.Context, obs plan.Observed, act plan.EvictNode) error {
	if _, err := m.Leader(ctx); err != nil {
		return err
	}
	return m.tellLeave(ctx, act.NodeID, act.On.Node, act.Token, act.Reason)
}

// tellLeave tells a node to drop its membership of the cluster token.
func (m *Executor) tellLeave(ctx context.Context, nodeID string, node *plan.Node, token, reason string) error {
	n, err := plan.Reached(nodeID, node)
	if err != nil {
		return err
	}
	return m.leave(ctx, n, peer.LeaveRequest{Token: token, Reason: reason})
}

func (m *Executor) join(ctx context.Context, n plan.Node, req peer.JoinRequest) error {
	req.LeaderID = m.SelfID
	return m.Call(ctx, n, func(ctx context.Context, api NodeAPI) error { return api.Join(ctx, req) })
}

func (m *Executor) leave(ctx context.Context, n plan.Node, req peer.LeaveRequest) error {
	req.LeaderID = m.SelfID
	return m.Call(ctx, n, func(ctx context.Context, api NodeAPI) error { return api.Leave(ctx, req) })
}

// SetVersion has a member's node restart etcd on another version.
func (m *Executor) SetVersion(ctx context.Context, obs plan.Observed, act plan.SetMemberVersion) error {
	n, err := plan.Reached(act.NodeID, act.On.Node)
	if err != nil {
		return err
	}
	if _, err := m.Leader(ctx); err != nil {
		return err
	}
	m.Log.Info("restarting a member on another etcd version", "node", n.ID, "version", act.Version)
	err = m.Call(ctx, n, func(ctx context.Context, api NodeAPI) error {
		return api.SetVersion(ctx, peer.VersionRequest{LeaderID: m.SelfID, Token: obs.Cluster.Token, Version: act.Version})
	})
	testhook.Here(m.Log, "version-member-restarted")
	return err
}

// SetSettings has a member's node restart etcd with the spec's settings.
func (m *Executor) SetSettings(ctx context.Context, obs plan.Observed, act plan.SetMemberSettings) error {
	n, err := plan.Reached(act.NodeID, act.On.Node)
	if err != nil {
		return err
	}
	if _, err := m.Leader(ctx); err != nil {
		return err
	}
	m.Log.Info("restarting a member with new etcd settings", "node", n.ID, "settings", act.Settings.String())
	return m.Call(ctx, n, func(ctx context.Context, api NodeAPI) error {
		return api.SetSettings(ctx, peer.SettingsRequest{LeaderID: m.SelfID, Token: obs.Cluster.Token, Settings: act.Settings})
	})
}

// SetPeerCertCheck has a member's node restart etcd with another peer
// certificate check.
func (m *Executor) SetPeerCertCheck(ctx context.Context, obs plan.Observed, act plan.SetPeerCertCheck) error {
	n, err := plan.Reached(act.NodeID, act.On.Node)
	if err != nil {
		return err
	}
	if _, err := m.Leader(ctx); err != nil {
		return err
	}
	if act.Hostname != "" {
		m.Log.Info("restarting a member to accept only node certificates on its etcd peer port", "node", n.ID, "peer-cert-allowed-hostname", act.Hostname)
	} else {
		m.Log.Warn("restarting a member to accept any certificate from the CA on its etcd peer port: a member's agent lacks the node marker or asked for the check off", "node", n.ID)
	}
	return m.Call(ctx, n, func(ctx context.Context, api NodeAPI) error {
		return api.SetPeerCertCheck(ctx, peer.PeerCertCheckRequest{LeaderID: m.SelfID, Token: obs.Cluster.Token, Hostname: act.Hostname})
	})
}

// MoveLeader hands raft leadership from the local etcd to another member.
func (m *Executor) MoveLeader(ctx context.Context, act plan.MoveLeader) error {
	c, err := m.Leader(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, etcdproc.CallTimeout)
	defer cancel()
	if _, err := c.MoveLeader(ctx, act.To); err != nil {
		return fmt.Errorf("membership: move leadership to %x: %w", act.To, err)
	}
	m.Log.Info("raft leadership handed on", "to", fmt.Sprintf("%x", act.To), "reason", act.Reason)
	return nil
}

// EnableDowngrade validates, then enables, etcd's cluster downgrade.
func (m *Executor) EnableDowngrade(ctx context.Context, act plan.EnableDowngrade) error {
	c, err := m.Leader(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, etcdproc.CallTimeout)
	defer cancel()
	if _, err := c.Downgrade(ctx, clientv3.DowngradeValidate, act.Version); err != nil {
		return fmt.Errorf("membership: etcd refuses a downgrade to %s: %w", act.Version, err)
	}
	if _, err := c.Downgrade(ctx, clientv3.DowngradeEnable, act.Version); err != nil {
		return fmt.Errorf("membership: enable the downgrade to %s: %w", act.Version, err)
	}
	m.Log.Warn("etcd downgrade enabled; members move to the older version once their data is rewritten", "version", act.Version)
	return nil
}

// SetPeerURLs registers the member's new peer URLs, then has its node
// restart etcd serving them. (Switching peer URLs is planned in package
// plan; the node's side is node.SetPeerURLs.)
func (m *Executor) SetPeerURLs(ctx context.Context, obs plan.Observed, act plan.SetPeerURLs) error {
	n, err := plan.Reached(act.NodeID, act.On.Node)
	if err != nil {
		return err
	}
	c, err := m.Leader(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, etcdproc.CallTimeout)
	_, err = c.MemberUpdate(cctx, act.MemberID, act.URLs)
	cancel()
	if err != nil {
		return fmt.Errorf("membership: register peer URLs %v for member %x: %w", act.URLs, act.MemberID, err)
	}
	m.Log.Warn("registered a member's new peer URLs; its node restarts etcd to serve them", "node", n.ID, "urls", act.URLs)
	return m.Call(ctx, n, func(ctx context.Context, api NodeAPI) error {
		return api.SetPeerURLs(ctx, peer.PeerURLsRequest{LeaderID: m.SelfID, Token: obs.Cluster.Token, URLs: act.URLs})
	})
}

// SyncCA has a node take up the store's CA and trust, restarting its
// etcd when asked.
func (m *Executor) SyncCA(ctx context.Context, obs plan.Observed, act plan.SyncCA) error {
	n, err := plan.Reached(act.NodeID, act.On.Node)
	if err != nil {
		return err
	}
	if _, err := m.Leader(ctx); err != nil {
		return err
	}
	if act.Restart {
		m.Log.Info("restarting a member's etcd to trust the CAs of a CA rotation", "node", n.ID, "trust", act.Trust)
	}
	err = m.Call(ctx, n, func(ctx context.Context, api NodeAPI) error {
		return api.SyncCA(ctx, peer.CARequest{LeaderID: m.SelfID, Token: obs.Cluster.Token, Trust: act.Trust, Issuer: act.Issuer, RestartEtcd: act.Restart})
	})
	if err == nil {
		testhook.Here(m.Log, "ca-rotation-synced-"+act.Phase)
	}
	return err
}

// HashData asks the agent of n, whose etcd is kept stopped, for the HashKV
// of its data at rev (0: its newest).
func (m *Executor) HashData(ctx context.Context, obs plan.Observed, n plan.Node, rev int64) (peer.DataHash, error) {
	var h peer.DataHash
	err := m.Call(ctx, n, func(ctx context.Context, api NodeAPI) error {
		var err error
		h, err = api.HashData(ctx, peer.HashDataRequest{LeaderID: m.SelfID, Token: obs.Cluster.Token, Revision: rev})
		return err
	})
	return h, err
}

// Resume has a member whose initial check failed, and whose data
// the majority's agrees with, start etcd without that check; the minority
// is compared again once it serves.
func (m *Executor) Resume(ctx context.Context, obs plan.Observed, act plan.ResumeMember) error {
	if _, err := m.Leader(ctx); err != nil {
		return err
	}
	n, err := plan.Reached(act.NodeID, act.On.Node)
	if err != nil {
		return err
	}
	m.Log.Warn("a member whose initial corruption check failed holds the majority's data: it starts again without the check",
		"node", act.NodeID, "member", fmt.Sprintf("%x", act.MemberID), "reason", act.Reason)
	return m.Call(ctx, n, func(ctx context.Context, api NodeAPI) error {
		return api.Resume(ctx, peer.ResumeRequest{LeaderID: m.SelfID, Token: obs.Cluster.Token, MemberID: act.MemberID, Reason: act.Reason})
	})
}

// DiscardData has a member's node set its data aside: its HashKV
// disagreed with the majority's. The lost-data rule then rebuilds it.
func (m *Executor) DiscardData(ctx context.Context, obs plan.Observed, act plan.DiscardMemberData) error {
	if _, err := m.Leader(ctx); err != nil {
		return err
	}
	n, err := plan.Reached(act.NodeID, act.On.Node)
	if err != nil {
		return err
	}
	m.Log.Error("a member's data disagrees with the majority's: setting it aside to rebuild the member from its peers",
		"node", act.NodeID, "member", fmt.Sprintf("%x", act.MemberID), "reason", act.Reason)
	return m.Call(ctx, n, func(ctx context.Context, api NodeAPI) error {
		return api.DiscardData(ctx, peer.DiscardRequest{LeaderID: m.SelfID, Token: obs.Cluster.Token, MemberID: act.MemberID, Reason: act.Reason})
	})
}
