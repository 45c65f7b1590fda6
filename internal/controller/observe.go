package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/status"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
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
	peersRead := false
	defer func() {
		leading := obs.Cluster != nil || obs.LockHeld
		procedure := ""
		if c := plan.ActiveExclusive(obs.Commands); c != nil && obs.LockHeld {
			procedure = c.Command.Kind()
			if p := c.Status.Restore; p != nil {
				procedure += " " + p.Phase
			}
		}
		lp.setInfo(self, member, local, leading, procedure)
		if peersRead {
			lp.announce(ctx, self, obs.Peers)
		}
		lp.page.Show(status.Build(obs, status.Facts{Cluster: lp.cfg.ClusterName, Node: lp.nodeID, Now: lp.now(), Procedure: procedure,
			Warnings: lp.warnings, Newest: lp.newestStored, Restorable: lp.restorable, Drills: lp.drillRecord}))
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
				for id, at := range lp.isolatedDefragFailed {
					if lp.now().Sub(at) < isolatedDefragRetry {
						if obs.IsolatedDefragFailed == nil {
							obs.IsolatedDefragFailed = map[string]bool{}
						}
						obs.IsolatedDefragFailed[id] = true
					}
				}
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
		due := func() bool { return b.due(lp.cfg.Backup.Interval, lp.capture.needsBase()) }
		obs.BackupDue = due()
		if obs.BackupDue && lp.noteStoredBackup(ctx, s, obs.Cluster.Token) {
			obs.BackupDue = due()
		}
		obs.BackedUpSinceChange = !b.lastOK.IsZero() && !b.lastOK.Before(lp.lastChange)
		obs.BackupFailedRecently = b.failedRecently()
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
		cmds, err := readCommands(ctx, s, lp.now())
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
		Address:        lp.peerAddress(),
		PeerURLs:       lp.cfg.PeerURLs,
		ClientURLs:     lp.cfg.ClientURLs,
		QuarantineURLs: lp.cfg.QuarantineClientURLs,
		Member:         membership(st.Member),
		Installed:      etcdproc.InstalledVersions(lp.cfg.EtcdBinDir),
		// The node certificate is renewed apart from the loop; the
		// marker never leaves it once there.
		CertMarker:       lp.certMarker(),
		PeerCertCheckOff: !lp.cfg.EtcdPeerCertCheck,
		BackupKeys:       lp.keys.IDs(),
		Trust:            lp.trustReport(),
		EtcdTrust:        lp.node.EtcdTrust(),
		CAFromDir:        lp.cfg.PKIDir != "" && lp.tlsEnabled(),
	}
	if room, err := lp.cfg.fetchOptions(nil, nil).Room(lp.cfg.DataDir); err == nil {
		self.RestoreRoom = max(room, 1) // 0 would mean unknown
	}
	if ci := lp.certInfo.Load(); ci != nil {
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
			obs.DefragWindowOpen = cs.Defrag.Effective().Open(lp.now())
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

// takeLock takes (or renews) the store lock while there is no cluster,
// and throughout a procedure, whose cluster comes and goes; it releases
// it otherwise. It never takes it on a store or with clocks it cannot
// trust. An error means the store cannot be read.
func (lp *loop) takeLock(ctx context.Context, s *store.Store, obs *plan.Observed, noCluster bool) error {
	obs.LockRefused = lp.lockRefused(ctx, s)
	want := obs.LockRefused == nil && (noCluster || plan.ActiveExclusive(obs.Commands) != nil)
	if !want {
		if lp.lease.Term() != 0 {
			if err := lp.lease.Release(ctx, s); err != nil {
				lp.log.Warn("cannot release the store lock; it expires with its lease", "error", err)
			}
		}
		return nil
	}
	prev := lp.lease.Term()
	term, err := lp.lease.Acquire(ctx, s)
	switch {
	case errors.Is(err, spec.ErrNewerFormat):
		obs.NewerFormat = err
	case err != nil:
		return err
	}
	obs.LockHeld = term != 0
	if term != 0 && term != prev {
		// A new term: every node it reaches refuses the older ones from
		// now on, whether this driver acts or not. A driver paused in a
		// step, which resumes, changes nothing on them.
		lp.procedures.FenceAll(ctx, *obs, term)
	}
	return nil
}

// lockRefused says why this agent may not take the store lock now, or
// nil. The store's create-if-absent is checked once (and again while the
// store cannot be reached); the clock offsets to the peers are those of
// this cycle.
func (lp *loop) lockRefused(ctx context.Context, s *store.Store) error {
	if !lp.storeChecked {
		err := lease.CheckCreateOnce(ctx, s, lp.node.ID())
		switch {
		case err == nil:
			lp.storeChecked = true
		case errors.Is(err, lease.ErrUntrustedStore):
			lp.storeChecked, lp.untrusted = true, err
		default:
			return fmt.Errorf("the store's create-if-absent is not checked yet: %w", err)
		}
	}
	if lp.untrusted != nil {
		return lp.untrusted
	}
	limit := lease.MaxClockOffset(lp.cfg.LeaderLease)
	// Stores keep modification times to the second.
	if off, storeLimit := lp.storeOffset, limit+time.Second; off > storeLimit || off < -storeLimit {
		return fmt.Errorf("controller: the backup store's clock is %s off this agent's, more than %s; leases compare clocks, so fix the clocks (NTP)",
			off.Round(time.Millisecond), storeLimit)
	}
	for id, off := range lp.offsets {
		if off > limit || off < -limit {
			return fmt.Errorf("controller: the clock of %s is %s off this agent's, more than %s (a fifth of --leader-lease); leases compare clocks, so fix the clocks (NTP)",
				id, off.Round(time.Millisecond), limit)
		}
	}
	return nil
}

// publishEvery is how often the agent publishes its record: often
// enough that a record older than a lease and this means a silent agent.
func (lp *loop) publishEvery() time.Duration {
	return min(publishInterval, lp.cfg.LeaderLease/2)
}

// publish writes this agent's record to the store, where other agents
// read what it last saw, and announces it to the discovery provider. It
// does so every publishEvery, and at once when what it reports changes.
func (lp *loop) publish(ctx context.Context, s *store.Store, self plan.Node) {
	// The installed versions let configure-cluster check a version on a
	// machine with no etcd; a change of them waits for the periodic
	// publish.
	rec := peer.Record{NodeID: self.ID, ClusterName: lp.cfg.ClusterName, Address: lp.peerAddress(), EtcdVersions: self.Installed,
		Etcd: &peer.EtcdReport{HasData: self.HasData, Healthy: self.Healthy, RaftLeader: self.RaftLeader, NoLeaderFor: self.NoLeaderFor}}
	if m := self.Member; m != nil {
		rec.Etcd.ClusterToken = m.ClusterToken
	}
	changed := lp.lastRecord == nil || func(a, b peer.EtcdReport) bool {
		a.NoLeaderFor, b.NoLeaderFor = 0, 0 // it grows every cycle; the periodic publish carries it
		return a != b
	}(*lp.lastRecord, *rec.Etcd)
	if lp.now().Sub(lp.lastPublish) < lp.publishEvery() && !changed {
		return
	}
	sent := time.Now().Add(testhook.Offset())
	if err := peer.PublishToStore(ctx, s, rec, lp.now()); err != nil {
		lp.log.Warn("cannot publish this agent's record to the store", "error", err)
		return
	}
	// The store's clock, from the record just written: an agent that
	// reaches no peer still measures its clock against a common one.
	if mt, err := s.ModTime(ctx, peer.DiscoveryPrefix+self.ID); err == nil {
		if off, ok := lease.ClockOffset(mt, sent, time.Now().Add(testhook.Offset()), lease.MaxClockOffset(lp.cfg.LeaderLease)); ok {
			lp.storeOffset = off
		}
	}
	if lp.cfg.Discovery != "store" {
		if err := lp.discovery.Publish(ctx, rec); err != nil {
			lp.log.Warn("cannot publish this agent for discovery", "error", err)
			return
		}
	}
	lp.lastPublish, lp.lastRecord = lp.now(), rec.Etcd
}

// records reads what every agent last published, for evidence; the error
// is set when the store did not answer for some of them, so that the
// records may be incomplete.
func (lp *loop) records(ctx context.Context, s *store.Store) ([]plan.Record, error) {
	recs, err := peer.StoreRecords(ctx, s, peer.ReadLimits{Max: lp.cfg.DiscoveryMaxRecords, Now: lp.now()})
	var unreachable error
	if err != nil {
		lp.log.Warn("some agents' records cannot be read", "error", err)
		if errors.Is(err, store.ErrUnreachable) {
			unreachable = err
		}
	}
	now := lp.now()
	out := make([]plan.Record, 0, len(recs))
	for _, r := range recs {
		pr := plan.Record{NodeID: r.NodeID, Address: r.Address, Age: now.Sub(r.Updated)}
		if r.Updated.IsZero() {
			pr.Age = time.Duration(math.MaxInt64)
		}
		if e := r.Etcd; e != nil {
			pr.ClusterToken, pr.HasData, pr.Healthy, pr.RaftLeader, pr.NoLeaderFor = e.ClusterToken, e.HasData, e.Healthy, e.RaftLeader, e.NoLeaderFor
		}
		out = append(out, pr)
	}
	return out, unreachable
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
		mu      sync.Mutex
		wg      sync.WaitGroup
		nodes   = map[string]plan.Node{self.ID: self}
		offsets = map[string]time.Duration{}
		obeyed  = lp.node.ObeyedTerm()
	)
	defer func() { lp.offsets, lp.termFloor = offsets, max(lp.termFloor, obeyed) }()
	// Agents that left: close their clients (not when discovery failed,
	// which says nothing about who left).
	for addr, c := range lp.peers {
		if len(recs) > 0 && !addrs[addr] {
			_ = c.Close()
			delete(lp.peers, addr)
		}
	}
	announcedFrom := lp.takeAnnouncedFrom()
	for addr := range addrs {
		c, err := lp.peerClient(addr)
		if err != nil {
			continue
		}
		if host, _, err := net.SplitHostPort(addr); err == nil && announcedFrom[host] {
			c.Redial()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, peerCallTimeout)
			defer cancel()
			sent := time.Now().Add(testhook.Offset()) // a test may move this agent's clock
			info, err := c.Info(cctx)
			received := time.Now().Add(testhook.Offset())
			if err != nil || info.NodeID == "" || info.NodeID == self.ID || info.ClusterName != lp.cfg.ClusterName {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			nodes[info.NodeID] = nodeFromInfo(addr, info)
			if off, ok := lease.ClockOffset(info.Now, sent, received, lease.MaxClockOffset(lp.cfg.LeaderLease)/2); ok {
				offsets[info.NodeID] = off
			} else if prev, had := lp.offsets[info.NodeID]; had {
				offsets[info.NodeID] = prev // a slow call: keep the last good sample
			}
			obeyed = max(obeyed, info.ObeyedTerm)
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
	n := plan.Node{
		ID: info.NodeID, Address: addr, PeerURLs: info.PeerURLs, ClientURLs: info.ClientURLs, QuarantineURLs: info.QuarantineClientURLs,
		Member: membership(info.Member), HasData: info.HasData, DataLost: info.DataLost, PendingFor: info.PendingFor,
		EtcdWanted: info.EtcdWanted, Healthy: info.EtcdHealthy, Version: info.EtcdVersion,
		MemberID: info.MemberID, RaftLeader: info.RaftLeader, RaftIndex: info.RaftIndex, SnapIndex: info.SnapIndex, Revision: info.Revision, Installed: info.Installed, BackupKeys: info.BackupKeys,
		StorageVersion: info.StorageVersion, DowngradeTarget: info.DowngradeTarget, LocalMembers: fromRefs(info.LocalMembers),
		NoLeaderFor: info.NoLeaderFor, CertMarker: info.CertMarker, PeerCertCheckOff: info.PeerCertCheckOff,
		Trust: info.Trust, EtcdTrust: info.EtcdTrust, CAFromDir: info.CAFromDir, RestoreRoom: info.RestoreRoom,
		HeldBy: info.HeldBy, DataIndex: info.DataIndex, InitialCheckFailed: info.InitialCheckFailed != "", Unjudged: info.Unjudged,
	}
	if info.Cert != nil {
		n.CertCA = info.Cert.CAFingerprint
	}
	return n
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
				// means no answer to raisedAlarms.
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
		m.UnhealthyFor = lp.unhealthySince.track(m.ID, !m.Healthy, now)
		m.LearnerFor = lp.learnerSince.track(m.ID, m.IsLearner || m.Name == "", now)
	}
	lp.unhealthySince.keep(members)
	lp.learnerSince.keep(members)
	view.Members = members
	view.NoSpace, view.AlarmsKnown = raisedAlarms(ctx, lp.client, statusErrs, etcdserverpb.AlarmType_NOSPACE)
	view.Corrupt, _ = raisedAlarms(ctx, lp.client, statusErrs, etcdserverpb.AlarmType_CORRUPT)
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
	c, err := etcdproc.NewClient([]string{url}, lp.etcdTLS)
	if err != nil {
		return nil, err
	}
	lp.memberConns[url] = c
	return c, nil
}

// alarmRE finds an alarm among the errors of etcd's status
// ("memberID:<id> alarm:NOSPACE").
var alarmRE = regexp.MustCompile(`memberID:\s*(\d+)\s+alarm:\s*([A-Z]+)`)

// raisedAlarms are the members with etcd's alarm raised, read from the
// errors of the members' status, which list the cluster's alarms; known
// is false when no member answered. (etcd's alarm list is a raft
// request: not something to send every cycle.) Only when a status names
// the alarm without a member does the alarm list answer.
func raisedAlarms(ctx context.Context, c alarmLister, statusErrs [][]string, alarm etcdserverpb.AlarmType) (ids []uint64, known bool) {
	name := alarm.String()
	mentioned := false
	for _, errs := range statusErrs {
		if errs != nil {
			known = true
		}
		for _, e := range errs {
			if !strings.Contains(e, name) {
				continue
			}
			mentioned = true
			for _, m := range alarmRE.FindAllStringSubmatch(e, -1) {
				if m[2] != name {
					continue
				}
				if id, err := strconv.ParseUint(m[1], 10, 64); err == nil && !slices.Contains(ids, id) {
					ids = append(ids, id)
				}
			}
		}
	}
	if !mentioned || len(ids) > 0 {
		return ids, known || len(ids) > 0
	}
	actx, cancel := context.WithTimeout(ctx, etcdproc.StatusTimeout)
	defer cancel()
	alarms, err := c.AlarmList(actx)
	if err != nil {
		return nil, false
	}
	for _, a := range alarms.Alarms {
		if a.Alarm == alarm {
			ids = append(ids, a.MemberID)
		}
	}
	return ids, true
}

// alarmLister lists etcd's alarms.
type alarmLister interface {
	AlarmList(ctx context.Context) (*clientv3.AlarmResponse, error)
}

// since remembers, per etcd member, when a condition was first seen to
// hold, as long as it goes on holding.
type since map[uint64]time.Time

// track returns how long the condition has held for member id, 0 when it
// does not hold now.
func (s since) track(id uint64, holds bool, now time.Time) time.Duration {
	if !holds {
		delete(s, id)
		return 0
	}
	t, ok := s[id]
	if !ok {
		t = now
		s[id] = now
	}
	return now.Sub(t)
}

// keep forgets members that are gone.
func (s since) keep(members []plan.Member) {
	for id := range s {
		if !slices.ContainsFunc(members, func(m plan.Member) bool { return m.ID == id }) {
			delete(s, id)
		}
	}
}

func (lp *loop) setInfo(self plan.Node, member *etcdproc.MemberState, local etcdproc.MemberStatus, leader bool, procedure string) {
	info := peer.NodeInfo{
		NodeID:               self.ID,
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
		Cert:                 lp.certInfo.Load(),
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

// membership is a node's recorded membership as the planner sees it.
func membership(m *etcdproc.MemberState) *plan.Membership {
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
		lp.peerHTTP = etcdproc.NewPeerHTTPClient(lp.etcdTLS)
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

// storedBackupReads bounds the metas noteStoredBackup reads.
const storedBackupReads = 10

// noteStoredBackup reads the newest full backup of the cluster token from
// the store, before this agent takes one because one is due: a backup
// another agent took (an earlier leader, the driver of a restore) counts
// as this agent's own, so that a change of leader, or a restore's end,
// does not start a second full backup at once. It reports whether it
// found one.
func (lp *loop) noteStoredBackup(ctx context.Context, s *store.Store, token string) bool {
	in, err := backup.Newest(ctx, s, func(m backup.Meta) bool { return m.ClusterToken == token }, storedBackupReads)
	if err != nil {
		lp.log.Warn("cannot read the newest backup from the store; taking the backup that seems due", "error", err)
		return false
	}
	if in == nil {
		return false
	}
	at := time.Unix(int64(in.Meta.Timestamp), 0)
	lp.backups.stored(at)
	lp.capture.baseStored(at)
	return true
}

// announce tells the agents that answered this cycle that this node's
// own state changed (it started, its etcd joined, left or came up), so
// that the leader's agent looks again at once rather than on its next
// tick. It runs once the cycle's info is set: an agent told earlier could
// read the node's info from before the change, see nothing to do, and
// wait for its tick. (A node restarted without its data serves no info
// until its first cycle ends, and was replaced up to a tick later.)
// Agents that did not answer are left out, so that one cut off cannot
// hold the cycle up twice.
func (lp *loop) announce(ctx context.Context, self plan.Node, peers []plan.Node) {
	state := announcedState(self)
	if state == lp.announced {
		return
	}
	lp.announced = state
	var wg sync.WaitGroup
	for _, p := range peers {
		c, ok := lp.peers[p.Address]
		if p.ID == self.ID || !ok {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, peerCallTimeout)
			defer cancel()
			_, _ = c.Announce(cctx) // best effort: the peer's tick reads the change anyway
		})
	}
	wg.Wait()
}

// announcedState is what of a node's own state its peers are told of when
// it changes: its membership, and whether its etcd has data and serves.
func announcedState(self plan.Node) string {
	m := "standby"
	if self.Member != nil {
		m = fmt.Sprintf("%s pending=%t quarantined=%t", self.Member.ClusterToken, self.Member.Pending, self.Member.Quarantined)
	}
	return fmt.Sprintf("%s data=%t healthy=%t", m, self.HasData, self.Healthy)
}

// initialCheckLine is what etcd said when its initial corruption check
// failed, while the node keeps it stopped; "" otherwise.
func (lp *loop) initialCheckLine() string {
	line, _ := lp.node.InitialCheckFailed()
	return line
}
