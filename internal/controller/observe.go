package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

const (
	peerCallTimeout   = 2 * time.Second
	statusTimeout     = 2 * time.Second
	publishInterval   = 10 * time.Second
	pendingTimeoutMul = 3
)

// observe builds one cycle's view. It never fails: what it cannot see is
// recorded as an error in the result.
func (lp *loop) observe(ctx context.Context) plan.Observed {
	self, member, local := lp.observeSelf(ctx)
	obs := plan.Observed{
		Self:           self,
		Peers:          []plan.Node{self},
		Grace:          lp.cfg.MemberFailureGrace,
		PendingTimeout: pendingTimeoutMul * lp.cfg.LeaderLease,
	}
	defer func() {
		leading := obs.Cluster != nil || obs.LockHeld
		lp.setInfo(self, member, local, leading)
		boolGauge(lp.met.leader, leading)
		boolGauge(lp.met.etcdHealthy, self.Healthy)
	}()

	s, err := lp.openStore(ctx)
	if err != nil {
		obs.StoreErr = err
		return obs
	}
	lp.observeStore(ctx, s, &obs)
	if obs.StoreErr != nil {
		return obs
	}
	lp.publish(ctx, self.ID)
	obs.Peers = lp.observePeers(ctx, self)

	// Leadership: through etcd while it has quorum, else the store lock
	// when no node holds cluster data at all.
	if self.Healthy && local.LeaderID != 0 && local.LeaderID == local.MemberID {
		view, err := lp.observeCluster(ctx)
		if err != nil {
			lp.log.Warn("cannot read the etcd cluster as its leader", "error", err)
		} else {
			obs.Cluster = view
		}
	}
	if obs.Cluster != nil {
		b := lp.backups
		obs.BackupDue = b.due(lp.cfg.Backup.Interval)
		obs.BackedUpSinceChange = !b.lastOK.IsZero() && !b.lastOK.Before(lp.lastChange)
		obs.BackupFailedRecently = b.failedRecently()
		obs.VersionBackup = lp.versionBackup
	}
	// The command queue matters to an agent that leads or may lead: the
	// etcd leader, any agent while no etcd runs, and the lock holder.
	// An agent whose etcd sees no raft leader reads it too: quorum may be
	// lost, and only a queued recover-quorum can end that.
	noCluster := plan.NoCluster(obs)
	if obs.Cluster != nil || noCluster || lp.lease.Term() != 0 || (self.Member != nil && self.RaftLeader == 0) {
		cmds, err := readCommands(ctx, s, lp.now())
		if err != nil {
			obs.StoreErr = err
			return obs
		}
		obs.Commands = cmds
	}
	// The store lock leads while there is no cluster, and throughout a
	// restore, whose cluster comes and goes.
	if noCluster || plan.ActiveExclusive(obs.Commands) != nil {
		term, err := lp.lease.Acquire(ctx, s)
		switch {
		case errors.Is(err, spec.ErrNewerFormat):
			obs.NewerFormat = err
		case err != nil:
			obs.StoreErr = err
			return obs
		}
		obs.LockHeld = term != 0
	} else if lp.lease.Term() != 0 {
		if err := lp.lease.Release(ctx, s); err != nil {
			lp.log.Warn("cannot release the store lock; it expires with its lease", "error", err)
		}
	}
	if !obs.LockHeld {
		lp.procedures.Runner.Idle()
	}
	return obs
}

