package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

// The node's side of the leader's long operations. Each call is
// idempotent: a leader that retries it, or a new leader that resumes, gets
// the same result. A call made by a procedure's driver carries its fencing
// term; the node refuses a term older than one it has obeyed, so a driver
// that was paused and resumes after another took over changes nothing.

// obeyLocked checks a call's fencing term and records it before the node
// acts on the call. Callers hold n.mu.
func (n *Node) obeyLocked(term int64, what string) error {
	switch {
	case term == 0:
		return nil // not a procedure's call
	case term < 0 || term > spec.MaxTerm:
		// Obeyed, it would refuse every later driver.
		return fmt.Errorf("node: %s under term %d: no agent takes such a term", what, term)
	case term < n.state.ObeyedTerm:
		n.log.Warn("refused a call from a driver whose term has passed", "call", what, "term", term, "obeyed-term", n.state.ObeyedTerm)
		return fmt.Errorf("%w: %s under term %d, but this node has obeyed term %d", peer.ErrStaleTerm, what, term, n.state.ObeyedTerm)
	case term > n.state.ObeyedTerm:
		st := n.state
		st.ObeyedTerm = term
		return n.setState(st)
	}
	return nil
}

// Fence serves the peer API: a procedure's driver of req.Term took over;
// from now on the node refuses calls of older terms. With req.Hold, the
// node also stops its etcd and keeps it stopped until the driver releases
// it or peer.HoldFor passes without the driver renewing the hold, and
// reads where its data stands from its database (see HeldPosition). With
// req.Release, a hold of that term or an older one ends.
func (n *Node) Fence(ctx context.Context, req peer.FenceRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !req.Release {
		if err := n.obeyLocked(req.Term, "fence"); err != nil {
			return err
		}
	}
	// A release is no fence: it ends a hold of its term or an older one,
	// whatever term the node obeys since (the leader releases a hold
	// whose procedure ended, under the hold's own term).
	switch {
	case req.Release:
		if h := n.state.Hold; h != nil && h.Term <= req.Term {
			st := n.state
			st.Hold = nil
			if err := n.setState(st); err != nil {
				return err
			}
			n.heldPosition.Store(nil)
			n.log.Info("the driver released its hold on etcd", "term", req.Term)
			defer n.poke()
		}
		return nil
	case !req.Hold:
		return nil
	}
	if err := peer.CheckNotAfter(req.NotAfter, n.now(), "a hold on etcd"); err != nil {
		return err
	}
	if req.Term == 0 {
		return errors.New("node: a hold on etcd needs a driver's term")
	}
	first := !n.state.Hold.Holds(n.now())
	st := n.state
	st.Hold = &etcdproc.Hold{Term: req.Term, Until: n.now().Add(peer.HoldFor)}
	// Recorded before etcd stops: an agent that restarts meanwhile does
	// not start it again.
	if err := n.setState(st); err != nil {
		return err
	}
	if first {
		n.log.Warn("holding etcd down for a procedure's driver; it starts again when the driver releases it", "term", req.Term, "leader", req.LeaderID,
			"at-most", peer.HoldFor)
	}
	// A frozen (SIGSTOP) etcd takes no SIGTERM: it is killed after a
	// short grace, and its data kept.
	if err := n.proc.StopWithin(ctx, replacedStopGrace); err != nil {
		return err
	}
	defer n.poke()
	n.readHeldPositionLocked()
	return nil
}

// readHeldPositionLocked reads where the member's data stands, with etcd
// stopped, for the driver to rank the survivors by. Callers hold n.mu.
func (n *Node) readHeldPositionLocked() {
	m := n.state.Member
	if m == nil || !n.layout.HasEtcdData(m.ClusterToken) {
		n.heldPosition.Store(nil)
		return
	}
	dir, err := n.layout.EtcdDataDir(m.ClusterToken)
	if err != nil {
		return
	}
	pos, err := etcdproc.ReadPosition(dir)
	if err != nil {
		n.log.Warn("cannot read where the held member's data stands", "error", err)
		n.heldPosition.Store(nil)
		return
	}
	n.heldPosition.Store(&pos)
}

// HeldPosition is where the member's data stands while a driver holds
// etcd down, as read from its database; nil when etcd is not held, or
// the position could not be read.
func (n *Node) HeldPosition() *etcdproc.DataPosition {
	if n.Held() == 0 {
		return nil
	}
	return n.heldPosition.Load()
}

