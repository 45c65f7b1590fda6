package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/storeops"
	"github.com/etcd-manager/etcd-manager/internal/version"
)

const (
	peerCallTimeout   = 2 * time.Second
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
		LearnerTimeout: lp.cfg.LearnerTimeout,
		PendingTimeout: pendingTimeoutMul * lp.cfg.LeaderLease,
	}
	// The last list read stays in force while the store cannot be read.
	obs.Revoked = lp.revoked.IDSet()
	peersRead := false
	defer func() {
		leading := obs.Cluster != nil || obs.LockHeld
		lp.setInfo(self, member, local, leading, plan.ActiveProcedure(obs))
		if peersRead {
			lp.announce(ctx, self, obs.Peers)
		}
		boolGauge(lp.met.leader, leading)
		boolGauge(lp.met.etcdHealthy, self.Healthy)
		if self.Healthy && self.Revision > 0 {
			lp.met.etcdRevision.Set(float64(self.Revision))
		}
	}()

	// Leadership: through etcd while it has quorum, else the store lock
	// when no node holds cluster data at all. The first needs no store:
	// while the store is unreachable the planner does nothing, but
	// capture (into its spool) and compaction go on.
	leadership := func() {
		if self.Healthy && local.LeaderID != 0 && local.LeaderID == local.MemberID {
			view, err := lp.observeCluster(ctx)
			if err != nil {
				lp.log.Warn("cannot read the etcd cluster as its leader", "error", err)
			} else {
				obs.Cluster = view
				lp.maint.Alarms = nil
				for _, id := range view.NoSpace {
					lp.maint.Alarms = append(lp.maint.Alarms, fmt.Sprintf("NOSPACE %x", id))
				}
				for _, id := range view.Corrupt {
					lp.maint.Alarms = append(lp.maint.Alarms, fmt.Sprintf("CORRUPT %x", id))
				}
				if view.AlarmsKnown && len(view.NoSpace) == 0 {
					lp.spaceCompacted = false
				}
				obs.SpaceCompacted = lp.spaceCompacted
				obs.IsolatedDefragFailed = lp.defragger.InPlace()
				if lp.cfg.HashCheckInterval > 0 && lp.hash.last.IsZero() {
					// A new leader waits out one interval, as every
					// agent would otherwise check at once on start.
					lp.hash.last = lp.now()
				}
				obs.HashCheckDue = plan.HashCheckDue(lp.now(), lp.hash.last, lp.cfg.HashCheckInterval, lp.hash.recheck)
				if !lp.hash.last.IsZero() && lp.hash.checked {
					obs.HashCheckedAgo = max(lp.now().Sub(lp.hash.last), time.Nanosecond)
				}
				// A verdict is acted on in the one cycle after the
				// comparison: a later cycle compares again.
				if lp.now().Sub(lp.hash.last) < hashResultFresh {
					obs.HashCheck = lp.hash.result
				}
				lp.hash.result = nil
			}
		}
	}
	s, err := lp.openStore(ctx)
	if err != nil {
		obs.StoreErr = err
		leadership()
		return obs
	}
	lp.observeStore(ctx, s, &obs)
	obs.Revoked = lp.revoked.IDSet()
	if obs.StoreErr != nil {
		leadership()
		return obs
	}
	lp.publish(ctx, s, self)
	obs.Peers = lp.observePeers(ctx, self)
	peersRead = true
	leadership()
	if obs.Cluster != nil {
		b := lp.backups
		// Capture may wait on a full backup to start a run from.
		due := func() bool { return b.Due(lp.cfg.Backup.Interval, lp.capture.NeedsBase()) }
		obs.BackupDue = due()
		if obs.BackupDue && lp.noteStoredBackup(ctx, s, obs.Cluster.Token) {
			obs.BackupDue = due()
		}
		obs.BackedUpSinceChange = !b.LastOK().IsZero() && !b.LastOK().Before(lp.lastChange)
		obs.BackupFailedRecently = b.FailedRecently()
		obs.VersionBackup = lp.versionBackup
		obs.Backoff = lp.failures.backingOff(lp.now())
		obs.CARotation, obs.CARotationErr = lp.observeCARotation(ctx, s)
	}
	// The command queue matters to an agent that leads or may lead: the
	// etcd leader, any agent while no etcd runs, and the lock holder.
	// An agent whose etcd sees no raft leader reads it too: quorum may be
	// lost, and only a queued recover-quorum can end that. Every other
	// agent reads it every half lease, so that a restore goes on even
	// when the etcd leader's agent is stuck.
	noCluster := plan.NoCluster(obs)
	if obs.Cluster != nil || noCluster || lp.lease.Term() != 0 || (self.Member != nil && self.RaftLeader == 0) ||
		lp.now().Sub(lp.lastQueueRead) >= lp.cfg.LeaderLease/2 {
		cmds, err := storeops.ReadCommands(ctx, s, lp.now())
		if err != nil {
			obs.StoreErr = err
			return obs
		}
		obs.Commands = cmds
		lp.lastQueueRead = lp.now()
		for _, c := range cmds {
			lp.termFloor = lease.StatusFloor(lp.termFloor, c.StatusTerm, lp.log)
		}
	}
	// Evidence about agents this one cannot reach: what they last
	// published, for a procedure and for the total-loss report.
	if plan.ActiveExclusive(obs.Commands) != nil || (noCluster && obs.Created != nil) {
		obs.Records, obs.RecordsErr = lp.records(ctx, s)
		obs.RecordFresh = lp.cfg.LeaderLease + lp.publishEvery()
		obs.NoLeaderSettle = lease.NoLeaderSettle(lp.cfg.LeaderLease)
	}
	if c := plan.ActiveExclusive(obs.Commands); c != nil && c.Command.RecoverQuorum != nil {
		obs.NewestBackups, obs.NewestBackupsErr = lp.newestBackups(ctx, s)
	}
	if err := lp.takeLock(ctx, s, &obs, noCluster); err != nil {
		obs.StoreErr = err
		return obs
	}
	if !obs.LockHeld && lp.activitySince.IsZero() {
		// No procedure of the runner, nor a roll or defragmentation
		// shown (see showActivity).
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
		Address:        lp.env.PeerAddress,
		PeerURLs:       lp.cfg.PeerURLs,
		ClientURLs:     lp.cfg.ClientURLs,
		QuarantineURLs: lp.cfg.QuarantineClientURLs,
		Member:         membershipOf(st.Member),
		Installed:      etcdproc.InstalledVersions(lp.cfg.EtcdBinDir),
		// The node certificate is renewed apart from the loop; the
		// marker never leaves it once there.
		CertMarker:       lp.env.Certs.Marker(),
		PeerCertCheckOff: !lp.cfg.EtcdPeerCertCheck,
		BackupKeys:       lp.env.Keys.IDs(),
		Trust:            lp.env.Certs.Trust(),
		EtcdTrust:        lp.node.EtcdTrust(),
		CAFromDir:        lp.env.CAFromDir,
	}
	if room, err := lp.cfg.fetchOptions(nil, nil).Room(lp.cfg.DataDir); err == nil {
		self.RestoreRoom = max(room, 1) // 0 would mean unknown
	}
	if ci := lp.env.Certs.Info(); ci != nil {
		self.CertCA = ci.CAFingerprint
	}
	if m := st.Member; m != nil {
		self.HasData = lp.node.Layout().HasEtcdData(m.ClusterToken)
		self.DataLost = m.HasRun && !self.HasData
		self.SnapIndex = lp.node.Layout().SnapIndex(m.ClusterToken)
		self.Revision = lp.node.DataRevision()
		if m.Pending && !pendingSince.IsZero() {
			self.PendingFor = lp.now().Sub(pendingSince)
		}
	}
	self.HeldBy = lp.node.Held()
	_, self.InitialCheckFailed = lp.node.InitialCheckFailed()
	self.InitialCheckFailedFor = lp.node.InitialCheckFailedFor()
	self.Unjudged = lp.node.Unjudged()
	if pos := lp.node.HeldPosition(); pos != nil && st.Member != nil {
		// Held down: where the data stands, from its database.
		self.DataIndex, self.Revision = pos.ConsistentIndex, pos.Revision
		var ms []plan.Member
		for _, m := range pos.Members {
			ms = append(ms, plan.Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, IsLearner: m.IsLearner})
		}
		self.LocalMembers = startedMembers(ms)
	}
	var local etcdproc.MemberStatus
	ps := lp.node.EtcdStatus()
	self.EtcdWanted = ps.Wanted
	if ps.Wanted && ps.PID != 0 {
		endpoint := ps.Spec.ServedClientURL()
		if c, err := lp.localClient(endpoint); err == nil {
			sctx, cancel := context.WithTimeout(ctx, etcdproc.StatusTimeout)
			ms, err := etcdproc.LocalStatus(sctx, c, endpoint)
			cancel()
			if err == nil {
				self.Healthy, self.Version, local = true, ms.Version, ms
				if ms.LeaderID == 0 && st.Member != nil {
					self.NoLeaderFor = lp.noLeaderFor()
				} else {
					lp.noLeaderSince = time.Time{}
				}
				self.MemberID, self.RaftLeader, self.RaftIndex, self.Revision = ms.MemberID, ms.LeaderID, ms.RaftIndex, ms.Revision
				self.StorageVersion, self.DowngradeTarget = ms.StorageVersion, ms.DowngradeTarget
				// The members its own copy lists: the evidence a
				// recover-quorum needs, and the members a dump-restore
				// must quarantine.
				self.LocalMembers = localMembers(ctx, c)
				if ms.DowngradeTarget != "" {
					// The downgrade's binaries may change only once etcd
					// has lowered the cluster version.
					if v, err := etcdproc.ClusterVersion(ctx, lp.httpClient(), endpoint); err == nil {
						self.ClusterVersion = v
					}
				}
			} else if st.Member != nil && len(ps.Spec.PeerURLs) > 0 {
				lp.observeNotServing(ctx, &self, ps.Spec.PeerURLs[0])
			}
		}
	}
	return self, st.Member, local
}

