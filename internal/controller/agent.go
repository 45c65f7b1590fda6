package controller

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/credentials"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Agent is one node's etcd-manager: it supervises the local etcd, serves
// the peer API, and runs the control loop. Create it with NewAgent and
// call Run once.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	layout etcdproc.Layout
	proc   *etcdproc.Supervisor
	now    func() time.Time
	// creds dial peers and serverCreds serve the peer API; etcdTLS is the
	// TLS of etcd clients (nil with --etcd-insecure). See tls.go.
	creds, serverCreds credentials.TransportCredentials
	etcdTLS            *tls.Config
	ca                 *pki.CA
	renewAt            time.Time
	certExpiry         atomic.Int64
	lock               LeaderLock
	met                *metrics

	// mu guards the node's state and serializes changes to it and to the
	// local etcd, between the loop and peer API calls.
	mu           sync.Mutex
	state        etcdproc.State
	pendingSince time.Time

	// wake asks the loop for a cycle now, after a peer API call changed
	// this node.
	wake chan struct{}

	// infoMu guards info, the NodeInfo served to peers.
	infoMu sync.Mutex
	info   peer.NodeInfo

	// The rest belongs to the loop goroutine.
	store          *store.Store
	discovery      peer.Discovery
	client         *clientv3.Client
	clientEndpoint string
	peers          map[string]*peer.Client
	lockTerm       int64
	unhealthySince map[uint64]time.Time
	lastPublish    time.Time
	// backups are those this agent took while leading; lastChange is its
	// last membership change.
	backups    *backups
	lastChange time.Time
	// versionBackup is the version a backup was last taken for, before a
	// version change moved members to it.
	versionBackup string
	// lastInfo is the last info-level report, logged again only when it
	// changes; warnings and errors are logged every cycle.
	lastInfo string
}

// NewAgent returns an agent for a validated, completed configuration.
func NewAgent(cfg Config, log *slog.Logger) *Agent {
	layout := etcdproc.Layout{Root: cfg.DataDir}
	met := newMetrics()
	a := &Agent{
		cfg:    cfg,
		log:    log,
		layout: layout,
		proc: etcdproc.NewSupervisor(etcdproc.SupervisorConfig{
			PIDFile:     layout.PIDFile(),
			StopTimeout: cfg.EtcdStopTimeout,
		}, log.With("component", "etcd")),
		now:            time.Now,
		met:            met,
		wake:           make(chan struct{}, 1),
		peers:          map[string]*peer.Client{},
		unhealthySince: map[uint64]time.Time{},
	}
	a.backups = cfg.Backup.newBackups(log, met, func() time.Time { return a.now() })
	return a
}

// peerAddress is the peer API address this agent advertises.
func (a *Agent) peerAddress() string {
	return net.JoinHostPort(a.cfg.Address, strconv.Itoa(a.cfg.PeerPort))
}

