package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
)

// Corrupt data. etcd's initial corruption check (on by default, see
// etcdproc.ManagedArgs) compares a starting member's data with its peers'
// and refuses to start when they differ, saying "found data
// inconsistency with peers" (the words of every etcd from 3.4 to 3.7).
// Restarting it would only fail again. The node moves such data to its
// trash instead: the member then counts as having lost its data, and the
// leader removes it and adds this node back, to sync afresh from its
// healthy peers (never from a backup).

// corruptPhrase is what etcd prints when its initial check fails.
const corruptPhrase = "found data inconsistency with peers"

// outputScanner passes etcd's output through to out, and calls found
// once for each line holding corruptPhrase. Lines are bounded: a longer
// one is scanned in pieces.
type outputScanner struct {
	out   io.Writer
	found func(line string)
	mu    sync.Mutex
	buf   []byte
}

const maxScanLine = 64 << 10

func (s *outputScanner) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 && len(s.buf) < maxScanLine {
			break
		}
		if i < 0 {
			i = len(s.buf) - 1
		}
		line := s.buf[:i+1]
		if bytes.Contains(line, []byte(corruptPhrase)) {
			s.found(string(bytes.TrimSpace(line)))
		}
		s.buf = s.buf[i+1:]
	}
	s.buf = bytes.Clone(s.buf)
	s.mu.Unlock()
	return s.out.Write(p)
}

// etcdOutput is where the node's etcd writes: the agent's stderr, scanned
// for a failed corruption check.
func (n *Node) etcdOutput() io.Writer {
	return &outputScanner{out: os.Stderr, found: func(line string) {
		n.corrupt.Store(&line)
		n.poke()
	}}
}

// CorruptData reports etcd's refusal to start on data that differs from
// its peers', if it was seen since the data was last set aside.
func (n *Node) CorruptData() (string, bool) {
	if p := n.corrupt.Load(); p != nil {
		return *p, true
	}
	return "", false
}

// StopForFailedCheck stops etcd once its initial corruption check failed
// and keeps it stopped, keeping the data: the check fails on a mismatch
// with any peer, so it does not say which copy is damaged, and the
// member's data may be the good one while a peer's (the leader's, even)
// is not. The leader judges by the majority: every member's HashKV, this
// one's read from its database (HashData). Then it has this member start
// again without the check (Resume), or sets its data aside (DiscardData).
func (n *Node) StopForFailedCheck(ctx context.Context) error {
	line, ok := n.CorruptData()
	if !ok || n.checkFailed.Load() != nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state.Member == nil {
		n.corrupt.Store(nil)
		return nil
	}
	if err := n.proc.StopWithin(ctx, replacedStopGrace); err != nil {
		return fmt.Errorf("node: stop etcd after its failed initial check: %w", err)
	}
	n.checkFailed.Store(&line)
	n.checkFailedAt.Store(n.now().UnixNano())
	n.refreshInfoMember()
	n.log.Error("etcd found its data differs from a peer's (its initial corruption check); etcd stays stopped, its data kept, until the leader compares every member's data and rebuilds the minority",
		"cluster-token", n.state.Member.ClusterToken, "etcd-said", line)
	return nil
}

// InitialCheckFailed is what etcd said when its initial corruption check
// failed, while the node keeps it stopped for the leader to judge.
func (n *Node) InitialCheckFailed() (string, bool) {
	if p := n.checkFailed.Load(); p != nil {
		return *p, true
	}
	return "", false
}

// InitialCheckFailedFor is how long etcd has been kept stopped after its
// failed initial check; 0 when it is not.
func (n *Node) InitialCheckFailedFor() time.Duration {
	if n.checkFailed.Load() == nil {
		return 0
	}
	return max(n.now().Sub(time.Unix(0, n.checkFailedAt.Load())), time.Nanosecond)
}

// UnjudgedFor is how long after this member started without its initial
// check, with no leader to judge it (ResumeUnjudged), the leader is asked
// to compare its data: until then it reports itself unjudged.
const UnjudgedFor = 10 * time.Minute

