package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

// Config is what the node needs of the agent's configuration.
type Config struct {
	// Transfer is this node's long transfer in progress (nil: none), which
	// Info reports live; nil reports none.
	Transfer             func() *spec.Transfer
	DataDir              string
	EtcdBinDir           string
	ClientURLs           []string
	QuarantineClientURLs []string
	// ListenClientURLs are bound instead of ClientURLs outside
	// quarantine, when set.
	ListenClientURLs []string
	PeerURLs         []string
	// ListenPeerURLs are the addresses etcd binds for peer traffic when
	// they differ from the PeerURLs it advertises; empty binds PeerURLs.
	ListenPeerURLs []string
	// EtcdSnapshotCount is etcd's --snapshot-count; 0 keeps etcd's own.
	EtcdSnapshotCount int
	// EtcdCorruptCheckInterval is how often etcd's periodic corruption
	// check runs (0: never); its initial and compact hash checks are
	// always on.
	EtcdCorruptCheckInterval time.Duration
	EtcdStopTimeout          time.Duration
	// EtcdTLS are the files etcd serves with; nil runs it over plain http.
	EtcdTLS *etcdproc.TLSFiles
	// PeerCertCheckOff refuses the leader's requests to have etcd require
	// the node marker of peer certificates: the agent asked for the check
	// off (--etcd-peer-cert-check=false).
	PeerCertCheckOff bool
	// ClientTLS is the TLS of this node's own calls to its etcd; nil with
	// plain http.
	ClientTLS *tls.Config
	// CheckData checks a member's database after an unclean exit; nil
	// checks in this process (etcdproc.CheckData).
	CheckData etcdproc.DataChecker
	// CompactDB defragments the member's database offline for an
	// isolated defragmentation; nil copies in this process
	// (etcdproc.CompactDB), where the copy cannot be stopped midway.
	CompactDB etcdproc.Compactor
	// CA takes up the store's CA and trust for a CA rotation; nil
	// without TLS.
	CA CAKeeper
	// OnDiscard, when set, is told each time the node sets its member's
	// data aside as damaged or divergent: why (one of the Discard*
	// reasons), where the data went, and what was wrong.
	OnDiscard func(reason, movedTo, detail string)
}

// Why a node set its member's data aside.
const (
	DiscardInitialCheck = "initial-check" // kept for the metric's series; the failed check is judged by the leader (DiscardHashMismatch)
	DiscardDamagedDB    = "damaged-db"    // the database failed its check after an unclean exit
	DiscardHashMismatch = "hash-mismatch" // the leader found its HashKV disagrees with the majority
)

// discarded tells OnDiscard, when set.
func (n *Node) discarded(reason, movedTo, detail string) {
	if n.cfg.OnDiscard != nil {
		n.cfg.OnDiscard(reason, movedTo, detail)
	}
}

// CAKeeper keeps the node's certificate files as the store says: the
// CA that issues its certificate and the CAs it trusts.
type CAKeeper interface {
	// Sync reads the store's CA and trust again and writes them to the
	// node's files, refusing when they are not the ones the leader read
	// (trust and issuer, SHA-256 fingerprints).
	Sync(ctx context.Context, trust []string, issuer string) error
}

// BackupFetcher fetches a backup from the store and verifies it,
// returning the path of the snapshot it wrote under dir.
type BackupFetcher interface {
	Fetch(ctx context.Context, name string, p spec.RestorePoint, dir string) (string, error)
}

