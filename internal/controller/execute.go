package controller

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// etcdCallTimeout bounds every etcd call the executor makes: a call that
// hangs (leadership moving mid-call) must never stall the loop.
const etcdCallTimeout = 10 * time.Second

// ErrNotLeader means a leadership re-check failed before a mutating step.
var ErrNotLeader = errors.New("controller: no longer the leader")

// execute performs one action. Cluster-wide actions re-check leadership
// right before they mutate anything.
func (a *Agent) execute(ctx context.Context, obs plan.Observed, act plan.Action) error {
	switch act := act.(type) {
	case plan.StartEtcd:
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.startEtcdLocked(ctx)
	case plan.MarkBootstrapped:
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.markBootstrappedLocked()
	case plan.ConfirmCreate:
		return a.confirmCreate(ctx, act.Token)
	case plan.AbandonPending:
		return a.abandonPending(ctx, act)
	case plan.CreateCluster:
		return a.createCluster(ctx, obs, act)
	case plan.AddMember:
		return a.changed(a.addMember(ctx, obs, act))
	case plan.PromoteMember:
		return a.promoteMember(ctx, act)
	case plan.RemoveMember:
		return a.changed(a.removeMember(ctx, obs, act))
	case plan.EvictNode:
		return a.tellLeave(ctx, obs, act.NodeID, act.Token, act.Reason)
	case plan.TakeBackup:
		return a.takeBackup(ctx, obs, act)
	case plan.SetQuarantine:
		if act.ID == "" {
			// A stray quarantine, lifted by the agent beside etcd's leader.
			return a.setQuarantine(ctx, obs, act)
		}
		return a.executeRestore(ctx, obs, act)
	case plan.PrepareRestore, plan.StopForRestore, plan.SetRestorePhase, plan.RestoreNodes, plan.VerifyRestore, plan.BackupRestored, plan.FinishRestore,
		plan.PrepareDumpRestore, plan.DumpBackup:
		return a.executeRestore(ctx, obs, act)
	case plan.QueueDumpRestore:
		return a.queueDumpRestore(ctx, act)
	case plan.SetMemberVersion:
		return a.changed(a.setMemberVersion(ctx, obs, act))
	case plan.SetPeerURLs:
		return a.changed(a.setPeerURLs(ctx, obs, act))
	case plan.MoveLeader:
		return a.moveLeader(ctx, act)
	case plan.EnableDowngrade:
		return a.enableDowngrade(ctx, act)
	case plan.RecoverMember, plan.FinishRecover:
		return a.executeRecover(ctx, obs, act)
	case plan.FailCommand, plan.ForgetCommand:
		s, err := a.openStore(ctx)
		if err != nil {
			return err
		}
		return runCommandAction(ctx, s, a.now(), a.log, act)
	default:
		return fmt.Errorf("controller: unknown action %T", act)
	}
}

func (a *Agent) confirmCreate(ctx context.Context, token string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.state.Member
	if m == nil || !m.Pending || m.ClusterToken != token {
		return nil
	}
	st := a.state
	mm := *m
	mm.Pending = false
	st.Member = &mm
	if err := a.setState(st); err != nil {
		return err
	}
	a.log.Info("cluster creation confirmed; starting etcd", "cluster-token", token)
	return a.startEtcdLocked(ctx)
}

func (a *Agent) abandonPending(ctx context.Context, act plan.AbandonPending) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.state.Member
	if m == nil || !m.Pending || m.ClusterToken != act.Token {
		return nil
	}
	return a.leaveLocked(ctx, "abandoned creation: "+act.Reason)
}

