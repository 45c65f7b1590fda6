package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
)

// defragReserve is the free space a defragmentation leaves on the data
// disk beyond the compact copy etcd writes.
const defragReserve = 64 << 20

// isolatedStartTimeout bounds how long etcd may take to serve again
// after each restart around a defragmentation.
const isolatedStartTimeout = time.Minute

// Defrag serves the peer API: defragment this member's database with its
// clients held off. A member defragmenting holds every request sent to it
// until it is done, and clients of plain gRPC round-robin keep sending to
// it, so each of their writers stalls in turn. So etcd restarts serving
// only its quarantine client URLs, where ordinary clients cannot reach
// it: they find its port closed and go to the other members at once. It
// is defragmented there, through the quarantine URL, and restarts on its
// usual URLs. It stays a voting, replicating member throughout, but for
// the two restarts. The leader asks for this only while the other
// members keep quorum without it.
func (n *Node) Defrag(ctx context.Context, req peer.DefragRequest) (peer.DefragResult, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.state.Member
	if m == nil || m.ClusterToken != req.Token {
		return peer.DefragResult{}, fmt.Errorf("node: defragment a member of cluster %s: this node is not its member", req.Token)
	}
	if m.Quarantined {
		return peer.DefragResult{}, errors.New("node: defragment: this member is quarantined")
	}
	n.infoMu.Lock()
	memberID := n.info.MemberID
	n.infoMu.Unlock()
	if memberID == 0 || memberID != req.MemberID {
		return peer.DefragResult{}, fmt.Errorf("node: defragment member %x: this node's etcd is member %x", req.MemberID, memberID)
	}
	if !n.proc.Status().Wanted {
		return peer.DefragResult{}, errors.New("node: defragment: etcd is not running here")
	}
	dataDir, err := n.layout.EtcdDataDir(m.ClusterToken)
	if err != nil {
		return peer.DefragResult{}, fmt.Errorf("node: defragment: %w", err)
	}
	db := etcdproc.DBPath(dataDir)
	st, err := os.Stat(db)
	if err != nil {
		return peer.DefragResult{}, fmt.Errorf("node: defragment: %w", err)
	}
	// etcd writes a compact copy beside the file: room for what is in
	// use, or without an estimate, for the whole file.
	need := req.InUseBytes
	if need <= 0 || need > st.Size() {
		need = st.Size()
	}
	if free, err := etcdproc.FreeBytes(dataDir); err == nil && free < need+defragReserve {
		return peer.DefragResult{}, fmt.Errorf("node: defragment: %s has %d bytes free; etcd's compact copy of %s needs about %d, and %d more are kept in reserve",
			dataDir, free, db, need, defragReserve)
	}

	start := n.now()
	n.log.Info("restarting etcd on its quarantine client URLs to defragment it", "leader", req.LeaderID, "db-size", st.Size(), "in-use", req.InUseBytes)
	defer n.poke()
	n.isolated, n.quietStart = true, true
	res, derr := n.defragIsolatedLocked(ctx)
	n.isolated = false
	// Serve clients again even when the caller gave up.
	serr := n.startEtcdLocked(context.WithoutCancel(ctx))
	n.quietStart = false
	res.Took = n.now().Sub(start)
	switch {
	case derr != nil && serr != nil:
		return res, fmt.Errorf("node: defragment: %w; and etcd did not start again: %w", derr, serr)
	case derr != nil:
		return res, fmt.Errorf("node: defragment (etcd serves its clients again): %w", derr)
	case serr != nil:
		return res, fmt.Errorf("node: start etcd after defragmenting: %w", serr)
	}
	n.log.Info("etcd defragmented, and serves its clients again", "db-size-before", res.SizeBefore, "db-size-after", res.SizeAfter, "took", res.Took.Round(time.Millisecond))
	return res, nil
}

// defragIsolatedLocked restarts etcd on its quarantine client URLs and
// defragments it there. Callers hold n.mu and set n.isolated.
func (n *Node) defragIsolatedLocked(ctx context.Context) (peer.DefragResult, error) {
	var res peer.DefragResult
	if err := n.startEtcdLocked(ctx); err != nil {
		return res, err
	}
	ps := n.proc.Status()
	if ps.Spec == nil {
		return res, errors.New("node: defragment: etcd is not running")
	}
	endpoint := ps.Spec.ServedClientURL()
	c, err := etcdproc.NewClient([]string{endpoint}, n.cfg.ClientTLS)
	if err != nil {
		return res, err
	}
	defer c.Close()
	wctx, cancel := context.WithTimeout(ctx, isolatedStartTimeout)
	defer cancel()
	for {
		st, err := c.Status(wctx, endpoint)
		if err == nil {
			res.SizeBefore = st.DbSize
			break
		}
		select {
		case <-wctx.Done():
			return res, fmt.Errorf("node: defragment: etcd does not serve on %s: %w", endpoint, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := c.Defragment(ctx, endpoint); err != nil {
		return res, fmt.Errorf("node: defragment on %s: %w", endpoint, err)
	}
	if st, err := c.Status(ctx, endpoint); err == nil {
		res.SizeAfter = st.DbSize
	}
	return res, nil
}