// observeSelf reports this node as the planner sees it, with its
// membership as recorded in its state and its etcd's status.
func (lp *loop) observeSelf(ctx context.Context) (plan.Node, *etcdproc.MemberState, etcdproc.MemberStatus) {
	st, pendingSince := lp.node.State()
	self := plan.Node{
		ID:             st.NodeID,
		Address:        lp.peerAddress(),
		PeerURLs:       lp.cfg.PeerURLs,
		ClientURLs:     lp.cfg.ClientURLs,
		QuarantineURLs: lp.cfg.QuarantineClientURLs,
		Member:         membership(st.Member),
		Installed:      etcdproc.InstalledVersions(lp.cfg.EtcdBinDir),
	}
	if m := st.Member; m != nil {
		self.HasData = lp.node.Layout().HasEtcdData(m.ClusterToken)
		self.SnapIndex = lp.node.Layout().SnapIndex(m.ClusterToken)
		if m.Pending && !pendingSince.IsZero() {
			self.PendingFor = lp.now().Sub(pendingSince)
		}
	}
	var local etcdproc.MemberStatus
	ps := lp.node.EtcdStatus()
	self.EtcdWanted = ps.Wanted
	if ps.Wanted && ps.PID != 0 {
		endpoint := ps.Spec.ServedClientURL()
		if c, err := lp.localClient(endpoint); err == nil {
			sctx, cancel := context.WithTimeout(ctx, statusTimeout)
			ms, err := etcdproc.LocalStatus(sctx, c, endpoint)
			cancel()
			if err == nil {
				self.Healthy, self.Version, local = true, ms.Version, ms
				self.MemberID, self.RaftLeader, self.RaftIndex = ms.MemberID, ms.LeaderID, ms.RaftIndex
				self.StorageVersion, self.DowngradeTarget = ms.StorageVersion, ms.DowngradeTarget
				if ms.DowngradeTarget != "" {
					// The downgrade's binaries may change only once etcd
					// has lowered the cluster version.
					if v, err := etcdproc.ClusterVersion(ctx, endpoint, lp.etcdTLS); err == nil {
						self.ClusterVersion = v
					}
				}
			}
		}
	}
	return self, st.Member, local
}

func (lp *loop) observeStore(ctx context.Context, s *store.Store, obs *plan.Observed) {
	cs, err := s.ReadSpec(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case errors.Is(err, store.ErrUnreachable):
		obs.StoreErr = err
		return
	case err != nil:
		obs.SpecErr = err
	default:
		if _, verr := cs.Validate(); verr != nil {
			obs.SpecErr = fmt.Errorf("controller: %s in %s: %w", store.KeySpec, s.URL(), verr)
		} else {
			obs.Spec = &cs
			v, _ := spec.ParseVersion(cs.EtcdVersion)
			if _, berr := etcdproc.FindBinaries(lp.cfg.EtcdBinDir, v); berr != nil {
				obs.SpecBinaryErr = berr
			}
		}
	}
	created, err := s.ReadCreated(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case errors.Is(err, store.ErrUnreachable):
		obs.StoreErr = err
	case err != nil:
		// A marker that exists but cannot be parsed still marks the cluster
		// as created: refusing to create is the safe side.
		lp.log.Warn("cluster-created marker is unreadable; treating the cluster as created", "error", err)
		obs.Created = &created
	default:
		obs.Created = &created
	}
}

func (lp *loop) publish(ctx context.Context, nodeID string) {
	if lp.now().Sub(lp.lastPublish) < publishInterval {
		return
	}
	rec := peer.Record{NodeID: nodeID, ClusterName: lp.cfg.ClusterName, Address: lp.peerAddress()}
	if err := lp.discovery.Publish(ctx, rec); err != nil {
		lp.log.Warn("cannot publish this agent for discovery", "error", err)
		return
	}
	lp.lastPublish = lp.now()
}