// Held is the term of the driver that holds etcd down, 0 when none does.
func (n *Node) Held() int64 {
	if h := n.hold.Load(); h.Holds(n.now()) {
		return h.Term
	}
	return 0
}

// Restore serves the peer API: become a member of a new cluster restored
// from a backup. It is idempotent: a node that already holds the new
// cluster's data only makes sure its etcd runs.
func (n *Node) Restore(ctx context.Context, req peer.RestoreRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.obeyLocked(req.Term, "restore"); err != nil {
		return err
	}
	if err := peer.CheckNotAfter(req.NotAfter, n.now(), "restore"); err != nil {
		return err
	}
	if h := n.state.Hold; h != nil && h.Term <= req.Term {
		// The cluster is replaced: the hold's data goes to the trash.
		st := n.state
		st.Hold = nil
		if err := n.setState(st); err != nil {
			return err
		}
		n.heldPosition.Store(nil)
	}
	m := req.Member
	token := m.ClusterToken
	if err := spec.CheckClusterToken("the restore's cluster token", token); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	// Every member of the restored cluster starts from the same verified
	// snapshot at about the same time, and the leader checks their HashKV
	// before it lifts the quarantine. etcd's initial corruption check
	// would compare nothing, and a member that saw an earlier one's peer
	// port open would wait in it, up to etcd's request timeout (7 s), for
	// a HashKV that member cannot answer before there is a quorum.
	n.quietStart = true
	defer func() { n.quietStart = false }()
	if cur := n.state.Member; cur != nil && cur.ClusterToken == token && n.layout.HasEtcdData(token) {
		if n.proc.Status().Wanted {
			return nil
		}
		return n.startEtcdLocked(ctx)
	}
	if cur := n.state.Member; cur != nil && cur.ClusterToken == token && cur.HasRun {
		// Its peers may have seen this member's log: restoring it again
		// under the same member ID would bring it back with amnesia.
		return fmt.Errorf("node: refusing to restore cluster %s again: this member's restored data is gone, "+
			"and it may not come back under the same member ID; it rejoins as a new member once the cluster serves", token)
	}
	v, err := spec.ParseSupportedVersion(m.EtcdVersion)
	if err != nil {
		return err
	}
	bins, err := etcdproc.FindBinaries(n.cfg.EtcdBinDir, v)
	if err != nil {
		return err
	}
	if cur := n.state.Member; cur != nil && cur.ClusterToken != token {
		if err := n.leaveLocked(ctx, "restore of backup "+req.Backup+" replaces this cluster", replacedStopGrace); err != nil {
			return err
		}
	}
	dir, err := TempDir(n.cfg.DataDir, "restore-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := req.Point.Validate(); err != nil {
		return fmt.Errorf("node: restore: %w", err)
	}
	path, err := n.backups.Fetch(ctx, req.Backup, req.Point, dir)
	if err != nil {
		return err
	}
	out, err := n.layout.EtcdDataDir(token)
	if err != nil {
		return err
	}
	if _, err := os.Stat(out); err == nil {
		// Left by a restore that crashed before it was recorded.
		trashed, err := n.layout.Trash(token, n.now())
		if err != nil {
			return err
		}
		n.log.Warn("moved an unfinished restore aside", "cluster-token", token, "data-moved-to", trashed)
	}
	staging := out + ".restoring"
	if err := os.RemoveAll(staging); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	err = bins.RestoreSnapshot(ctx, etcdproc.RestoreOptions{
		SnapshotPath:   path,
		DataDir:        staging,
		Name:           n.state.NodeID,
		PeerURLs:       n.cfg.PeerURLs,
		InitialCluster: m.InitialCluster,
		Token:          token,
		BumpRevision:   req.Point.BumpRevision,
		MarkCompacted:  req.Point.MarkCompacted,
	})
	if err != nil {
		os.RemoveAll(staging)
		return fmt.Errorf("node: restore backup %s: %w", req.Backup, err)
	}
	if err := os.Rename(staging, out); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	testhook.Here(n.log, "restore-node-data") // restored data, not yet in the state
	m.NewCluster, m.Pending, m.PeerURLs, m.HasRun, m.Since = false, false, n.cfg.PeerURLs, true, n.now().UTC()
	st := n.state
	st.Member = &m
	if err := n.setState(st); err != nil {
		return err
	}
	n.log.Warn("restored backup; starting etcd in quarantine", "backup", req.Backup, "cluster-token", token, "leader", req.LeaderID)
	defer n.poke()
	return n.startEtcdLocked(ctx)
}