// Run runs the agent until ctx is cancelled, then stops etcd gracefully.
// It returns an error only for problems it cannot ride out (a data dir in
// use by another agent, an unreadable state file, a peer port in use);
// everything else is logged and retried.
func (a *Agent) Run(ctx context.Context) error {
	unlock, err := a.layout.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	st, err := a.layout.LoadState()
	if err != nil {
		return err
	}
	if m := st.Member; m != nil && len(m.PeerURLs) == 0 {
		// State from before peer URLs were recorded: the member was
		// registered with the URLs configured then, taken to be these.
		mm := *m
		mm.PeerURLs = a.cfg.PeerURLs
		st.Member = &mm
		if err := a.layout.SaveState(st); err != nil {
			return err
		}
	}
	a.state = st
	if st.Member != nil && st.Member.Pending {
		a.pendingSince = a.now()
	}
	a.lock = LeaderLock{NodeID: st.NodeID, TTL: a.cfg.LeaderLease, Now: a.now}
	if err := a.setupTLS(ctx); err != nil {
		return err
	}
	if a.tlsEnabled() {
		go a.renewLoop(ctx)
	}
	a.discovery, err = peer.ParseDiscovery(a.cfg.Discovery, peer.DiscoveryOptions{
		Store: func(ctx context.Context) (peer.BlobStore, error) {
			s, err := a.openStore(ctx)
			if err != nil {
				return nil, err
			}
			return s, nil
		},
		PeerPort: a.cfg.PeerPort,
		MaxAge:   10 * time.Minute,
		Now:      a.now,
	})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", a.peerAddress())
	if err != nil {
		return fmt.Errorf("controller: peer API: %w", err)
	}
	if a.cfg.MetricsAddress != "" {
		stop, err := a.met.serve(a.cfg.MetricsAddress)
		if err != nil {
			l.Close()
			return fmt.Errorf("controller: metrics: %w", err)
		}
		defer stop()
	}
	srv := peer.NewServer(a.serverCreds, a.cfg.ClusterName, a)
	go func() {
		if err := srv.Serve(l); err != nil {
			a.log.Error("peer API stopped", "error", err)
		}
	}()
	a.log.Info("agent starting", "node-id", st.NodeID, "cluster-name", a.cfg.ClusterName, "peer-address", a.peerAddress(),
		"data-dir", a.cfg.DataDir, "backup-store", a.cfg.BackupStore, "discovery", a.cfg.Discovery, "member", st.Member != nil)

	defer a.shutdown(srv)
	ticker := time.NewTicker(a.cfg.LoopInterval)
	defer ticker.Stop()
	quick := 0
	for {
		// After a change, look again at once to take the next step, but
		// only a few times in a row, so that a change that does not
		// converge cannot spin.
		if a.cycle(ctx) && quick < maxQuickCycles {
			quick++
			continue
		}
		quick = 0
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-a.wake:
		}
	}
}

// poke asks the loop for a prompt cycle; it never blocks.
func (a *Agent) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *Agent) shutdown(srv *peer.Server) {
	srv.Stop()
	// The caller's context is done; give etcd its own time to stop.
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.EtcdStopTimeout+5*time.Second)
	defer cancel()
	a.mu.Lock()
	err := a.proc.Stop(ctx)
	a.mu.Unlock()
	if err != nil {
		a.log.Error("stopping etcd failed", "error", err)
	}
	for _, c := range a.peers {
		_ = c.Close()
	}
	if a.client != nil {
		_ = a.client.Close()
	}
	if a.store != nil {
		_ = a.store.Close()
	}
	a.log.Info("agent stopped")
}

// maxQuickCycles bounds back-to-back cycles after changes.
const maxQuickCycles = 5

// errWait means an action found its precondition not yet met (a learner
// still catching up); it is retried on a later cycle and is no failure.
var errWait = errors.New("controller: not ready yet")

// cycle runs one observe → plan → act round, and reports whether it
// changed something. It never panics on bad data and never returns an
// error: problems are logged and retried next cycle.
func (a *Agent) cycle(ctx context.Context) (changed bool) {
	obs := a.observe(ctx)
	for _, act := range plan.Plan(obs) {
		if ctx.Err() != nil {
			return false
		}
		if r, ok := act.(plan.Report); ok {
			a.report(ctx, r)
			continue
		}
		a.log.Info("performing action", "action", act.String())
		err := a.execute(ctx, obs, act)
		a.met.actionsPerformed.WithLabelValues(actionKind(act), result(err)).Inc()
		switch {
		case errors.Is(err, errWait):
			a.log.Info("action must wait; will retry", "action", act.String(), "reason", err)
			return false
		case err != nil:
			a.log.Error("action failed; will retry", "action", act.String(), "error", err)
			return false
		}
		if act.Mutates() {
			// Re-observe before acting again.
			return true
		}
	}
	return false
}

func (a *Agent) report(ctx context.Context, r plan.Report) {
	if r.Level <= slog.LevelInfo {
		if r.Msg == a.lastInfo {
			return
		}
		a.lastInfo = r.Msg
	} else {
		a.lastInfo = ""
	}
	a.log.Log(ctx, r.Level, r.Msg, r.Attrs...)
}

// openStore opens the backup store once, retrying on later cycles while
// it is unreachable.
func (a *Agent) openStore(ctx context.Context) (*store.Store, error) {
	if a.store != nil {
		return a.store, nil
	}
	s, err := store.Open(ctx, a.cfg.BackupStore, store.Options{Create: true})
	if err != nil {
		return nil, err
	}
	a.store = s
	return s, nil
}

