package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/controller"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/journal"
	"github.com/etcd-manager/etcd-manager/internal/node"
	"github.com/etcd-manager/etcd-manager/internal/operatorapi"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/status"
)

// Agent is one node's etcd-manager: it keeps the process's lifetime and
// wiring. Create it with NewAgent and call Run once.
type Agent struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
	met *metrics
	// nodeID names this node; set by Run from the node's state.
	nodeID string
	// transfers follows this node's downloads of backups.
	transfers *transfers

	// creds dial peers and serverCreds serve the peer API; etcdTLS is the
	// TLS of etcd clients (nil with --etcd-insecure). See tls.go.
	creds, serverCreds credentials.TransportCredentials
	etcdTLS            *tls.Config
	// certMu serializes renewals (renewLoop) and CA rotation steps
	// (SyncCA), and guards ca, trust and renewAt.
	certMu sync.Mutex
	ca     *pki.CA
	// trust is the PEM of the CAs the node trusts, as last read.
	trust      []byte
	certInfo   atomic.Pointer[peer.CertInfo]
	renewAt    time.Time
	certExpiry atomic.Int64
	// revoked is the store's revocation list in force, as the loop last
	// read it (or as saved on disk, at start): the peer API and the
	// agent's clients refuse the revoked nodes' certificates. crlCA is
	// the CA that signs etcd's CRL file, and crlFor what the file on disk
	// was written from; crlMu serializes its writes, apart from certMu,
	// which renewals hold across the store's answers.
	revoked pki.RevocationSet
	crlCA   atomic.Pointer[pki.CA]
	crlMu   sync.Mutex
	crlFor  string
	// certMarked is set while the node certificate on disk carries the
	// node marker (read by the loop, set by renewals).
	certMarked atomic.Bool
	// refusals limits the log lines of refused peer API handshakes.
	refusals *refusalLog
	// keys encrypt the backups and segments this agent writes, and
	// decrypt those it reads; read from their files by Run.
	keys *crypt.Keyring

	// wake asks the loop for a cycle now, after a peer API call changed
	// this node.
	wake chan struct{}
	// lastPeerPoke is when a peer's announcement last woke the loop.
	peerPokeMu   sync.Mutex
	lastPeerPoke time.Time
	peerPokeDue  bool // a poke deferred by the rate limit is due
	// announcedFrom holds the hosts of peers that announced a change
	// since the loop last observed its peers (see pokeFromPeer); guarded
	// by peerPokeMu.
	announcedFrom map[string]bool
	// events records the history of the agent's changes and failures in
	// the store; set by Run.
	events *journal.Journal
	// page is the status page served on --metrics-address.
	page *status.Page
}