// Node is this machine's node. Peer API calls come on their own
// goroutines, concurrently with the control loop; mu serializes every
// change to the state and to the local etcd.
type Node struct {
	cfg     Config
	log     *slog.Logger
	layout  etcdproc.Layout
	proc    *etcdproc.Supervisor
	now     func() time.Time
	backups BackupFetcher
	// poke asks the control loop for a prompt cycle after a change.
	poke func()

	mu           sync.Mutex
	state        etcdproc.State
	pendingSince time.Time

	// infoMu guards info, the NodeInfo served to peers.
	infoMu sync.Mutex
	info   peer.NodeInfo

	// id is the node's ID, fixed at start; obeyedTerm mirrors the state's,
	// for readers that do not take mu.
	id         string
	obeyedTerm atomic.Int64
	// hold mirrors the state's Hold.
	hold atomic.Pointer[etcdproc.Hold]
	// corrupt holds the line etcd printed when its initial corruption
	// check failed, until the leader judged it; checkFailed holds it
	// once etcd is kept stopped for that (see StopForFailedCheck).
	corrupt       atomic.Pointer[string]
	checkFailed   atomic.Pointer[string]
	checkFailedAt atomic.Int64
	// unjudgedUntil (Unix ns) is set while the member runs after it
	// started without its initial check, with no leader to judge it.
	unjudgedUntil atomic.Int64
	// dataRevision is the revision of the member's data when etcd last
	// started on it (0: unknown).
	dataRevision atomic.Int64
	// heldPosition is where the data stands while a driver holds etcd
	// down (see Fence).
	heldPosition atomic.Pointer[etcdproc.DataPosition]
	// etcdTrust are the fingerprints of the CAs in the trust file when
	// etcd last started, which it keeps until it restarts.
	etcdTrust atomic.Pointer[[]string]
	// peerHTTP reads other members' peer ports; guarded by mu.
	peerHTTP *http.Client
	// quietStart is set while etcd restarts around a defragmentation, or
	// into or out of a quarantine, without its initial corruption check
	// (see Defrag and Quarantine); guarded by mu, and never persisted.
	quietStart bool
}

// LoadState reads the node's state from layout, creating a node ID on
// first use. State from before peer URLs were recorded gets peerURLs, the
// URLs configured now: the member was registered with the URLs configured
// then, taken to be these.
//
// A --force-new-cluster left in the state by a crash mid-recovery is
// dropped: it is used for one start only, and a recover-quorum that
// still stands asks again.
func LoadState(layout etcdproc.Layout, name string, peerURLs []string) (etcdproc.State, error) {
	st, err := layout.LoadState(name)
	if err != nil {
		return st, err
	}
	if m := st.Member; m != nil && (len(m.PeerURLs) == 0 || m.ForceNewCluster) {
		mm := *m
		if len(mm.PeerURLs) == 0 {
			mm.PeerURLs = peerURLs
		}
		mm.ForceNewCluster = false
		st.Member = &mm
		if err := layout.SaveState(st); err != nil {
			return st, err
		}
	}
	return st, nil
}

// New returns the node for state st, loaded with LoadState from the
// locked layout. poke asks the control loop for a prompt cycle; it must
// not block.
func New(cfg Config, layout etcdproc.Layout, st etcdproc.State, backups BackupFetcher, log *slog.Logger, now func() time.Time, poke func()) *Node {
	n := &Node{
		cfg:     cfg,
		log:     log,
		layout:  layout,
		now:     now,
		backups: backups,
		poke:    poke,
		state:   st,
	}
	n.proc = etcdproc.NewSupervisor(etcdproc.SupervisorConfig{
		PIDFile:          layout.PIDFile(),
		StopTimeout:      cfg.EtcdStopTimeout,
		Output:           n.etcdOutput(),
		AfterUncleanExit: n.checkData,
	}, log.With("component", "etcd"))
	if st.Member != nil && st.Member.Pending {
		n.pendingSince = now()
	}
	n.id = st.NodeID
	n.obeyedTerm.Store(st.ObeyedTerm)
	n.hold.Store(st.Hold)
	if st.Hold.Holds(now()) {
		// Held across the agent's restart: etcd does not run yet, and the
		// driver wants the data's position.
		n.readHeldPositionLocked()
	}
	return n
}

// ID is the node's ID, also its etcd member name.
func (n *Node) ID() string { return n.id }

// ObeyedTerm is the highest fencing term the node has obeyed.
func (n *Node) ObeyedTerm() int64 { return n.obeyedTerm.Load() }

// Layout is the node's folder structure under --data-dir.
func (n *Node) Layout() etcdproc.Layout { return n.layout }

// State returns the node's state and, for a pending creation, when it
// began to wait.
func (n *Node) State() (etcdproc.State, time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state, n.pendingSince
}