// ResumeUnjudged starts etcd without its initial check when no leader can
// judge the failed check: the other members' etcd do not serve either
// (they may have failed theirs against the same damaged peer). Kept
// stopped, no cluster would ever serve; started, the data stays as it is,
// and the leader compares every member's HashKV once there is one
// (Unjudged), setting aside the minority's.
func (n *Node) ResumeUnjudged(ctx context.Context, reason string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	line := n.checkFailed.Load()
	if line == nil || n.state.Member == nil {
		return nil
	}
	n.checkFailed.Store(nil)
	n.corrupt.Store(nil)
	n.unjudgedUntil.Store(n.now().Add(UnjudgedFor).UnixNano())
	n.quietStart = true
	defer func() { n.quietStart = false }()
	n.log.Warn("no leader can judge etcd's failed initial check; starting etcd without it, and the leader compares every member's data once the cluster has one",
		"cluster-token", n.state.Member.ClusterToken, "reason", reason, "etcd-said", *line)
	defer n.poke()
	return n.startEtcdLocked(ctx)
}

// Unjudged says whether this member started without its initial check,
// with no leader to judge it, and the leader is to compare its data.
func (n *Node) Unjudged() bool { return n.now().UnixNano() < n.unjudgedUntil.Load() }

// HashData serves the peer API: the HashKV of this member's data at
// req.Revision, read from its database while etcd does not run.
func (n *Node) HashData(_ context.Context, req peer.HashDataRequest) (peer.DataHash, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.state.Member
	if m == nil || m.ClusterToken != req.Token || !n.layout.HasEtcdData(req.Token) {
		return peer.DataHash{}, fmt.Errorf("node: hash the data of cluster %s: this node holds none of it", req.Token)
	}
	if n.proc.Status().PID != 0 {
		return peer.DataHash{}, errors.New("node: hash the data: etcd runs; ask it for its HashKV")
	}
	dir, err := n.layout.EtcdDataDir(req.Token)
	if err != nil {
		return peer.DataHash{}, err
	}
	h, err := etcdproc.HashOffline(dir, req.Revision)
	if err != nil {
		return peer.DataHash{}, err
	}
	return peer.DataHash{Hash: h.Hash, CompactRevision: h.CompactRevision, Revision: h.Revision, CurrentRevision: h.CurrentRevision}, nil
}

// Resume serves the peer API: the leader found that this member's data,
// whose initial check failed, agrees with the majority's. etcd starts once
// without the check, which compared it with a damaged peer.
func (n *Node) Resume(ctx context.Context, req peer.ResumeRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.state.Member
	if m == nil || m.ClusterToken != req.Token {
		return fmt.Errorf("node: resume etcd of cluster %s: this node is not its member", req.Token)
	}
	if id, err := n.memberIDLocked(); err != nil || id != req.MemberID {
		return fmt.Errorf("node: resume etcd of member %x: this node's member is %x (%v)", req.MemberID, id, err)
	}
	if n.checkFailed.Load() == nil {
		return nil
	}
	n.checkFailed.Store(nil)
	n.corrupt.Store(nil)
	n.unjudgedUntil.Store(0)
	n.quietStart = true
	defer func() { n.quietStart = false }()
	n.log.Warn("the leader found this member's data agrees with the majority's; starting etcd without its initial check, which compared it with a damaged peer",
		"cluster-token", m.ClusterToken, "leader", req.LeaderID, "reason", req.Reason)
	defer n.poke()
	return n.startEtcdLocked(ctx)
}

// memberIDLocked is this node's etcd member ID: from its running etcd's
// status as last observed, else from its data, by its name. Callers hold
// n.mu.
func (n *Node) memberIDLocked() (uint64, error) {
	n.infoMu.Lock()
	id := n.info.MemberID
	n.infoMu.Unlock()
	if id != 0 {
		return id, nil
	}
	m := n.state.Member
	if m == nil || n.proc.Status().PID != 0 {
		return 0, errors.New("node: the member ID is not known yet")
	}
	dir, err := n.layout.EtcdDataDir(m.ClusterToken)
	if err != nil {
		return 0, err
	}
	pos, err := etcdproc.ReadPosition(dir)
	if err != nil {
		return 0, err
	}
	for _, mm := range pos.Members {
		if mm.Name == n.state.NodeID {
			return mm.ID, nil
		}
	}
	return 0, fmt.Errorf("node: its data lists no member named %s", n.state.NodeID)
}

