package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/credentials"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/capture"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/drill"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/history"
	"github.com/etcd-manager/etcd-manager/internal/journal"
	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/maintenance"
	"github.com/etcd-manager/etcd-manager/internal/node"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/procedure"
	"github.com/etcd-manager/etcd-manager/internal/status"
)

// Env is what the loop takes from the process that runs it (package
// agent): its identity and credentials, the journal it writes, the
// observers of each round, and what wakes it. Log, Now, Registry, Certs,
// Wake and Announced are required.
type Env struct {
	Log *slog.Logger
	Now func() time.Time
	// Transfers follows the backups this node downloads, for its peer
	// API's Info (nil: none).
	Transfers backup.Meter
	// Registry takes the loop's metrics.
	Registry prometheus.Registerer
	// PeerAddress is the peer API address this node advertises, host:port;
	// PeerPort is the port of its peers' API, for discovered hosts.
	PeerAddress string
	PeerPort    int
	// PeerCreds dial the peers' API. EtcdTLS is the TLS of etcd clients,
	// and EtcdTLSFiles its files; both nil with --etcd-insecure.
	PeerCreds    credentials.TransportCredentials
	EtcdTLS      *tls.Config
	EtcdTLSFiles *etcdproc.TLSFiles
	// CAFromDir is set when TLS is on and the CA comes from --pki-dir.
	CAFromDir bool
	// Certs reports the node certificate, which is renewed apart from the
	// loop.
	Certs Certs
	// Keys encrypt the backups and segments the loop writes, and decrypt
	// those it reads.
	Keys *crypt.Keyring
	// Wake asks for a cycle now. Announced returns the hosts of the peers
	// that announced a change since it was last called.
	Wake      <-chan struct{}
	Announced func() map[string]bool
	// Events is the node's journal.
	Events *journal.Journal
	// Observers receive each cycle: the status page, the cluster gauges.
	Observers []Observer
	// Readers read snapshots in child processes.
	Readers backupjob.Readers
	// Revoked is given the store's revocation list each cycle that reads
	// it (nil: none): the agent refuses the revoked nodes' certificates
	// and writes etcd's CRL file from it.
	Revoked func(pki.Revocations)
	// Revocations is the list in force when the loop starts (the one the
	// agent saved), until the store's is read.
	Revocations pki.Revocations
	// ReleasePages gives back the binary's read-only pages after a busy
	// spell (nil: never).
	ReleasePages func() (int64, error)
}

// Certs reports the node certificate as the agent last renewed it.
type Certs interface {
	// Marker is the node marker the certificate on disk carries, "" for
	// none.
	Marker() string
	// Trust is the sorted fingerprints of the CAs the node trusts.
	Trust() []string
	// Info is the certificate's facts for peers, nil before the first.
	Info() *peer.CertInfo
}

// Loop is the control loop of one node. Create it with New; Start its
// capture and Run it; once Run returned, StopCapture and Close it.
type Loop struct{ lp *loop }

// New returns the loop of node n.
func New(cfg Config, env Env, n *node.Node) (*Loop, error) {
	if err := env.check(); err != nil {
		return nil, err
	}
	lp, err := newLoop(cfg, env, n)
	if err != nil {
		return nil, err
	}
	return &Loop{lp: lp}, nil
}

// check refuses an Env that lacks what the loop cannot run without.
func (e Env) check() error {
	var missing []string
	for name, ok := range map[string]bool{"Log": e.Log != nil, "Now": e.Now != nil, "Registry": e.Registry != nil,
		"Certs": e.Certs != nil, "Wake": e.Wake != nil, "Announced": e.Announced != nil} {
		if !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("controller: the loop's Env lacks %s", strings.Join(missing, ", "))
	}
	return nil
}

// Start starts uploading what continuous capture spools, until ctx ends.
func (l *Loop) Start(ctx context.Context) { go l.lp.capture.Upload(ctx) }

// Run runs cycles until ctx is cancelled.
func (l *Loop) Run(ctx context.Context) { l.lp.run(ctx) }