// observeCluster reads the membership through the local etcd, which is
// the raft leader. MemberList is linearizable, so success proves quorum.
func (lp *loop) observeCluster(ctx context.Context) (*plan.ClusterView, error) {
	m := lp.node.Member()
	if m == nil || lp.client == nil {
		return nil, errors.New("controller: no local member")
	}
	cctx, cancel := context.WithTimeout(ctx, etcdproc.StatusTimeout)
	defer cancel()
	resp, err := lp.client.MemberList(cctx)
	if err != nil {
		return nil, fmt.Errorf("controller: member list: %w", err)
	}
	view := &plan.ClusterView{Token: m.ClusterToken}
	var wg sync.WaitGroup
	members := make([]plan.Member, len(resp.Members))
	statusErrs := make([][]string, len(resp.Members))
	urls := map[string]bool{}
	for i, pm := range resp.Members {
		members[i] = plan.Member{ID: pm.ID, Name: pm.Name, PeerURLs: pm.PeerURLs, ClientURLs: pm.ClientURLs, IsLearner: pm.IsLearner}
		if len(pm.ClientURLs) == 0 {
			continue
		}
		url := pm.ClientURLs[0]
		urls[url] = true
		mc, err := lp.memberClient(url)
		if err != nil {
			lp.log.Warn("no etcd client for a member", "member", pm.Name, "url", url, "error", err)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, etcdproc.StatusTimeout)
			defer cancel()
			st, err := etcdproc.MemberStatusOf(sctx, mc, url)
			members[i].Healthy = err == nil
			if err == nil {
				members[i].RaftIndex = st.RaftIndex
				members[i].DBSize, members[i].DBSizeInUse = st.DbSize, st.DbSizeInUse
				// An answer without alarms decodes to nil errors; nil
				// means no answer to etcdproc.RaisedAlarms.
				statusErrs[i] = append([]string{}, st.Errors...)
			}
		}()
	}
	wg.Wait()
	for url, mc := range lp.memberConns {
		if !urls[url] {
			_ = mc.Close()
			delete(lp.memberConns, url)
		}
	}
	now := lp.now()
	for i := range members {
		m := &members[i]
		m.UnhealthyFor = lp.unhealthySince.Track(m.ID, !m.Healthy, now)
		m.LearnerFor = lp.learnerSince.Track(m.ID, m.IsLearner || m.Name == "", now)
	}
	lp.unhealthySince.Keep(members)
	lp.learnerSince.Keep(members)
	view.Members = members
	view.NoSpace, view.AlarmsKnown = etcdproc.RaisedAlarms(ctx, lp.client, statusErrs, etcdserverpb.AlarmType_NOSPACE)
	view.Corrupt, _ = etcdproc.RaisedAlarms(ctx, lp.client, statusErrs, etcdserverpb.AlarmType_CORRUPT)
	return view, nil
}