// DiscardData serves the peer API: the leader found this member's data
// disagrees with the majority of its peers' (their HashKV at one
// revision). etcd stops at once, so that no client reads from it, and the
// data goes to the trash, keeping the membership: the leader removes the
// member and rebuilds it from its peers.
func (n *Node) DiscardData(ctx context.Context, req peer.DiscardRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.state.Member
	if m == nil || m.ClusterToken != req.Token {
		return fmt.Errorf("node: discard data of cluster %s: this node is not its member", req.Token)
	}
	// The member ID is checked whatever etcd does: a request meant for
	// an earlier member of this node discards nothing.
	memberID, err := n.memberIDLocked()
	if err != nil {
		return fmt.Errorf("node: discard data of member %x: %w", req.MemberID, err)
	}
	if memberID != req.MemberID {
		return fmt.Errorf("node: discard data of member %x: this node's etcd is member %x", req.MemberID, memberID)
	}
	trashed, err := n.discardLocked(ctx, m.ClusterToken)
	if err != nil {
		return err
	}
	n.checkFailed.Store(nil)
	n.corrupt.Store(nil)
	n.log.Error("the leader found this member's data disagrees with its peers'; the data is moved to the trash, and the leader rebuilds this member from its peers",
		"cluster-token", m.ClusterToken, "leader", req.LeaderID, "reason", req.Reason, "data-moved-to", trashed)
	n.discarded(DiscardHashMismatch, trashed, req.Reason)
	defer n.poke()
	return nil
}

// discardLocked stops etcd and moves the member's data to the trash,
// keeping the membership. Callers hold n.mu.
func (n *Node) discardLocked(ctx context.Context, token string) (string, error) {
	if err := n.proc.Stop(ctx); err != nil {
		return "", fmt.Errorf("node: stop etcd to set its data aside: %w", err)
	}
	trashed, err := n.layout.Trash(token, n.now())
	if err != nil {
		return "", err
	}
	n.refreshInfoMember()
	return trashed, nil
}

// checkData checks a member's database before etcd starts on it again
// after an unclean exit (the supervisor's hook). Damaged data is treated
// as lost: it is moved to the trash, etcd is not started on it, and the
// leader rebuilds the member from its peers.
func (n *Node) checkData(ctx context.Context, sp etcdproc.Spec) error {
	n.log.Warn("etcd did not exit cleanly; checking its database before starting it again", "data-dir", sp.DataDir)
	check := n.cfg.CheckData
	if check == nil {
		check = etcdproc.CheckData
	}
	res, err := check(ctx, sp.DataDir)
	if err == nil {
		n.log.Info("etcd's database is consistent", "path", res.Path, "size", res.Size, "revision", res.Revision, "took", res.Took.Round(time.Millisecond))
		return nil
	}
	if !errors.Is(err, etcdproc.ErrDamagedData) {
		return fmt.Errorf("node: check etcd's data before a restart: %w", err)
	}
	trashed, terr := n.layout.Trash(sp.ClusterToken, n.now())
	if terr != nil {
		return fmt.Errorf("node: move damaged data to the trash: %w (the damage: %w)", terr, err)
	}
	n.log.Error("etcd's database is damaged; not starting etcd on it: the data is moved to the trash, and the leader rebuilds this member from its peers",
		"cluster-token", sp.ClusterToken, "data-moved-to", trashed, "error", err)
	n.discarded(DiscardDamagedDB, trashed, err.Error())
	n.poke()
	return nil
}

// initialCheckUseful says whether etcd's initial corruption check can
// compare this member's data with a peer's: a new member's always runs,
// and a restarted member's only when another member's etcd serves its
// peer port now. When the whole cluster restarts at once, no peer serves
// (each waits in its own check before it does), and the check would only
// hold every member back by etcd's request timeout per peer (7 s with
// the default election timeout) without comparing anything. Callers hold
// n.mu.
func (n *Node) initialCheckUseful(m *etcdproc.MemberState) bool {
	if !m.HasRun || m.NewCluster {
		return true
	}
	if n.peerHTTP == nil {
		n.peerHTTP = etcdproc.NewPeerHTTPClient(n.cfg.ClientTLS)
	}
	for _, p := range strings.Split(m.InitialCluster, ",") {
		name, url, ok := strings.Cut(p, "=")
		if !ok || name == n.state.NodeID || slices.Contains(n.cfg.PeerURLs, url) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := etcdproc.PeerMembers(ctx, n.peerHTTP, url)
		cancel()
		if err == nil {
			return true
		}
	}
	n.log.Info("no peer's etcd serves: starting etcd without its initial corruption check, which would have no peer to compare with",
		"cluster-token", m.ClusterToken)
	return false
}