// Ready says whether the node is ready as a Kubernetes pod is: a standby,
// or a member whose etcd runs. Whether the cluster is healthy plays no
// part, or a cluster could never be created or grown. why says what it
// waits for.
func (n *Node) Ready() (ok bool, why string) {
	m := n.Member()
	switch {
	case m == nil:
		return true, "standby"
	case m.Pending:
		return false, "waiting for the cluster's creation"
	}
	if st := n.proc.Status(); st.PID == 0 {
		return false, "etcd is not running"
	}
	return true, "etcd is running"
}

// ReadyVoter says whether the node is a voting member whose etcd serves,
// as its last cycle saw it: what a Kubernetes Service should send clients
// to and a PodDisruptionBudget should count. A standby, a learner, a
// member still waiting for its cluster or whose etcd does not answer is
// not ready.
func (n *Node) ReadyVoter() (ok bool, why string) {
	m := n.Member()
	switch {
	case m == nil:
		return false, "standby: not a member"
	case m.Pending:
		return false, "waiting for the cluster's creation"
	}
	if st := n.proc.Status(); st.PID == 0 {
		return false, "etcd is not running"
	}
	n.infoMu.Lock()
	info := n.info
	n.infoMu.Unlock()
	switch {
	case info.IsLearner:
		return false, "a learner, catching up before it votes"
	case !info.EtcdHealthy:
		return false, "etcd does not answer"
	}
	return true, "a voting member; etcd serves"
}

// ErrHeld means a procedure's driver holds etcd down (see Fence): it is
// not started.
var ErrHeld = errors.New("node: etcd is held down")

// DataRevision is the revision of the member's data when etcd last
// started on it, 0 when unknown: the revision of a member whose etcd does
// not serve (one that restarted without quorum never does).
func (n *Node) DataRevision() int64 { return n.dataRevision.Load() }

// Member is the node's membership now, nil for a standby.
func (n *Node) Member() *etcdproc.MemberState {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state.Member
}

// EtcdStatus is the supervisor's view of the local etcd.
func (n *Node) EtcdStatus() etcdproc.Status { return n.proc.Status() }

// Stop stops etcd gracefully, as the agent exits.
func (n *Node) Stop(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc.Stop(ctx)
}

// StopRevoked stops etcd, keeping its data, because this node is
// revoked; the loop keeps it stopped from then on (plan.StopRevoked).
func (n *Node) StopRevoked(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.proc.StopWithin(ctx, replacedStopGrace); err != nil {
		return fmt.Errorf("node: stop the etcd of a revoked node: %w", err)
	}
	n.refreshInfoMember()
	return nil
}

// setState persists st durably, then makes it the node's state and shows
// it to peers at once, so a leader never acts again on the old one.
// Callers hold n.mu.
func (n *Node) setState(st etcdproc.State) error {
	if err := n.layout.SaveState(st); err != nil {
		return err
	}
	n.state = st
	n.obeyedTerm.Store(st.ObeyedTerm)
	n.hold.Store(st.Hold)
	n.refreshInfoMember()
	return nil
}

// refreshInfoMember updates the served info from the node's state.
// Callers hold n.mu.
func (n *Node) refreshInfoMember() {
	n.infoMu.Lock()
	defer n.infoMu.Unlock()
	n.info.Member = n.state.Member
	n.info.HasData = n.state.Member != nil && n.layout.HasEtcdData(n.state.Member.ClusterToken)
	n.info.DataLost = n.state.Member != nil && n.state.Member.HasRun && !n.info.HasData
	n.info.EtcdWanted = n.proc.Status().Wanted
	if !n.info.EtcdWanted {
		n.info.EtcdHealthy = false
	}
	n.info.InitialCheckFailed = ""
	if line := n.checkFailed.Load(); line != nil {
		n.info.InitialCheckFailed = *line
	}
}

// SetInfo replaces the info served to peers with what the control loop
// observed; member is the membership it observed with. A peer API call
// may have changed the membership meanwhile; the info then serves the
// membership as it is now, not as it was.
func (n *Node) SetInfo(info peer.NodeInfo, member *etcdproc.MemberState) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.infoMu.Lock()
	n.info = info
	n.infoMu.Unlock()
	if n.state.Member != member {
		n.refreshInfoMember()
	}
}

