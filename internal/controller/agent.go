package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/node"
	"github.com/etcd-manager/etcd-manager/internal/operatorapi"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/procedure"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/status"
	"github.com/etcd-manager/etcd-manager/internal/store"
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
	events *eventLog
	// page is the status page served on --metrics-address.
	page *status.Page
}

// NewAgent returns an agent for a validated, completed configuration.
func NewAgent(cfg Config, log *slog.Logger) *Agent {
	return &Agent{
		cfg:  cfg,
		log:  log,
		now:  time.Now,
		met:  newMetrics(),
		wake: make(chan struct{}, 1),
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
		return fmt.Errorf("controller: %w", err)
	}
	a.keys = keys
	logKeys(a.log, keys)
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
	a.events = newEventLog(a.nodeID, a.now, a.log)
	a.page = &status.Page{Events: status.StoreEvents(a.cfg.BackupStore), Now: a.now}
	defer a.events.start(ctx, a.cfg.BackupStore)()
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
		CheckData:                childDataChecker(),
		CompactDB:                childCompactor(),
		CA:                       keeper,
		OnDiscard: func(reason, movedTo, detail string) {
			a.met.dataDiscarded.WithLabelValues(reason).Inc()
			a.events.add(spec.Event{Time: a.now(), Action: "discard-member-data (" + reason + ")", Outcome: spec.EventFailed,
				Message: "data moved to " + movedTo + "; the leader rebuilds this member from its peers: " + detail})
		},
	}, layout, st, storeFetcher{url: a.cfg.BackupStore, opts: a.cfg.restoreFetchOptions(childStatusReader(), a.keys), log: a.log}, a.log, a.now, a.poke)
	lp, err := newLoop(a, n)
	if err != nil {
		return err
	}
	go lp.capture.upload(ctx)
	listen := a.peerAddress()
	if a.cfg.PeerAPIListenAddress != "" {
		listen = a.cfg.PeerAPIListenAddress
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("controller: peer API: %w", err)
	}
	if a.cfg.MetricsAddress != "" {
		ready := n.Ready
		if a.cfg.Readiness == ReadinessVoter {
			ready = n.ReadyVoter
		}
		stop, err := a.met.serve(a.cfg.MetricsAddress, ready, a.page, a.cfg.EnablePprof)
		if err != nil {
			l.Close()
			return fmt.Errorf("controller: metrics: %w", err)
		}
		defer stop()
	}
	srv := peer.NewServer(a.serverCreds, a.cfg.ClusterName, n)
	srv.OnPeerChange(a.pokeFromPeer)
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
	lp.run(ctx)
	return nil
}

// pokeFromPeer is poke for a peer (or etcd-manager-ctl, with an
// operator's client certificate) that announced a change, at most once
// per soonInterval: callers hold certificates of the cluster's CA, but a
// faulty one must not keep the loop cycling. An announcement within the
// interval is not dropped: it wakes the loop when the interval is over.
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
	wait := soonInterval - a.now().Sub(a.lastPeerPoke)
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

func (a *Agent) shutdown(srv *peer.Server, n *node.Node, lp *loop) {
	srv.Stop()
	// Capture first: its watch is a stream etcd's graceful stop would
	// wait for.
	lp.capture.stop()
	// The caller's context is done; give etcd its own time to stop.
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.EtcdStopTimeout+5*time.Second)
	defer cancel()
	if err := n.Stop(ctx); err != nil {
		a.log.Error("stopping etcd failed", "error", err)
	}
	lp.close()
	a.log.Info("agent stopped")
}

// storeFetcher fetches and verifies backups for the node's restores,
// from a store of its own: peer API calls must not share the loop's.
type storeFetcher struct {
	url  string
	opts backup.FetchOptions
	log  *slog.Logger
}

func (f storeFetcher) Fetch(ctx context.Context, name string, p spec.RestorePoint, dir string) (string, error) {
	s, err := store.Open(ctx, f.url, store.Options{Create: true})
	if err != nil {
		return "", err
	}
	defer s.Close()
	opts := f.opts
	if p.ToRevision > 0 {
		// Captured segments are applied to the snapshot in this process:
		// its database is read whole in a child first, whatever the meta
		// says.
		opts.Hashed = false
	}
	got, err := fetchPoint(ctx, s, name, p, dir, opts, f.log)
	return got.Path, err
}