// NewAgent returns an agent for a validated, completed configuration.
func NewAgent(cfg Config, log *slog.Logger) *Agent {
	return &Agent{
		cfg:       cfg,
		log:       log,
		now:       time.Now,
		met:       newMetrics(),
		wake:      make(chan struct{}, 1),
		transfers: &transfers{now: time.Now},
	}
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
	keys, err := a.cfg.Backup.Keyring()
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.keys = keys
	backupjob.LogKeys(a.log, keys)
	layout := etcdproc.Layout{Root: a.cfg.DataDir}
	unlock, err := layout.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	st, err := node.LoadState(layout, a.cfg.NodeName, a.cfg.PeerURLs)
	if err != nil {
		return err
	}
	// Nothing can use tmp/ before the agent runs: what is there, a crash
	// left behind.
	if removed, err := layout.TidyTmp(a.now(), 0); err != nil {
		a.log.Warn("cannot tidy the tmp folder", "error", err)
	} else if len(removed) > 0 {
		a.log.Info("removed scratch space a crash left in tmp", "entries", removed)
	}
	a.nodeID = st.NodeID
	a.events = journal.New(a.nodeID, a.now, a.log, controller.QuietError)
	a.page = &status.Page{Events: status.StoreEvents(a.cfg.BackupStore), Now: a.now}
	defer a.events.Start(ctx, a.cfg.BackupStore)()
	// The revocations last read stay in force from the start, before the
	// loop reads the store's list.
	a.loadRevocations()
	if err := a.setupTLS(ctx); err != nil {
		return err
	}
	if a.tlsEnabled() {
		go a.renewLoop(ctx)
	}
	var keeper node.CAKeeper
	if a.tlsEnabled() {
		keeper = caKeeper{a}
	}
	n := node.New(node.Config{
		DataDir:                  a.cfg.DataDir,
		EtcdBinDir:               a.cfg.EtcdBinDir,
		ClientURLs:               a.cfg.ClientURLs,
		ListenClientURLs:         a.cfg.ListenClientURLs,
		QuarantineClientURLs:     a.cfg.QuarantineClientURLs,
		PeerURLs:                 a.cfg.PeerURLs,
		ListenPeerURLs:           a.cfg.ListenPeerURLs,
		EtcdSnapshotCount:        a.cfg.EtcdSnapshotCount,
		EtcdCorruptCheckInterval: a.cfg.EtcdCorruptCheckInterval,
		EtcdStopTimeout:          a.cfg.EtcdStopTimeout,
		EtcdTLS:                  a.etcdTLSFiles(),
		PeerCertCheckOff:         !a.cfg.EtcdPeerCertCheck,
		ClientTLS:                a.etcdTLS,
		Transfer:                 a.transfers.Current,
		CheckData:                childDataChecker(),
		CompactDB:                childCompactor(),
		CA:                       keeper,
		OnDiscard: func(reason, movedTo, detail string) {
			a.met.dataDiscarded.WithLabelValues(reason).Inc()
			a.events.Add(spec.Event{Time: a.now(), Action: "discard-member-data (" + reason + ")", Outcome: spec.EventFailed,
				Message: "data moved to " + movedTo + "; the leader rebuilds this member from its peers: " + detail})
		},
	}, layout, st, a.cfg.RestoreFetcher(childStatusReader(), a.keys, a.transfers, a.log), a.log, a.now, a.poke)
	lp, err := controller.New(a.cfg.Config, a.loopEnv(), n)
	if err != nil {
		return err
	}
	lp.Start(ctx)
	listen := a.peerAddress()
	if a.cfg.PeerAPIListenAddress != "" {
		listen = a.cfg.PeerAPIListenAddress
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("agent: peer API: %w", err)
	}
	if a.cfg.MetricsAddress != "" {
		ready := n.Ready
		if a.cfg.Readiness == ReadinessVoter {
			ready = n.ReadyVoter
		}
		stop, err := serve(a.cfg.MetricsAddress, a.met.reg, ready, a.page, a.cfg.EnablePprof)
		if err != nil {
			l.Close()
			return fmt.Errorf("agent: metrics: %w", err)
		}
		defer stop()
	}
	srv := peer.NewServer(a.serverCreds, a.cfg.ClusterName, n)
	if until, err := a.cfg.unmarkedUntil(a.now()); err == nil && until.After(a.now()) {
		srv.AcceptUnmarkedUntil(until)
		a.log.Warn("node certificates without a cluster marker may call the peer API until the time given", "until", until)
	}
	srv.OnPeerChange(a.pokeFromPeer)
	srv.RefuseRevoked(&a.revoked)
	if a.tlsEnabled() {
		srv.BindToStore(a.storeMarker())
	}
	ops := &operatorCalls{a: a, n: n}
	defer ops.close()
	operatorapi.Register(srv, a.cfg.ClusterName, ops)
	go func() {
		if err := srv.Serve(l); err != nil {
			a.log.Error("peer API stopped", "error", err)
		}
	}()
	a.log.Info("agent starting", "node-id", st.NodeID, "cluster-name", a.cfg.ClusterName, "peer-address", a.peerAddress(),
		"data-dir", a.cfg.DataDir, "backup-store", a.cfg.BackupStore, "discovery", a.cfg.Discovery, "member", st.Member != nil)

	defer a.shutdown(srv, n, lp)
	lp.Run(ctx)
	return nil
}

