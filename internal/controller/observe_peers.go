package controller

import (
	"context"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

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
	announcedFrom := lp.env.Announced()
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
			if _, revoked := lp.revoked.Node(info.NodeID); revoked {
				return // its certificate is refused too; this is its word alone
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
		Member: membershipOf(info.Member), HasData: info.HasData, DataLost: info.DataLost, PendingFor: info.PendingFor,
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
	c, err := peer.Dial(addr, lp.cfg.ClusterName, lp.env.PeerCreds)
	if err != nil {
		return nil, err
	}
	lp.peers[addr] = c
	return c, nil
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