// Info serves the peer API: the node as last observed, and its clock now.
func (n *Node) Info(context.Context) (peer.NodeInfo, error) {
	n.infoMu.Lock()
	defer n.infoMu.Unlock()
	info := n.info
	info.Now = n.now().Add(testhook.Offset()).UTC() // a test may move it
	info.ObeyedTerm = n.obeyedTerm.Load()
	if n.cfg.Transfer != nil {
		info.Transfer = n.cfg.Transfer()
	}
	return info, nil
}

// StartEtcd starts (or re-adopts) the local etcd from the node's state.
func (n *Node) StartEtcd(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.startEtcdLocked(ctx)
}

// MarkBootstrapped records that the local etcd has bootstrapped its new
// cluster.
func (n *Node) MarkBootstrapped() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.markBootstrappedLocked()
}

// ConfirmCreate starts the local member of a creation that the store's
// marker confirms.
func (n *Node) ConfirmCreate(ctx context.Context, token string) error {
	n.mu.Lock()
	m := n.state.Member
	if m == nil || !m.Pending || m.ClusterToken != token {
		n.mu.Unlock()
		return nil
	}
	initial, self := m.InitialCluster, n.state.NodeID
	if n.peerHTTP == nil {
		n.peerHTTP = etcdproc.NewPeerHTTPClient(n.cfg.ClientTLS)
	}
	client := n.peerHTTP
	n.mu.Unlock()
	awaitEarlierMembers(ctx, client, initial, self, createStagger)
	n.mu.Lock()
	defer n.mu.Unlock()
	m = n.state.Member
	if m == nil || !m.Pending || m.ClusterToken != token {
		return nil
	}
	st := n.state
	mm := *m
	mm.Pending = false
	st.Member = &mm
	if err := n.setState(st); err != nil {
		return err
	}
	n.log.Info("cluster creation confirmed; starting etcd", "cluster-token", token)
	return n.startEtcdLocked(ctx)
}

// createStagger bounds how long a new cluster's member waits for those
// before it to serve (see awaitEarlierMembers).
const createStagger = time.Second

// pollEarlierMembers is how often awaitEarlierMembers asks.
const pollEarlierMembers = 20 * time.Millisecond

// awaitEarlierMembers waits, up to limit, until the members of a new
// cluster named before self (in initial, etcd's --initial-cluster)
// serve their peer port. A new etcd asks every peer whether it is a
// member already before it serves its own port, which it has bound
// already; two that start together wait on each other until etcd's
// one-second bootstrap timeout. Started in name order, each finds the
// earlier ones serving and the later ones not yet listening, and asks
// both without waiting. A member that does not start costs at most limit
// (etcd's own wait for it).
func awaitEarlierMembers(ctx context.Context, client *http.Client, initial, self string, limit time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for _, p := range strings.Split(initial, ",") {
		name, url, ok := strings.Cut(p, "=")
		if !ok || name >= self {
			continue
		}
		for {
			rctx, rcancel := context.WithTimeout(ctx, 250*time.Millisecond)
			_, err := etcdproc.PeerMembers(rctx, client, url)
			rcancel()
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(pollEarlierMembers):
			}
		}
	}
}

// AbandonPending drops a pending creation that lost, or never completed.
func (n *Node) AbandonPending(ctx context.Context, token, reason string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.state.Member
	if m == nil || !m.Pending || m.ClusterToken != token {
		return nil
	}
	return n.leaveLocked(ctx, "abandoned creation: "+reason, 0)
}