// Quarantine serves the peer API: restart etcd serving clients on the
// quarantine URLs only, or on the client URLs again.
func (n *Node) Quarantine(ctx context.Context, req peer.QuarantineRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.obeyLocked(req.Term, "quarantine"); err != nil {
		return err
	}
	if err := peer.CheckNotAfter(req.NotAfter, n.now(), "quarantine"); err != nil {
		return err
	}
	cur := n.state.Member
	if cur == nil || cur.ClusterToken != req.Token {
		return fmt.Errorf("node: quarantine cluster %s: this node is not its member", req.Token)
	}
	if cur.Quarantined == req.Quarantined {
		return nil
	}
	m := *cur
	m.Quarantined = req.Quarantined
	st := n.state
	st.Member = &m
	if err := n.setState(st); err != nil {
		return err
	}
	n.log.Warn("restarting etcd to change its quarantine", "quarantined", req.Quarantined, "leader", req.LeaderID)
	defer n.poke()
	// Every member restarts at once, on data it served a moment ago and,
	// when a restore lifts its quarantine, whose HashKV was just checked
	// across the members: etcd's initial corruption check would compare
	// nothing, and would hold each member back waiting for peers that
	// restart too.
	n.quietStart = true
	defer func() { n.quietStart = false }()
	return n.startEtcdLocked(ctx)
}