// createCluster creates a new cluster. Crash safety comes from the order:
// every chosen node first records the membership as pending, then the
// once-only creation marker names the token, and only then do the nodes
// start etcd (each confirms against the marker itself). A creation that
// loses the marker, or never writes it, is abandoned by its nodes.
func (a *Agent) createCluster(ctx context.Context, obs plan.Observed, act plan.CreateCluster) error {
	v, err := spec.ParseSupportedVersion(act.Version)
	if err != nil {
		return err
	}
	nodes, err := findNodes(obs.Peers, act.Members)
	if err != nil {
		return err
	}
	token, err := newToken()
	if err != nil {
		return err
	}
	member := etcdproc.MemberState{
		ClusterToken:   token,
		EtcdVersion:    v.String(),
		InitialCluster: initialCluster(nodes),
		NewCluster:     true,
		Pending:        true,
	}
	a.log.Info("creating cluster", "cluster-token", token, "version", v.String(), "members", act.Members, "lock-term", a.lockTerm)
	var prepared []plan.Node
	rollback := func(cause error) error {
		for _, n := range prepared {
			if err := a.leaveNode(ctx, n, peer.LeaveRequest{Token: token, Reason: "creation rolled back"}); err != nil {
				a.log.Warn("cannot roll back a prepared member; it gives up on its own", "node", n.ID, "error", err)
			}
		}
		return cause
	}
	for _, n := range nodes {
		if err := a.joinNode(ctx, n, peer.JoinRequest{Member: member}); err != nil {
			return rollback(fmt.Errorf("controller: prepare %s: %w", n.ID, err))
		}
		prepared = append(prepared, n)
	}
	s, err := a.openStore(ctx)
	if err != nil {
		return rollback(err)
	}
	held, err := a.lock.Holds(ctx, s, a.lockTerm)
	if err != nil {
		return rollback(fmt.Errorf("controller: check the leader lock before creating the cluster: %w", err))
	}
	if !held {
		return rollback(fmt.Errorf("%w: the leader lock (term %d) was lost before the cluster was created", ErrNotLeader, a.lockTerm))
	}
	err = s.CreateCreated(ctx, spec.ClusterCreated{Timestamp: spec.Int64(a.now().UnixNano()), ClusterToken: token})
	if errors.Is(err, store.ErrExists) {
		return rollback(fmt.Errorf("controller: another agent created the cluster first"))
	}
	if err != nil {
		// The marker may or may not be written; the prepared nodes settle it
		// against the store themselves.
		return err
	}
	a.log.Info("cluster created", "cluster-token", token, "members", act.Members)
	return nil
}

// initialCluster is etcd's --initial-cluster for nodes: name=peerURL,...
func initialCluster(nodes []plan.Node) string {
	var initial []string
	for _, n := range nodes {
		for _, u := range n.PeerURLs {
			initial = append(initial, n.ID+"="+u)
		}
	}
	return strings.Join(initial, ",")
}