// Join serves the peer API: become a member as the leader says. It is
// idempotent for the same membership and refuses a different one.
func (n *Node) Join(ctx context.Context, req peer.JoinRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := req.Member
	if err := spec.CheckClusterToken("the join's cluster token", m.ClusterToken); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if cur := n.state.Member; cur != nil {
		if cur.ClusterToken == m.ClusterToken && cur.InitialCluster == m.InitialCluster {
			return nil
		}
		return fmt.Errorf("%w (cluster token %s)", peer.ErrBusy, cur.ClusterToken)
	}
	v, err := spec.ParseSupportedVersion(m.EtcdVersion)
	if err != nil {
		return err
	}
	if _, err := etcdproc.FindBinaries(n.cfg.EtcdBinDir, v); err != nil {
		return err
	}
	if !m.NewCluster && n.layout.HasEtcdData(m.ClusterToken) {
		// Data left from an earlier membership under the same token would
		// carry the old member's identity; joining needs a clean start.
		trashed, err := n.layout.Trash(m.ClusterToken, n.now())
		if err != nil {
			return err
		}
		n.log.Warn("moved stale etcd data aside before joining", "cluster-token", m.ClusterToken, "data-moved-to", trashed)
	}
	m.PeerURLs, m.Since = n.cfg.PeerURLs, n.now().UTC()
	st := n.state
	st.Member = &m
	if err := n.setState(st); err != nil {
		return err
	}
	n.log.Info("joining cluster", "leader", req.LeaderID, "cluster-token", m.ClusterToken, "pending", m.Pending, "new-cluster", m.NewCluster)
	defer n.poke()
	if m.Pending {
		n.pendingSince = n.now()
		return nil
	}
	return n.startEtcdLocked(ctx)
}

// Leave serves the peer API: stop being a member of the cluster with
// req.Token. etcd is stopped and its data moved to the trash.
func (n *Node) Leave(ctx context.Context, req peer.LeaveRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.obeyLocked(req.Term, "leave"); err != nil {
		return err
	}
	if err := peer.CheckNotAfter(req.NotAfter, n.now(), "leave"); err != nil {
		return err
	}
	cur := n.state.Member
	if cur == nil {
		return nil
	}
	if cur.ClusterToken != req.Token {
		return fmt.Errorf("node: leave cluster %s: this node is in cluster %s", req.Token, cur.ClusterToken)
	}
	defer n.poke()
	grace := time.Duration(0)
	if req.Replaced {
		grace = replacedStopGrace
	}
	return n.leaveLocked(ctx, req.Reason, grace)
}

// replacedStopGrace is how long an etcd whose cluster is being replaced
// gets to stop before it is killed. A leader whose followers have stopped
// otherwise waits out its request timeout (seconds) on clients' reads that
// it can no longer answer; its data is moved aside either way.
const replacedStopGrace = time.Second

// leaveLocked stops etcd (killing it after grace, or after the stop
// timeout when grace is 0), trashes its data and drops the membership.
// Callers hold n.mu.
func (n *Node) leaveLocked(ctx context.Context, reason string, grace time.Duration) error {
	token := n.state.Member.ClusterToken
	if err := n.proc.StopWithin(ctx, grace); err != nil {
		return err
	}
	trashed, err := n.layout.Trash(token, n.now())
	if err != nil {
		return err
	}
	st := n.state
	// The data a hold kept is gone with the membership.
	st.Member, st.Hold = nil, nil
	if err := n.setState(st); err != nil {
		return err
	}
	n.heldPosition.Store(nil)
	n.log.Warn("left the cluster; this node is now a standby", "cluster-token", token, "reason", reason, "data-moved-to", trashed)
	return nil
}