// memberClient returns a client of the member at url alone, made on
// first use and kept across cycles, so that each status reuses its
// connection (see etcdproc.MemberStatusOf); observeCluster closes those
// of members gone.
func (lp *loop) memberClient(url string) (*clientv3.Client, error) {
	if c, ok := lp.memberConns[url]; ok {
		return c, nil
	}
	c, err := etcdproc.NewClient([]string{url}, lp.env.EtcdTLS)
	if err != nil {
		return nil, err
	}
	lp.memberConns[url] = c
	return c, nil
}

func (lp *loop) setInfo(self plan.Node, member *etcdproc.MemberState, local etcdproc.MemberStatus, leader bool, procedure string) {
	info := peer.NodeInfo{
		NodeID:               self.ID,
		AgentVersion:         version.Get().Short(),
		ClusterName:          lp.cfg.ClusterName,
		PeerAddress:          self.Address,
		ClientURLs:           lp.cfg.ClientURLs,
		QuarantineClientURLs: lp.cfg.QuarantineClientURLs,
		PeerURLs:             lp.cfg.PeerURLs,
		Member:               member,
		HasData:              self.HasData,
		DataLost:             self.DataLost,
		PendingFor:           self.PendingFor,
		EtcdWanted:           self.EtcdWanted,
		EtcdHealthy:          self.Healthy,
		EtcdVersion:          self.Version,
		MemberID:             local.MemberID,
		ClusterID:            local.ClusterID,
		RaftLeader:           local.LeaderID,
		RaftIndex:            local.RaftIndex,
		SnapIndex:            self.SnapIndex,
		Revision:             self.Revision,
		StorageVersion:       self.StorageVersion,
		DowngradeTarget:      self.DowngradeTarget,
		IsLearner:            local.IsLearner,
		DBSize:               local.DBSize,
		Leader:               leader,
		Installed:            self.Installed,
		BackupKeys:           self.BackupKeys,
		LocalMembers:         toRefs(self.LocalMembers),
		Procedure:            procedure,
		NoLeaderFor:          self.NoLeaderFor,
		Cert:                 lp.env.Certs.Info(),
		CertMarker:           self.CertMarker,
		PeerCertCheckOff:     self.PeerCertCheckOff,
		Trust:                self.Trust,
		EtcdTrust:            self.EtcdTrust,
		CAFromDir:            self.CAFromDir,
		RestoreRoom:          self.RestoreRoom,
		HeldBy:               self.HeldBy,
		DataIndex:            self.DataIndex,
		InitialCheckFailed:   lp.initialCheckLine(),
		Unjudged:             self.Unjudged,
	}
	if leader {
		info.Failing = lp.failures.report()
		sort.Strings(info.Failing)
		info.Warnings = lp.warnings
		m := lp.maint
		info.Maintenance = &m
	}
	for _, off := range lp.offsets {
		info.MaxClockOffset = max(info.MaxClockOffset, off, -off)
	}
	if lp.untrusted != nil {
		info.LockRefused = lp.untrusted.Error()
	}
	lp.node.SetInfo(info, member)
}