func findNodes(peers []plan.Node, ids []string) ([]plan.Node, error) {
	var out []plan.Node
	for _, id := range ids {
		found := false
		for _, p := range peers {
			if p.ID == id {
				out = append(out, p)
				found = true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("controller: node %s is no longer reachable", id)
		}
	}
	return out, nil
}

// confirmLeader re-checks, right before a membership change, that the
// local etcd is still the raft leader and still has quorum.
func (a *Agent) confirmLeader(ctx context.Context) error {
	if a.client == nil {
		return ErrNotLeader
	}
	cctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, err := a.client.Status(cctx, a.clientEndpoint)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	if st.Leader != st.Header.MemberId {
		return fmt.Errorf("%w: etcd leader is now %x", ErrNotLeader, st.Leader)
	}
	// A linearizable read needs quorum.
	if _, err := a.client.Get(cctx, "/etcd-manager/leader-check"); err != nil {
		return fmt.Errorf("%w: no quorum: %v", ErrNotLeader, err)
	}
	return nil
}

func (a *Agent) addMember(ctx context.Context, obs plan.Observed, act plan.AddMember) error {
	nodes, err := findNodes(obs.Peers, []string{act.NodeID})
	if err != nil {
		return err
	}
	n := nodes[0]
	if err := a.confirmLeader(ctx); err != nil {
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
	defer cancel()
	list, err := a.client.MemberList(lctx)
	if err != nil {
		return fmt.Errorf("controller: member list: %w", err)
	}
	members := list.Members
	exists := false
	for _, m := range members {
		exists = exists || plan.SameURLs(m.PeerURLs, n.PeerURLs)
	}
	if !exists {
		actx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
		defer cancel()
		resp, err := a.client.MemberAddAsLearner(actx, n.PeerURLs)
		if err != nil && strings.Contains(err.Error(), rpctypes.ErrGRPCUnhealthy.Error()) {
			// etcd refuses changes until every member has been connected
			// for a few seconds, as after a promotion.
			return fmt.Errorf("%w: etcd reports the cluster not yet settled for adding %s", errWait, n.ID)
		}
		if err != nil {
			return fmt.Errorf("controller: add %s as learner: %w", n.ID, err)
		}
		members = resp.Members
		a.log.Info("member added as learner", "node", n.ID, "member-id", fmt.Sprintf("%x", resp.Member.ID))
	}
	var initial []string
	for _, m := range members {
		name := m.Name
		if plan.SameURLs(m.PeerURLs, n.PeerURLs) {
			name = n.ID
		}
		if name == "" {
			continue
		}
		for _, u := range m.PeerURLs {
			initial = append(initial, name+"="+u)
		}
	}
	a.mu.Lock()
	cur := a.state.Member
	a.mu.Unlock()
	if cur == nil {
		return fmt.Errorf("%w: this node left the cluster", ErrNotLeader)
	}
	self := *cur
	return a.joinNode(ctx, n, peer.JoinRequest{Member: etcdproc.MemberState{
		ClusterToken:   self.ClusterToken,
		EtcdVersion:    self.EtcdVersion,
		InitialCluster: strings.Join(initial, ","),
	}})
}

func (a *Agent) promoteMember(ctx context.Context, act plan.PromoteMember) error {
	if err := a.confirmLeader(ctx); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
	defer cancel()
	_, err := a.client.MemberPromote(pctx, act.MemberID)
	if errors.Is(err, rpctypes.ErrGRPCLearnerNotReady) || (err != nil && strings.Contains(err.Error(), rpctypes.ErrGRPCLearnerNotReady.Error())) {
		return fmt.Errorf("%w: learner %x is still catching up", errWait, act.MemberID)
	}
	if err != nil {
		return fmt.Errorf("controller: promote %x: %w", act.MemberID, err)
	}
	a.log.Info("learner promoted to voting member", "member-id", fmt.Sprintf("%x", act.MemberID))
	return nil
}

func (a *Agent) removeMember(ctx context.Context, obs plan.Observed, act plan.RemoveMember) error {
	if err := a.confirmLeader(ctx); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
	defer cancel()
	_, err := a.client.MemberRemove(rctx, act.MemberID)
	if err != nil && !strings.Contains(err.Error(), rpctypes.ErrGRPCMemberNotFound.Error()) {
		return fmt.Errorf("controller: remove member %x: %w", act.MemberID, err)
	}
	a.log.Warn("member removed", "member-id", fmt.Sprintf("%x", act.MemberID), "node", act.NodeID, "reason", act.Reason)
	if act.NodeID == "" || obs.Cluster == nil {
		return nil
	}
	if err := a.tellLeave(ctx, obs, act.NodeID, obs.Cluster.Token, "removed: "+act.Reason); err != nil {
		// It is out of the cluster either way; it is told again when seen.
		a.log.Warn("cannot tell the removed node to leave; will retry when it is seen", "node", act.NodeID, "error", err)
	}
	return nil
}

func (a *Agent) tellLeave(ctx context.Context, obs plan.Observed, nodeID, token, reason string) error {
	nodes, err := findNodes(obs.Peers, []string{nodeID})
	if err != nil {
		return err
	}
	return a.leaveNode(ctx, nodes[0], peer.LeaveRequest{Token: token, Reason: reason})
}

// nodeAPI is what the leader asks of a node, itself or a peer. Both the
// agent and a peer.Client provide it.
type nodeAPI interface {
	Join(ctx context.Context, req peer.JoinRequest) error
	Leave(ctx context.Context, req peer.LeaveRequest) error
	Restore(ctx context.Context, req peer.RestoreRequest) error
	Quarantine(ctx context.Context, req peer.QuarantineRequest) error
	Recover(ctx context.Context, req peer.RecoverRequest) error
	SetVersion(ctx context.Context, req peer.VersionRequest) error
	SetPeerURLs(ctx context.Context, req peer.PeerURLsRequest) error
}

// peerCallTimeoutLong bounds a Join or Leave, which may stop or start etcd.
const peerCallTimeoutLong = 30 * time.Second

func (a *Agent) joinNode(ctx context.Context, n plan.Node, req peer.JoinRequest) error {
	req.LeaderID = a.lock.NodeID
	return a.askNode(ctx, n, func(ctx context.Context, api nodeAPI) error { return api.Join(ctx, req) })
}

func (a *Agent) leaveNode(ctx context.Context, n plan.Node, req peer.LeaveRequest) error {
	req.LeaderID = a.lock.NodeID
	return a.askNode(ctx, n, func(ctx context.Context, api nodeAPI) error { return api.Leave(ctx, req) })
}

// askNode makes one bounded call on a node, this agent or a peer.
func (a *Agent) askNode(ctx context.Context, n plan.Node, call func(context.Context, nodeAPI) error) error {
	return a.askNodeFor(ctx, n, peerCallTimeoutLong, call)
}

// changed records a membership change, so the next one waits for a fresh
// backup.
func (a *Agent) changed(err error) error {
	if err == nil {
		a.lastChange = a.now()
	}
	return err
}

// takeBackup takes a full backup through the local etcd, the leader.
func (a *Agent) takeBackup(ctx context.Context, obs plan.Observed, act plan.TakeBackup) error {
	s, err := a.openStore(ctx)
	if err != nil {
		return err
	}
	_, err = a.backups.take(ctx, s, backup.Request{
		Client:       clientv3.Config{DialTimeout: 5 * time.Second, TLS: a.etcdTLS},
		Endpoint:     a.clientEndpoint,
		TempDir:      filepath.Join(a.cfg.DataDir, "tmp"),
		EtcdVersion:  obs.Self.Version,
		ClusterSpec:  obs.Spec,
		ClusterToken: obs.Cluster.Token,
	}, act.Reason, act.CommandIDs...)
	if err == nil && act.ForVersion != "" {
		a.versionBackup = act.ForVersion
	}
	return err
}
