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
// disk beyond its compact copy.
const defragReserve = 64 << 20

// Defrag serves the peer API: defragment this member's database with its
// clients held off, and without a burst of writes that the other members
// feel. etcd's own defragmentation holds every request sent to the member
// until it is done, so clients of plain gRPC round-robin stall in turn;
// and it writes its whole compact copy in one transaction, whose single
// fsync holds back every other writer of a shared disk for as long as the
// copy takes to reach it (the other members' WAL fsyncs, and so every
// write of the cluster). So the agent stops etcd, whose clients then find
// its port closed and go to the other members at once; copies the
// database offline, a few MiB per fsynced transaction; and starts etcd
// again. The member misses only what the others commit meanwhile, which
// the leader sends on as it returns. The leader asks for this only while
// the other members keep quorum without it.
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
	// The compact copy is written beside the file: room for what is in
	// use, or without an estimate, for the whole file.
	need := req.InUseBytes
	if need <= 0 || need > st.Size() {
		need = st.Size()
	}
	if free, err := etcdproc.FreeBytes(dataDir); err == nil && free < need+defragReserve {
		return peer.DefragResult{}, fmt.Errorf("node: defragment: %s has %d bytes free; the compact copy of %s needs about %d, and %d more are kept in reserve",
			dataDir, free, db, need, defragReserve)
	}

	start := n.now()
	n.log.Info("stopping etcd to defragment its database offline", "leader", req.LeaderID, "db-size", st.Size(), "in-use", req.InUseBytes)
	defer n.poke()
	// etcd restarts on data it served a moment ago: its initial
	// corruption check would read the whole keyspace for nothing.
	n.quietStart = true
	var res peer.DefragResult
	derr := n.proc.Stop(ctx)
	if derr == nil {
		compact := n.cfg.CompactDB
		if compact == nil {
			compact = func(ctx context.Context, dataDir string) (etcdproc.Compaction, error) {
				return etcdproc.CompactDB(ctx, dataDir, 0)
			}
		}
		var c etcdproc.Compaction
		// The leader ends ctx when the cluster degrades meanwhile: the
		// copy stops, and etcd starts again on the database as it was.
		c, derr = compact(ctx, dataDir)
		res.SizeBefore, res.SizeAfter = c.SizeBefore, c.SizeAfter
	}
	if errors.Is(derr, etcdproc.ErrDamagedData) {
		// The copy read every page in use, and found damage: as after an
		// unclean exit, etcd does not start on it again.
		n.quietStart = false
		return res, n.discardDamagedLocked(m.ClusterToken, derr)
	}
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

// discardDamagedLocked moves the member's data, which a defragmentation's
// copy found damaged, to the trash, as the start-up check does: etcd
// stays stopped, and the leader rebuilds the member from its peers.
// Callers hold n.mu, with etcd stopped.
func (n *Node) discardDamagedLocked(token string, damage error) error {
	trashed, err := n.layout.Trash(token, n.now())
	if err != nil {
		return fmt.Errorf("node: defragment: move damaged data to the trash: %w (the damage: %w)", err, damage)
	}
	n.refreshInfoMember()
	n.log.Error("etcd's database is damaged: its copy for a defragmentation failed; not starting etcd on it: the data is moved to the trash, and the leader rebuilds this member from its peers",
		"cluster-token", token, "data-moved-to", trashed, "error", damage)
	n.discarded(DiscardDamagedDB, trashed, damage.Error())
	return fmt.Errorf("node: defragment: %w; the data is moved to %s, and the leader rebuilds this member from its peers", damage, trashed)
}