func (n *Node) startEtcdLocked(ctx context.Context) error {
	m := n.state.Member
	if m == nil {
		return errors.New("node: this node is not a member")
	}
	if h := n.state.Hold; h.Holds(n.now()) && !m.ForceNewCluster {
		return fmt.Errorf("%w: the driver of term %d holds etcd down until it releases it, or until %s", ErrHeld, h.Term, h.Until.UTC().Format(time.RFC3339))
	}
	if line := n.checkFailed.Load(); line != nil {
		return fmt.Errorf("%w: its initial corruption check failed (%s); the leader judges whose data is right", ErrHeld, *line)
	}
	v, err := spec.ParseSupportedVersion(m.EtcdVersion)
	if err != nil {
		return fmt.Errorf("node: local state: %w", err)
	}
	bins, err := etcdproc.FindBinaries(n.cfg.EtcdBinDir, v)
	if err != nil {
		return err
	}
	if err := bins.CheckVersion(ctx); err != nil {
		return err
	}
	dataDir, err := n.layout.EtcdDataDir(m.ClusterToken)
	if err != nil {
		return fmt.Errorf("node: local state: %w", err)
	}
	hasData := etcdproc.HasData(dataDir)
	if m.HasRun && !hasData {
		return fmt.Errorf("node: %w: this member's data dir %s is empty; not starting etcd as the old member (the leader removes it and adds this node back with fresh data)",
			etcdproc.ErrDataLost, dataDir)
	}
	if !m.HasRun && hasData {
		if err := n.markBootstrappedLocked(); err != nil {
			return err
		}
		m = n.state.Member
	}
	n.dataRevision.Store(0)
	if hasData {
		// Before etcd holds the file: what a survivor would seed a
		// cluster with, should its etcd never serve again.
		if rev, err := etcdproc.ReadRevision(dataDir); err == nil {
			n.dataRevision.Store(rev)
		}
	}
	sp, err := n.etcdSpec(bins, m)
	if err != nil {
		return err
	}
	if tf := n.cfg.EtcdTLS; tf != nil {
		fps := pki.FileFingerprints(tf.CA)
		n.etcdTrust.Store(&fps)
	}
	if err := n.proc.Start(ctx, sp); err != nil {
		return err
	}
	n.refreshInfoMember()
	if !m.HasRun {
		go n.watchBootstrap(m.ClusterToken)
	}
	return nil
}

// watchBootstrap records that etcd has run (HasRun, and no longer
// NewCluster) the moment etcd writes its data dir, before the member can
// have taken part in raft. Should the data be lost after that, the node
// must rejoin as a new member, never start again under its old identity
// with an empty log.
func (n *Node) watchBootstrap(token string) {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if !n.layout.HasEtcdData(token) {
			continue
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		if m := n.state.Member; m != nil && m.ClusterToken == token {
			if err := n.markBootstrappedLocked(); err != nil {
				n.log.Error("cannot record that etcd has bootstrapped; the control loop records it on a later cycle", "error", err)
			}
		}
		return
	}
}

// markBootstrappedLocked records that etcd has written its data: from
// then on a missing data dir means lost data, never a cluster to create
// again nor a member to start afresh. The running etcd keeps running;
// later restarts use the new state.
func (n *Node) markBootstrappedLocked() error {
	if n.state.Member == nil || (!n.state.Member.NewCluster && n.state.Member.HasRun) {
		return nil
	}
	st := n.state
	m := *st.Member
	m.NewCluster, m.HasRun = false, true
	st.Member = &m
	if err := n.setState(st); err != nil {
		return err
	}
	if cur := n.proc.Status().Spec; cur != nil {
		sp, err := n.etcdSpec(cur.Binaries, &m)
		if err != nil {
			return err
		}
		n.proc.Update(sp)
	}
	return nil
}

func (n *Node) etcdSpec(bins etcdproc.Binaries, m *etcdproc.MemberState) (etcdproc.Spec, error) {
	dataDir, err := n.layout.EtcdDataDir(m.ClusterToken)
	if err != nil {
		return etcdproc.Spec{}, fmt.Errorf("node: %w", err)
	}
	settings, dropped := spec.Settings(m.Settings).Usable(bins.Version)
	if len(dropped) > 0 {
		n.log.Warn("etcd settings this etcd version does not accept are left out", "version", bins.Version.String(), "settings", dropped)
	}
	var checks []string
	if h, err := bins.Help(context.Background()); err != nil {
		n.log.Warn("cannot read etcd's flags; it runs without its corruption checks and without stopping its gRPC service during a defrag", "error", err)
	} else {
		// etcd restarts around a defragmentation on data it served a
		// moment ago: its initial check would read the whole keyspace on
		// every member for nothing.
		checks = etcdproc.ManagedArgs(h, !n.quietStart && n.initialCheckUseful(m), n.cfg.EtcdCorruptCheckInterval)
	}
	return etcdproc.Spec{
		Binaries:             bins,
		Name:                 n.state.NodeID,
		DataDir:              dataDir,
		ClientURLs:           n.cfg.ClientURLs,
		ListenClientURLs:     n.cfg.ListenClientURLs,
		QuarantineClientURLs: n.cfg.QuarantineClientURLs,
		Quarantined:          m.Quarantined,
		PeerURLs:             n.servedPeerURLs(m),
		ListenPeerURLs:       n.listenPeerURLs(n.servedPeerURLs(m)),
		InitialCluster:       m.InitialCluster,
		NewCluster:           m.NewCluster,
		ClusterToken:         m.ClusterToken,
		ForceNewCluster:      m.ForceNewCluster,
		SnapshotCount:        n.cfg.EtcdSnapshotCount,
		Checks:               checks,
		Settings:             settings,
		TLS:                  n.cfg.EtcdTLS,
		PeerCertHostname:     m.PeerCertHostname,
		RequireData:          m.HasRun,
	}, nil
}