// localClient returns a client for the local etcd's endpoint.
func (a *Agent) localClient(endpoint string) (*clientv3.Client, error) {
	if a.client != nil && a.clientEndpoint == endpoint {
		return a.client, nil
	}
	if a.client != nil {
		_ = a.client.Close()
		a.client = nil
	}
	c, err := etcdproc.NewClient([]string{endpoint}, a.etcdTLS)
	if err != nil {
		return nil, err
	}
	a.client, a.clientEndpoint = c, endpoint
	return c, nil
}

// setState persists st durably, then makes it the node's state and shows
// it to peers at once, so a leader never acts again on the old one.
// Callers hold a.mu.
func (a *Agent) setState(st etcdproc.State) error {
	if err := a.layout.SaveState(st); err != nil {
		return err
	}
	a.state = st
	a.refreshInfoMember()
	return nil
}

// refreshInfoMember updates the served info from the node's state.
// Callers hold a.mu.
func (a *Agent) refreshInfoMember() {
	a.infoMu.Lock()
	defer a.infoMu.Unlock()
	a.info.Member = a.state.Member
	a.info.HasData = a.state.Member != nil && a.layout.HasEtcdData(a.state.Member.ClusterToken)
	a.info.EtcdWanted = a.proc.Status().Wanted
	if !a.info.EtcdWanted {
		a.info.EtcdHealthy = false
	}
}

// Info serves the peer API: the node as last observed.
func (a *Agent) Info(context.Context) (peer.NodeInfo, error) {
	a.infoMu.Lock()
	defer a.infoMu.Unlock()
	return a.info, nil
}

// Join serves the peer API: become a member as the leader says. It is
// idempotent for the same membership and refuses a different one.
func (a *Agent) Join(ctx context.Context, req peer.JoinRequest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := req.Member
	if cur := a.state.Member; cur != nil {
		if cur.ClusterToken == m.ClusterToken && cur.InitialCluster == m.InitialCluster {
			return nil
		}
		return fmt.Errorf("%w (cluster token %s)", peer.ErrBusy, cur.ClusterToken)
	}
	v, err := spec.ParseSupportedVersion(m.EtcdVersion)
	if err != nil {
		return err
	}
	if _, err := etcdproc.FindBinaries(a.cfg.EtcdBinDir, v); err != nil {
		return err
	}
	if !m.NewCluster && a.layout.HasEtcdData(m.ClusterToken) {
		// Data left from an earlier membership under the same token would
		// carry the old member's identity; joining needs a clean start.
		trashed, err := a.layout.Trash(m.ClusterToken, a.now())
		if err != nil {
			return err
		}
		a.log.Warn("moved stale etcd data aside before joining", "cluster-token", m.ClusterToken, "data-moved-to", trashed)
	}
	m.PeerURLs = a.cfg.PeerURLs
	st := a.state
	st.Member = &m
	if err := a.setState(st); err != nil {
		return err
	}
	a.log.Info("joining cluster", "leader", req.LeaderID, "cluster-token", m.ClusterToken, "pending", m.Pending, "new-cluster", m.NewCluster)
	defer a.poke()
	if m.Pending {
		a.pendingSince = a.now()
		return nil
	}
	return a.startEtcdLocked(ctx)
}

// Leave serves the peer API: stop being a member of the cluster with
// req.Token. etcd is stopped and its data moved to the trash.
func (a *Agent) Leave(ctx context.Context, req peer.LeaveRequest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.state.Member
	if cur == nil {
		return nil
	}
	if cur.ClusterToken != req.Token {
		return fmt.Errorf("controller: leave cluster %s: this node is in cluster %s", req.Token, cur.ClusterToken)
	}
	defer a.poke()
	return a.leaveLocked(ctx, req.Reason)
}

// leaveLocked stops etcd, trashes its data and drops the membership.
// Callers hold a.mu.
func (a *Agent) leaveLocked(ctx context.Context, reason string) error {
	token := a.state.Member.ClusterToken
	if err := a.proc.Stop(ctx); err != nil {
		return err
	}
	trashed, err := a.layout.Trash(token, a.now())
	if err != nil {
		return err
	}
	st := a.state
	st.Member = nil
	if err := a.setState(st); err != nil {
		return err
	}
	a.log.Warn("left the cluster; this node is now a standby", "cluster-token", token, "reason", reason, "data-moved-to", trashed)
	return nil
}