// fetchOptions bound what a backup fetched for a restore may unpack on
// the data dir's disk, decrypt it with keys and read its status with
// status.
func (c Config) fetchOptions(status backup.VerifyFunc, keys *crypt.Keyring) backup.FetchOptions {
	return backup.FetchOptions{Status: status, MaxBytes: c.MaxSnapshotBytes, Reserve: fetchReserve, Keys: keys}
}

// restoreFetchOptions are fetchOptions for a node's own restore: the
// leader fetched and verified the backup whole before it stopped the
// cluster, so a snapshot whose object matches the sha256 the meta records
// (the bytes the leader verified) is not read a second time before
// etcdutl restores it, which checks its trailer again itself. A restore
// to a point reads it all the same (see storeFetcher.Fetch).
func (c Config) restoreFetchOptions(status backup.VerifyFunc, keys *crypt.Keyring) backup.FetchOptions {
	o := c.fetchOptions(status, keys)
	o.Hashed = true
	return o
}

// fetched is a backup fetched, verified and brought forward to a point.
type fetched struct {
	Path string
	Meta backup.Meta
	// Keys are the IDs of the encryption keys the backup and the segments
	// needed.
	Keys []string
	// Forward is set when captured changes were applied, and Digest is
	// the revision of the digest that checked them (0: none in range).
	Forward bool
	Digest  int64
}

// fetchPoint fetches and verifies a backup, and brings it forward to the
// point's revision with the captured segments.
func fetchPoint(ctx context.Context, s *store.Store, name string, p spec.RestorePoint, dir string, opts backup.FetchOptions, log *slog.Logger) (fetched, error) {
	path, meta, err := backup.Fetch(ctx, s, name, dir, opts)
	f := fetched{Path: path, Meta: meta}
	if meta.Encryption != nil {
		f.Keys = append(f.Keys, meta.Encryption.KeyID)
	}
	if err != nil || p.ToRevision == 0 {
		return f, err
	}
	start := time.Now()
	// The snapshot may grow to what it takes now plus the room left, and
	// never past the maximum.
	bound := opts.MaxBytes
	st, err := os.Stat(path)
	if err != nil {
		return f, fmt.Errorf("controller: %w", err)
	}
	if room, err := opts.Room(dir); err == nil {
		bound = st.Size() + room
		if opts.MaxBytes > 0 {
			bound = min(bound, opts.MaxBytes)
		}
	} else {
		log.Warn("cannot read the free space before bringing a backup forward; bounding it by --max-snapshot-bytes alone", "error", err)
	}
	applied, err := changelog.Apply(ctx, s, path, p.Timeline, p.ToRevision, changelog.ApplyOptions{Keys: opts.Keys, MaxBytes: bound})
	if err != nil {
		f.Path = ""
		return f, fmt.Errorf("controller: bring backup %s forward to revision %d: %w", name, p.ToRevision, err)
	}
	for _, k := range applied.Keys {
		if !slices.Contains(f.Keys, k) {
			f.Keys = append(f.Keys, k)
		}
	}
	f.Forward, f.Digest = applied.Revisions > 0, applied.Digest
	log.Info("backup brought forward with captured changes", "backup", name, "timeline", p.Timeline, "from-revision", applied.From,
		"to-revision", applied.To, "revisions", applied.Revisions, "segments", applied.Segments, "leases", applied.Leases,
		"digest-checked-at", applied.Digest, "duration", time.Since(start).Round(time.Millisecond))
	return f, nil
}

// waiting reports whether err means an action found its precondition not
// yet met (a learner still catching up): it is retried on a later cycle
// and is no failure. Actions and procedure steps both say so with
// procedure.ErrWait.
func waiting(err error) bool {
	return errors.Is(err, procedure.ErrWait)
}

// lostLead reports whether err says only that this agent does not lead
// (any more): by etcd's raft, or by the store lock. Neither is a failure
// of the action.
func lostLead(err error) bool {
	return errors.Is(err, ErrNotLeader) || errors.Is(err, lease.ErrNotHeld)
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
	case waiting(err):
		return "wait"
	default:
		return "error"
	}
}