// listenPeerURLs are the addresses etcd binds while it advertises
// served: --listen-peer-urls when given, in served's scheme (which
// differs from the configured one only during an http to https switch);
// nil binds served itself.
func (n *Node) listenPeerURLs(served []string) []string {
	if len(n.cfg.ListenPeerURLs) == 0 || len(served) == 0 {
		return nil
	}
	scheme := "https"
	if u, err := url.Parse(served[0]); err == nil && u.Scheme != "" {
		scheme = u.Scheme
	}
	out := make([]string, 0, len(n.cfg.ListenPeerURLs))
	for _, raw := range n.cfg.ListenPeerURLs {
		u, err := url.Parse(raw)
		if err != nil {
			out = append(out, raw)
			continue
		}
		u.Scheme = scheme
		out = append(out, u.String())
	}
	return out
}

// servedPeerURLs are the peer URLs etcd serves for member m: those it is
// registered with. They differ from --peer-urls only while a switch (http
// to https, say) waits for the leader to register the new ones.
func (n *Node) servedPeerURLs(m *etcdproc.MemberState) []string {
	if m != nil && len(m.PeerURLs) > 0 {
		return m.PeerURLs
	}
	return n.cfg.PeerURLs
}

// localStatus asks the local etcd for its status, on whichever URLs it
// serves.
func (n *Node) localStatus(ctx context.Context) (etcdproc.MemberStatus, error) {
	ps := n.proc.Status()
	if !ps.Wanted || ps.Spec == nil {
		return etcdproc.MemberStatus{}, errors.New("node: etcd is not running")
	}
	endpoint := ps.Spec.ServedClientURL()
	c, err := etcdproc.NewClient([]string{endpoint}, n.cfg.ClientTLS)
	if err != nil {
		return etcdproc.MemberStatus{}, err
	}
	defer c.Close()
	return etcdproc.LocalStatus(ctx, c, endpoint)
}

// TempDir makes a fresh folder under <data-dir>/tmp; the caller removes
// it.
func TempDir(dataDir, prefix string) (string, error) {
	tmp := filepath.Join(dataDir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return "", fmt.Errorf("node: %w", err)
	}
	dir, err := os.MkdirTemp(tmp, prefix)
	if err != nil {
		return "", fmt.Errorf("node: %w", err)
	}
	return dir, nil
}

// Tidy applies the trash policy, while this node is a healthy member
// (healthy, as the loop just saw it): copies moved aside before its
// membership began are superseded by its live data. The newest copy is
// always kept.
func (n *Node) Tidy(policy etcdproc.TrashPolicy, healthy bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.state.Member
	if !healthy || m == nil || !m.HasRun || !n.layout.HasEtcdData(m.ClusterToken) {
		return
	}
	entries, err := n.layout.TrashEntries()
	if err != nil {
		n.log.Warn("cannot read the trash", "error", err)
		return
	}
	for _, e := range policy.Expired(entries, n.now(), m.Since) {
		if err := n.layout.RemoveTrash(e.Name); err != nil {
			n.log.Warn("cannot remove an expired copy from the trash", "entry", e.Name, "error", err)
			continue
		}
		n.log.Info("removed an expired copy from the trash", "entry", e.Name, "moved", e.Moved, "bytes", e.Size)
	}
}