func (a *Agent) startEtcdLocked(ctx context.Context) error {
	m := a.state.Member
	if m == nil {
		return errors.New("controller: this node is not a member")
	}
	v, err := spec.ParseSupportedVersion(m.EtcdVersion)
	if err != nil {
		return fmt.Errorf("controller: local state: %w", err)
	}
	bins, err := etcdproc.FindBinaries(a.cfg.EtcdBinDir, v)
	if err != nil {
		return err
	}
	if err := bins.CheckVersion(ctx); err != nil {
		return err
	}
	if m.NewCluster && a.layout.HasEtcdData(m.ClusterToken) {
		if err := a.markBootstrappedLocked(); err != nil {
			return err
		}
		m = a.state.Member
	}
	if err := a.proc.Start(ctx, a.etcdSpec(bins, m)); err != nil {
		return err
	}
	a.refreshInfoMember()
	if m.NewCluster {
		go a.watchBootstrap(m.ClusterToken)
	}
	return nil
}

// watchBootstrap clears NewCluster the moment etcd writes its data dir,
// before the new member can have taken part in raft. Should the data be
// lost after that, the node must rejoin as a new member, never bootstrap
// again under its old identity.
func (a *Agent) watchBootstrap(token string) {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if !a.layout.HasEtcdData(token) {
			continue
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if m := a.state.Member; m != nil && m.ClusterToken == token {
			if err := a.markBootstrappedLocked(); err != nil {
				a.log.Error("cannot record that etcd has bootstrapped; will retry", "error", err)
			}
		}
		return
	}
}

// markBootstrappedLocked clears NewCluster once etcd has written its data:
// from then on a missing data dir means lost data, never a cluster to
// create again. The running etcd keeps running; later restarts use the
// new state.
func (a *Agent) markBootstrappedLocked() error {
	if a.state.Member == nil || !a.state.Member.NewCluster {
		return nil
	}
	st := a.state
	m := *st.Member
	m.NewCluster = false
	st.Member = &m
	if err := a.setState(st); err != nil {
		return err
	}
	if cur := a.proc.Status().Spec; cur != nil {
		a.proc.Update(a.etcdSpec(cur.Binaries, &m))
	}
	return nil
}

func (a *Agent) etcdSpec(bins etcdproc.Binaries, m *etcdproc.MemberState) etcdproc.Spec {
	return etcdproc.Spec{
		Binaries:             bins,
		Name:                 a.state.NodeID,
		DataDir:              a.layout.EtcdDataDir(m.ClusterToken),
		ClientURLs:           a.cfg.ClientURLs,
		QuarantineClientURLs: a.cfg.QuarantineClientURLs,
		Quarantined:          m.Quarantined,
		PeerURLs:             a.servedPeerURLs(m),
		ListenPeerURLs:       a.listenPeerURLs(a.servedPeerURLs(m)),
		InitialCluster:       m.InitialCluster,
		NewCluster:           m.NewCluster,
		ClusterToken:         m.ClusterToken,
		ForceNewCluster:      m.ForceNewCluster,
		SnapshotCount:        a.cfg.EtcdSnapshotCount,
		TLS:                  a.etcdTLSFiles(),
	}
}

func newToken() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("controller: cluster token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// actionKind is the action's name without its arguments, for metrics.
func actionKind(act plan.Action) string {
	kind, _, _ := strings.Cut(act.String(), " ")
	return kind
}

func result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, errWait):
		return "wait"
	default:
		return "error"
	}
}

// listenPeerURLs are the addresses etcd binds while it advertises
// served: --listen-peer-urls when given, in served's scheme (which
// differs from the configured one only during an http to https switch);
// nil binds served itself.
func (a *Agent) listenPeerURLs(served []string) []string {
	if len(a.cfg.ListenPeerURLs) == 0 || len(served) == 0 {
		return nil
	}
	scheme := "https"
	if u, err := url.Parse(served[0]); err == nil && u.Scheme != "" {
		scheme = u.Scheme
	}
	out := make([]string, 0, len(a.cfg.ListenPeerURLs))
	for _, raw := range a.cfg.ListenPeerURLs {
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
func (a *Agent) servedPeerURLs(m *etcdproc.MemberState) []string {
	if m != nil && len(m.PeerURLs) > 0 {
		return m.PeerURLs
	}
	return a.cfg.PeerURLs
}