// observePeers asks every discovered agent for its info, concurrently.
// Unreachable agents are left out.
func (lp *loop) observePeers(ctx context.Context, self plan.Node) []plan.Node {
	recs, err := lp.discovery.Poll(ctx)
	if err != nil {
		lp.log.Warn("discovery failed", "error", err)
	}
	addrs := map[string]bool{}
	for _, r := range recs {
		if r.Address != self.Address && (r.ClusterName == "" || r.ClusterName == lp.cfg.ClusterName) {
			addrs[r.Address] = true
		}
	}
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		nodes = map[string]plan.Node{self.ID: self}
	)
	for addr := range addrs {
		c, err := lp.peerClient(addr)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, peerCallTimeout)
			defer cancel()
			info, err := c.Info(cctx)
			if err != nil || info.NodeID == "" || info.NodeID == self.ID || info.ClusterName != lp.cfg.ClusterName {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			nodes[info.NodeID] = nodeFromInfo(addr, info)
		}()
	}
	wg.Wait()
	out := make([]plan.Node, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func nodeFromInfo(addr string, info peer.NodeInfo) plan.Node {
	return plan.Node{
		ID: info.NodeID, Address: addr, PeerURLs: info.PeerURLs, ClientURLs: info.ClientURLs, QuarantineURLs: info.QuarantineClientURLs,
		Member: membership(info.Member), HasData: info.HasData, PendingFor: info.PendingFor,
		EtcdWanted: info.EtcdWanted, Healthy: info.EtcdHealthy, Version: info.EtcdVersion,
		MemberID: info.MemberID, RaftLeader: info.RaftLeader, RaftIndex: info.RaftIndex, SnapIndex: info.SnapIndex, Installed: info.Installed,
		StorageVersion: info.StorageVersion, DowngradeTarget: info.DowngradeTarget,
	}
}

func (lp *loop) peerClient(addr string) (*peer.Client, error) {
	if c, ok := lp.peers[addr]; ok {
		return c, nil
	}
	c, err := peer.Dial(addr, lp.cfg.ClusterName, lp.creds)
	if err != nil {
		return nil, err
	}
	lp.peers[addr] = c
	return c, nil
}

// observeCluster reads the membership through the local etcd, which is
// the raft leader. MemberList is linearizable, so success proves quorum.
func (lp *loop) observeCluster(ctx context.Context) (*plan.ClusterView, error) {
	m := lp.node.Member()
	if m == nil || lp.client == nil {
		return nil, errors.New("controller: no local member")
	}
	cctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	resp, err := lp.client.MemberList(cctx)
	if err != nil {
		return nil, fmt.Errorf("controller: member list: %w", err)
	}
	view := &plan.ClusterView{Token: m.ClusterToken}
	var wg sync.WaitGroup
	members := make([]plan.Member, len(resp.Members))
	for i, pm := range resp.Members {
		members[i] = plan.Member{ID: pm.ID, Name: pm.Name, PeerURLs: pm.PeerURLs, ClientURLs: pm.ClientURLs, IsLearner: pm.IsLearner}
		if len(pm.ClientURLs) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, statusTimeout)
			defer cancel()
			st, err := lp.client.Status(sctx, pm.ClientURLs[0])
			members[i].Healthy = err == nil
			if err == nil {
				members[i].RaftIndex = st.RaftIndex
			}
		}()
	}
	wg.Wait()
	now := lp.now()
	seen := map[uint64]bool{}
	for i := range members {
		id := members[i].ID
		seen[id] = true
		if members[i].Healthy {
			delete(lp.unhealthySince, id)
			continue
		}
		since, ok := lp.unhealthySince[id]
		if !ok {
			since = now
			lp.unhealthySince[id] = now
		}
		members[i].UnhealthyFor = now.Sub(since)
	}
	for id := range lp.unhealthySince {
		if !seen[id] {
			delete(lp.unhealthySince, id)
		}
	}
	view.Members = members
	return view, nil
}

func (lp *loop) setInfo(self plan.Node, member *etcdproc.MemberState, local etcdproc.MemberStatus, leader bool) {
	info := peer.NodeInfo{
		NodeID:               self.ID,
		ClusterName:          lp.cfg.ClusterName,
		PeerAddress:          self.Address,
		ClientURLs:           lp.cfg.ClientURLs,
		QuarantineClientURLs: lp.cfg.QuarantineClientURLs,
		PeerURLs:             lp.cfg.PeerURLs,
		Member:               member,
		HasData:              self.HasData,
		PendingFor:           self.PendingFor,
		EtcdWanted:           self.EtcdWanted,
		EtcdHealthy:          self.Healthy,
		EtcdVersion:          self.Version,
		MemberID:             local.MemberID,
		ClusterID:            local.ClusterID,
		RaftLeader:           local.LeaderID,
		RaftIndex:            local.RaftIndex,
		SnapIndex:            self.SnapIndex,
		StorageVersion:       self.StorageVersion,
		DowngradeTarget:      self.DowngradeTarget,
		IsLearner:            local.IsLearner,
		DBSize:               local.DBSize,
		Leader:               leader,
		Installed:            self.Installed,
	}
	lp.node.SetInfo(info, member)
}

// membership is a node's recorded membership as the planner sees it.
func membership(m *etcdproc.MemberState) *plan.Membership {
	if m == nil {
		return nil
	}
	return &plan.Membership{
		ClusterToken:    m.ClusterToken,
		EtcdVersion:     m.EtcdVersion,
		NewCluster:      m.NewCluster,
		Pending:         m.Pending,
		Quarantined:     m.Quarantined,
		ForceNewCluster: m.ForceNewCluster,
		V2Until:         m.V2Until,
	}
}