// Recover serves the peer API: restart this member's etcd with
// --force-new-cluster, then wait until it leads its one-member cluster.
// The flag is used for that one start only: it is dropped from the state
// and from the supervisor's spec as soon as etcd has started with it, so
// that no later restart forces a new cluster again, whatever becomes of
// the command (done, failed, deleted). Should etcd fail before it
// rewrote its membership, the command, while it stands, asks again. It
// is idempotent: a member already leading does nothing.
func (n *Node) Recover(ctx context.Context, req peer.RecoverRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.obeyLocked(req.Term, "recover"); err != nil {
		return err
	}
	if err := peer.CheckNotAfter(req.NotAfter, n.now(), "recover"); err != nil {
		return err
	}
	cur := n.state.Member
	if cur == nil || cur.ClusterToken != req.Token || !n.layout.HasEtcdData(req.Token) {
		return fmt.Errorf("node: recover cluster %s: this node holds none of its data", req.Token)
	}
	if st, err := n.localStatus(ctx); err == nil && st.LeaderID != 0 {
		return nil // recovered already, or never lost quorum
	}
	if h := n.state.Hold; h != nil && h.Term <= req.Term {
		// The driver that held it forces it: the hold ends here.
		st := n.state
		st.Hold = nil
		if err := n.setState(st); err != nil {
			return err
		}
		n.heldPosition.Store(nil)
	}
	if err := n.setForceNewClusterLocked(true); err != nil {
		return err
	}
	n.log.Warn("restarting etcd with --force-new-cluster to recover quorum", "cluster-token", req.Token, "leader", req.LeaderID)
	startErr := n.startEtcdLocked(ctx)
	if err := n.setForceNewClusterLocked(false); err != nil {
		return err
	}
	if cur := n.proc.Status().Spec; cur != nil {
		sp, err := n.etcdSpec(cur.Binaries, n.state.Member)
		if err != nil {
			return err
		}
		n.proc.Update(sp)
	}
	if startErr != nil {
		return startErr
	}
	deadline := time.Now().Add(peer.RecoverWait)
	for {
		st, err := n.localStatus(ctx)
		if err == nil && st.LeaderID == st.MemberID {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node: etcd did not lead after --force-new-cluster within %s (last status error: %v)", peer.RecoverWait, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	n.log.Warn("quorum recovered: this member now leads a one-member cluster with all its data", "cluster-token", req.Token)
	testhook.Here(n.log, "recover-forced")
	defer n.poke()
	return nil
}

// setForceNewClusterLocked records whether etcd's next start forces a new
// cluster. Callers hold n.mu.
func (n *Node) setForceNewClusterLocked(on bool) error {
	if n.state.Member.ForceNewCluster == on {
		return nil
	}
	m := *n.state.Member
	m.ForceNewCluster = on
	st := n.state
	st.Member = &m
	return n.setState(st)
}

// SetVersion serves the peer API: run etcd of another version on this
// member's data. The binary is checked before etcd stops.
func (n *Node) SetVersion(ctx context.Context, req peer.VersionRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	cur := n.state.Member
	if cur == nil || cur.ClusterToken != req.Token {
		return fmt.Errorf("node: set version for cluster %s: this node is not its member", req.Token)
	}
	v, err := spec.ParseSupportedVersion(req.Version)
	if err != nil {
		return err
	}
	bins, err := etcdproc.FindBinaries(n.cfg.EtcdBinDir, v)
	if err != nil {
		return err
	}
	if err := bins.CheckVersion(ctx); err != nil {
		return err
	}
	if cur.EtcdVersion == v.String() && n.proc.Status().Wanted {
		return nil
	}
	m := *cur
	from := m.EtcdVersion
	m.EtcdVersion = v.String()
	st := n.state
	st.Member = &m
	if err := n.setState(st); err != nil {
		return err
	}
	n.log.Warn("restarting etcd on another version", "from", from, "to", v.String(), "leader", req.LeaderID)
	defer n.poke()
	if err := n.startEtcdLocked(ctx); err != nil {
		return err
	}
	if old, err := spec.ParseVersion(from); err == nil && old.Minor <= 5 && v.Minor >= 6 {
		// Remember how far the log reached under 3.5: it may hold v2
		// entries up to here, which etcd 3.7 cannot replay.
		return n.recordV2UntilLocked(ctx)
	}
	return nil
}

// SetSettings serves the peer API: run etcd with the spec's etcd
// settings. They are checked against the member's etcd version before
// etcd stops.
func (n *Node) SetSettings(ctx context.Context, req peer.SettingsRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	cur := n.state.Member
	if cur == nil || cur.ClusterToken != req.Token {
		return fmt.Errorf("node: set etcd settings for cluster %s: this node is not its member", req.Token)
	}
	v, err := spec.ParseSupportedVersion(cur.EtcdVersion)
	if err != nil {
		return err
	}
	want := spec.Settings(req.Settings)
	if err := want.Validate(v); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if want.Equal(cur.Settings) && n.proc.Status().Wanted {
		return nil
	}
	m := *cur
	from := spec.Settings(m.Settings).String()
	m.Settings = want.Clone()
	if len(m.Settings) == 0 {
		m.Settings = nil
	}
	st := n.state
	st.Member = &m
	if err := n.setState(st); err != nil {
		return err
	}
	n.log.Warn("restarting etcd with new settings", "from", from, "to", want.String(), "leader", req.LeaderID)
	defer n.poke()
	return n.startEtcdLocked(ctx)
}

// SetPeerCertCheck serves the peer API: restart etcd requiring
// req.Hostname of peer certificates, or taking any certificate from the
// CA when it is empty. The node refuses to require a name its own
// certificate does not carry (its peers would refuse it in turn, once
// they require it too), and to require one at all when etcd runs without
// TLS or its agent asked for the check off. Idempotent: a member already
// running so is left alone.
func (n *Node) SetPeerCertCheck(ctx context.Context, req peer.PeerCertCheckRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	cur := n.state.Member
	if cur == nil || cur.ClusterToken != req.Token {
		return fmt.Errorf("node: set the peer certificate check for cluster %s: this node is not its member", req.Token)
	}
	if req.Hostname != "" {
		if err := n.checkOwnCert(req.Hostname); err != nil {
			return err
		}
	}
	if cur.PeerCertHostname == req.Hostname && n.proc.Status().Wanted {
		return nil
	}
	m := *cur
	m.PeerCertHostname = req.Hostname
	st := n.state
	st.Member = &m
	if err := n.setState(st); err != nil {
		return err
	}
	if req.Hostname != "" {
		n.log.Warn("restarting etcd to accept only node certificates on its peer port", "peer-cert-allowed-hostname", req.Hostname, "leader", req.LeaderID)
	} else {
		n.log.Warn("restarting etcd to accept any certificate from the CA on its peer port", "from", cur.PeerCertHostname, "leader", req.LeaderID)
	}
	defer n.poke()
	return n.startEtcdLocked(ctx)
}

// EtcdTrust are the fingerprints of the CAs etcd was last started with,
// nil before it started or without TLS.
func (n *Node) EtcdTrust() []string {
	if p := n.etcdTrust.Load(); p != nil {
		return *p
	}
	return nil
}

// SyncCA serves the peer API: take up the store's CA and trust (a CA
// rotation step), then, with req.RestartEtcd, restart a member's etcd
// that runs with other CAs than its trust file now holds, as etcd reads
// them only when it starts. Idempotent: files that are as the store says
// are left alone, and so is an etcd that already trusts them.
func (n *Node) SyncCA(ctx context.Context, req peer.CARequest) error {
	if n.cfg.CA == nil {
		return errors.New("node: this agent runs without TLS (--insecure and --etcd-insecure); it has no CA to rotate")
	}
	if err := n.cfg.CA.Sync(ctx, req.Trust, req.Issuer); err != nil {
		return err
	}
	if !req.RestartEtcd || n.cfg.EtcdTLS == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	cur := n.state.Member
	if cur == nil || cur.ClusterToken != req.Token || !n.proc.Status().Wanted {
		return nil
	}
	now := pki.FileFingerprints(n.cfg.EtcdTLS.CA)
	if slices.Equal(n.EtcdTrust(), now) {
		return nil
	}
	n.log.Warn("restarting etcd to take up the CAs it is to trust", "from", n.EtcdTrust(), "to", now, "leader", req.LeaderID)
	defer n.poke()
	return n.startEtcdLocked(ctx)
}

// checkOwnCert checks that this node may have etcd require name of its
// peers: etcd runs with TLS, the agent did not ask for the check off,
// and the node's own certificate carries the name.
func (n *Node) checkOwnCert(name string) error {
	switch {
	case n.cfg.EtcdTLS == nil:
		return errors.New("node: etcd runs without TLS here (--etcd-insecure); it has no peer certificates to check")
	case n.cfg.PeerCertCheckOff:
		return errors.New("node: this agent runs with --etcd-peer-cert-check=false; its etcd takes any peer certificate from the CA")
	}
	data, err := os.ReadFile(n.cfg.EtcdTLS.Cert)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	c, err := pki.ParseCertPEM(data)
	if err != nil {
		return fmt.Errorf("node: %s: %w", n.cfg.EtcdTLS.Cert, err)
	}
	if !pki.CarriesName(c, name) {
		return fmt.Errorf("node: this node's certificate %s does not carry %s (names %v); requiring it of peers would cut this member off", n.cfg.EtcdTLS.Cert, name, c.DNSNames)
	}
	return nil
}

// recordV2UntilLocked waits for the restarted etcd to report its raft
// index and records it as the member's V2Until. Callers hold n.mu.
func (n *Node) recordV2UntilLocked(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := n.localStatus(ctx)
		if err == nil && st.RaftIndex > 0 {
			m := *n.state.Member
			m.V2Until = st.RaftIndex
			s := n.state
			s.Member = &m
			return n.setState(s)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node: etcd did not report its raft index after the upgrade: %v", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// PeerURLSettle is how long a down member waits, once its new peer URLs
// are registered, before its etcd starts on them: longer than etcd's peer
// dial timeout (1 s plus the election timeout).
var PeerURLSettle = 5 * time.Second

// SetPeerURLs serves the peer API: the member is now registered with this
// node's configured peer URLs; restart etcd serving them.
func (n *Node) SetPeerURLs(ctx context.Context, req peer.PeerURLsRequest) error {
	check := func() (*etcdproc.MemberState, bool, error) {
		cur := n.state.Member
		if cur == nil || cur.ClusterToken != req.Token {
			return nil, false, fmt.Errorf("node: set peer URLs for cluster %s: this node is not its member", req.Token)
		}
		if !plan.SameURLs(req.URLs, n.cfg.PeerURLs) {
			return nil, false, fmt.Errorf("node: set peer URLs %v: this node is configured with %v", req.URLs, n.cfg.PeerURLs)
		}
		return cur, plan.SameURLs(cur.PeerURLs, req.URLs) && n.proc.Status().Wanted, nil
	}
	n.mu.Lock()
	_, done, err := check()
	running := n.proc.Status().PID != 0
	n.mu.Unlock()
	if err != nil || done {
		return err
	}
	if !running {
		// The member is down, its node back at a new address. The leader's
		// sends to the old address, begun before the new one was
		// registered, must fail before this etcd is up: one that fails
		// after its streams connect marks it inactive in the leader's etcd
		// until they reconnect, and etcd refuses membership changes
		// meanwhile ("unhealthy cluster").
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(PeerURLSettle):
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	cur, done, err := check()
	if err != nil || done {
		return err
	}
	m := *cur
	from := m.PeerURLs
	m.PeerURLs = n.cfg.PeerURLs
	st := n.state
	st.Member = &m
	if err := n.setState(st); err != nil {
		return err
	}
	n.log.Warn("restarting etcd to serve new peer URLs", "from", from, "to", m.PeerURLs, "leader", req.LeaderID)
	defer n.poke()
	return n.startEtcdLocked(ctx)
}