// membershipOf is a node's recorded membership as the planner sees it.
func membershipOf(m *etcdproc.MemberState) *plan.Membership {
	if m == nil {
		return nil
	}
	return &plan.Membership{
		ClusterToken:    m.ClusterToken,
		EtcdVersion:     m.EtcdVersion,
		NewCluster:      m.NewCluster,
		HasRun:          m.HasRun,
		Pending:         m.Pending,
		Quarantined:     m.Quarantined,
		ForceNewCluster: m.ForceNewCluster,
		V2Until:         m.V2Until,
		Settings:        m.Settings,
		// An older agent's state has none: its etcd takes any peer
		// certificate from the CA.
		PeerCertHostname: m.PeerCertHostname,
	}
}

// observeNotServing fills in what a recover-quorum needs from an etcd
// that runs but serves no client. A member restarted while its cluster
// has no quorum never serves one: etcd serves clients only once it has
// published itself through raft, which needs a leader. Its peer port
// still lists the members its copy knows; and serving no client is
// seeing no leader, for as long. (An etcd that is still starting up
// counts as without a leader too; a recover-quorum also needs evidence
// from every other member, which a cluster with quorum never gives.)
func (lp *loop) observeNotServing(ctx context.Context, self *plan.Node, peerURL string) {
	if lp.peerHTTP == nil {
		lp.peerHTTP = etcdproc.NewPeerHTTPClient(lp.env.EtcdTLS)
	}
	pms, err := etcdproc.PeerMembers(ctx, lp.peerHTTP, peerURL)
	if err != nil {
		return
	}
	var ms []plan.Member
	for _, m := range pms {
		ms = append(ms, plan.Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, IsLearner: m.IsLearner})
	}
	self.LocalMembers = startedMembers(ms)
	self.NoLeaderFor = lp.noLeaderFor()
}