// StopCapture stops continuous capture: its watch is a stream etcd's
// graceful stop would wait for.
func (l *Loop) StopCapture() { l.lp.capture.Stop() }

// Close closes the loop's clients.
func (l *Loop) Close() { l.lp.close() }

func newLoop(cfg Config, env Env, n *node.Node) (*loop, error) {
	lp := &loop{
		cfg:            cfg,
		env:            env,
		log:            env.Log,
		now:            env.Now,
		met:            newMetrics(env.Registry),
		node:           n,
		peers:          map[string]*peer.Client{},
		memberConns:    map[string]*clientv3.Client{},
		unhealthySince: plan.Since{},
		learnerSince:   plan.Since{},
		failures:       newFailures(),
		offsets:        map[string]time.Duration{},
		revoked:        env.Revocations,
	}
	lp.figures = status.NewFigures(env.Registry, lp.now)
	lp.backups = cfg.Backup.NewTaker(n.ID(), lp.log, func() time.Time { return lp.now() }, env.Readers)
	lp.backups.FailedAt = lp.figures.Failed
	lp.backups.Taken = func(info backup.Info, at time.Time) {
		lp.figures.Taken(info, at)
		// The status page shows it at once, not after the next read of
		// the store's figures.
		lp.lastTaken.Store(&info)
	}
	lp.backups.Keys = lp.env.Keys
	lp.lease = &lease.Fence{
		Lock:  &lease.Lock{NodeID: n.ID(), TTL: cfg.LeaderLease, Now: lp.now, Floor: func() int64 { return lp.termFloor }},
		Store: func() lease.Store { return lp.store },
	}
	lp.lease.RegisterMetrics(env.Registry)
	var err error
	lp.discovery, err = peer.ParseDiscovery(cfg.Discovery, peer.DiscoveryOptions{
		Store: func(ctx context.Context) (peer.BlobStore, error) {
			s, err := lp.openStore(ctx)
			if err != nil {
				return nil, err
			}
			return s, nil
		},
		PeerPort:   env.PeerPort,
		MaxAge:     10 * time.Minute,
		Now:        lp.now,
		MaxRecords: cfg.DiscoveryMaxRecords,
	})
	if err != nil {
		return nil, err
	}
	lp.procedures = &procedure.Executor{
		Runner: &procedure.Runner{
			Fence:      lp.lease,
			Records:    storeRecords{lp},
			Log:        lp.log,
			Now:        lp.now,
			RenewEvery: max(cfg.LeaderLease/6, 100*time.Millisecond),
			Metrics:    procedure.NewMetrics(env.Registry),
			OnFail:     lp.env.Events.CommandFailed,
		},
		Nodes:      lp,
		Backups:    procedureBackups{lp},
		SelfID:     n.ID(),
		ClientTLS:  lp.env.EtcdTLS,
		WriteKeyID: lp.env.Keys.WriteKeyID(),
		Log:        lp.log,
		Now:        lp.now,
		Changed:    func() { lp.lastChange = lp.now() },
	}
	lp.members = newMembers(lp)
	lp.capture = capture.New(cfg.Capture, cfg.DataDir, cfg.BackupStore, lp.log, lp.now, env.Registry)
	lp.capture.Keys = lp.env.Keys
	lp.historyMet = history.NewMetrics(env.Registry)
	lp.drills = drill.NewDriller(env.Registry)
	lp.drills.Store, lp.drills.Node, lp.drills.Log, lp.drills.Now = cfg.BackupStore, n.ID(), lp.log, lp.now
	lp.drills.Event, lp.drills.Panicked = lp.env.Events.Add, lp.met.panics.Inc
	lp.hasher = maintenance.NewHashChecker(lp.log, lp.now, env.Registry)
	lp.defragger = maintenance.NewDefragger(lp.log, lp.now, env.Registry)
	lp.compaction = maintenance.NewCompactor(cfg.Compaction, lp.log, lp.now, env.Registry)
	return lp, nil
}