// pokeFromPeer is poke for a peer (or etcd-manager-ctl, with an
// operator's client certificate) that announced a change, at most once
// per controller.SoonInterval: callers hold certificates of the cluster's
// CA, but a faulty one must not keep the loop cycling. An announcement
// within the interval is not dropped: it wakes the loop when the interval
// is over.
// (At a cluster's creation, the nodes told to join announce their pending
// state moments before the creator announces its member started, the
// news they wait for.)
//
// A peer that announces itself is up, though the loop's connection to its
// address may still wait in gRPC's reconnect backoff, refused moments
// before by the agent it replaced there (a node restarted without its
// data): its host is kept so that the next cycle dials it again at once
// (see takeAnnouncedFrom), instead of missing the node until its tick.
// Hosts are matched by the IP the call came from, so a peer discovered by
// a DNS name is not redialled: it is read on the next tick, as before.
func (a *Agent) pokeFromPeer(host string) {
	a.peerPokeMu.Lock()
	defer a.peerPokeMu.Unlock()
	if host != "" && len(a.announcedFrom) < maxAnnouncedHosts {
		if a.announcedFrom == nil {
			a.announcedFrom = map[string]bool{}
		}
		a.announcedFrom[host] = true
	}
	wait := controller.SoonInterval - a.now().Sub(a.lastPeerPoke)
	switch {
	case wait <= 0:
		a.lastPeerPoke = a.now()
		a.poke()
	case !a.peerPokeDue:
		a.peerPokeDue = true
		time.AfterFunc(wait, func() {
			a.peerPokeMu.Lock()
			a.peerPokeDue, a.lastPeerPoke = false, a.now()
			a.peerPokeMu.Unlock()
			a.poke()
		})
	}
}

// maxAnnouncedHosts bounds the hosts kept between two cycles: a cluster
// has a handful of nodes, and a faulty caller must not grow the set.
const maxAnnouncedHosts = 64

// takeAnnouncedFrom returns the hosts of the peers that announced a
// change since the last call, and forgets them.
func (a *Agent) takeAnnouncedFrom() map[string]bool {
	a.peerPokeMu.Lock()
	defer a.peerPokeMu.Unlock()
	hosts := a.announcedFrom
	a.announcedFrom = nil
	return hosts
}

// poke asks the loop for a prompt cycle; it never blocks.
func (a *Agent) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *Agent) shutdown(srv *peer.Server, n *node.Node, lp *controller.Loop) {
	srv.Stop()
	// Capture first: its watch is a stream etcd's graceful stop would
	// wait for.
	lp.StopCapture()
	// The caller's context is done; give etcd its own time to stop.
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.EtcdStopTimeout+5*time.Second)
	defer cancel()
	if err := n.Stop(ctx); err != nil {
		a.log.Error("stopping etcd failed", "error", err)
	}
	lp.Close()
	a.log.Info("agent stopped")
}

// loopEnv is what the control loop takes from the agent.
func (a *Agent) loopEnv() controller.Env {
	return controller.Env{
		Log:          a.log,
		Now:          a.now,
		Transfers:    a.transfers,
		Registry:     a.met.reg,
		PeerAddress:  a.peerAddress(),
		PeerPort:     a.cfg.PeerPort,
		PeerCreds:    a.creds,
		EtcdTLS:      a.etcdTLS,
		EtcdTLSFiles: a.etcdTLSFiles(),
		CAFromDir:    a.cfg.PKIDir != "" && a.tlsEnabled(),
		Certs:        certs{a},
		Keys:         a.keys,
		Wake:         a.wake,
		Announced:    a.takeAnnouncedFrom,
		Events:       a.events,
		Observers:    a.observers(),
		Readers:      readers(),
		ReleasePages: releaseCodePages,
		Revoked:      a.takeRevocations,
		Revocations:  a.revoked.Get(),
	}
}

// observers are what each cycle of the loop is shown to: the status page
// and the cluster gauges.
func (a *Agent) observers() []controller.Observer {
	gauges := status.NewGauges(a.met.reg)
	return []controller.Observer{
		func(c controller.Cycle) { a.page.Show(status.Build(c.Observed, c.Facts)) },
		func(c controller.Cycle) { gauges.Set(c.Observed) },
	}
}

// certs reports the agent's node certificate to the loop.
type certs struct{ a *Agent }

func (c certs) Marker() string       { return c.a.certMarker() }
func (c certs) Trust() []string      { return c.a.trustReport() }
func (c certs) Info() *peer.CertInfo { return c.a.certInfo.Load() }