// noLeaderFor is how long this node's etcd has been seen without a raft
// leader, counting from now if it had one until now.
func (lp *loop) noLeaderFor() time.Duration {
	if lp.noLeaderSince.IsZero() {
		lp.noLeaderSince = lp.now()
	}
	return lp.now().Sub(lp.noLeaderSince)
}

// localMembers are the started members that etcd's own copy of the
// membership lists (a serializable read, which needs no quorum).
func localMembers(ctx context.Context, c *clientv3.Client) []plan.Member {
	ctx, cancel := context.WithTimeout(ctx, etcdproc.StatusTimeout)
	defer cancel()
	resp, err := c.MemberList(ctx, clientv3.WithSerializable())
	if err != nil {
		return nil
	}
	var ms []plan.Member
	for _, m := range resp.Members {
		ms = append(ms, plan.Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, IsLearner: m.IsLearner})
	}
	return startedMembers(ms)
}

// startedMembers keeps the members that have started (an unstarted one
// has no name yet), sorted by name.
func startedMembers(ms []plan.Member) []plan.Member {
	var out []plan.Member
	for _, m := range ms {
		if m.Name != "" {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func toRefs(ms []plan.Member) []peer.MemberRef {
	var out []peer.MemberRef
	for _, m := range ms {
		out = append(out, peer.MemberRef{Name: m.Name, PeerURLs: m.PeerURLs, IsLearner: m.IsLearner})
	}
	return out
}

func fromRefs(refs []peer.MemberRef) []plan.Member {
	var out []plan.Member
	for _, r := range refs {
		out = append(out, plan.Member{Name: r.Name, PeerURLs: r.PeerURLs, IsLearner: r.IsLearner})
	}
	return out
}

// initialCheckLine is what etcd said when its initial corruption check
// failed, while the node keeps it stopped; "" otherwise.
func (lp *loop) initialCheckLine() string {
	line, _ := lp.node.InitialCheckFailed()
	return line
}
