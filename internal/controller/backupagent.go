package controller

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	etcdclient "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/capture"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/status"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// BackupAgentConfig configures the backup-only agent, for an etcd that
// etcd-manager does not manage.
type BackupAgentConfig struct {
	BackupStore string
	// Endpoints are etcd's client URLs.
	Endpoints []string
	// CACert, Cert and Key are PEM files for etcd's client TLS.
	CACert, Cert, Key string
	Backup            backupjob.Config
	// TempDir holds a snapshot while it is verified and compressed.
	TempDir string
	// MetricsAddress serves Prometheus metrics when set (host:port).
	MetricsAddress string
	// NodeID names this agent in the store's lock.
	NodeID string
	// LockLease is the store lock's lease: of several backup agents on one
	// store, only the holder backs up.
	LockLease time.Duration
	// LoopInterval is the time between cycles.
	LoopInterval time.Duration
	// Capture is continuous capture of the etcd, by the lock holder,
	// spooled under <temp-dir>/capture.
	Capture changelog.Config
}

// DefaultBackupAgent returns the defaults.
func DefaultBackupAgent() BackupAgentConfig {
	return BackupAgentConfig{
		Backup:       backupjob.Default(),
		TempDir:      filepath.Join(os.TempDir(), "etcd-manager-backup"),
		LockLease:    30 * time.Second,
		LoopInterval: 5 * time.Second,
		Capture:      changelog.Default(),
	}
}

// Complete fills in defaults that depend on the machine.
func (c *BackupAgentConfig) Complete() {
	if c.NodeID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.NodeID = fmt.Sprintf("backup-%s-%s", host, hex.EncodeToString(b))
	}
}

// Validate reports every problem with the configuration at once.
func (c BackupAgentConfig) Validate() error {
	var errs []error
	if c.BackupStore == "" {
		errs = append(errs, fmt.Errorf("--%s is required", FlagBackupStore))
	} else if err := store.CheckURL(c.BackupStore); err != nil {
		errs = append(errs, fmt.Errorf("--%s: %w", FlagBackupStore, err))
	}
	if len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("--endpoints is required, for example --endpoints=https://10.0.0.1:2379"))
	}
	var plain, secure []string
	for _, e := range c.Endpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--endpoints: %q is not an http(s)://host:port URL", e))
			continue
		}
		if u.Scheme == "http" {
			plain = append(plain, e)
		} else {
			secure = append(secure, e)
		}
	}
	// etcd's client sends plain http to an http:// endpoint whatever TLS
	// it is given: refuse rather than downgrade in silence.
	switch tlsFlags := c.CACert != "" || c.Cert != "" || c.Key != ""; {
	case len(plain) > 0 && tlsFlags:
		errs = append(errs, fmt.Errorf("--endpoints %s: plain http, but --cacert, --cert or --key are given: "+
			"the snapshot would travel unencrypted and the certificates be ignored; use https:// endpoints, or drop the TLS flags if etcd serves plain http only",
			strings.Join(plain, ",")))
	case len(plain) > 0 && len(secure) > 0:
		errs = append(errs, fmt.Errorf("--endpoints mixes plain http (%s) with https (%s): some snapshots would travel unencrypted; use https:// throughout",
			strings.Join(plain, ","), strings.Join(secure, ",")))
	}
	if (c.Cert == "") != (c.Key == "") {
		errs = append(errs, errors.New("--cert and --key go together"))
	}
	for _, f := range []string{c.CACert, c.Cert, c.Key} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("TLS file: %w", err))
		}
	}
	errs = append(errs, c.Backup.Validate()...)
	if c.LockLease < time.Second {
		errs = append(errs, errors.New("--lock-lease must be at least 1s"))
	}
	if c.LoopInterval <= 0 || c.LoopInterval > c.LockLease/2 {
		errs = append(errs, errors.New("--loop-interval must be positive and at most half of --lock-lease"))
	}
	if err := c.Capture.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MetricsAddress != "" {
		if _, err := url.Parse("http://" + c.MetricsAddress); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-address %q: want host:port", c.MetricsAddress))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("controller: invalid configuration: %w", errors.Join(errs...))
	}
	return nil
}

// tlsConfig is etcd's client TLS, or nil for plain http.
func (c BackupAgentConfig) tlsConfig() (*tls.Config, error) {
	if c.CACert == "" && c.Cert == "" {
		return nil, nil
	}
	info := transport.TLSInfo{TrustedCAFile: c.CACert, CertFile: c.Cert, KeyFile: c.Key}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("controller: etcd client TLS: %w", err)
	}
	return cfg, nil
}

// BackupAgent takes backups of an etcd that etcd-manager does not manage:
// periodic and on-demand (backup-now), verified, with retention, in the
// same store format as the managing agent. Of several backup agents on one
// store, the holder of the store lock backs up.
type BackupAgent struct {
	cfg     BackupAgentConfig
	log     *slog.Logger
	met     *metrics
	now     func() time.Time
	backups *backupjob.Taker
	lock    lease.Lock
	capture *capture.Capturer
	store   *store.Store
	tls     *tls.Config
	// events records the backups taken and the actions that failed in the
	// store's event history, as a managing agent does.
	events *EventLog
	// storeChecked is set once the store honoured create-if-absent.
	storeChecked bool
	// opened is set once Open read the TLS and key files.
	opened bool
}

// NewBackupAgent returns a backup agent for a validated, completed
// configuration, whose metrics reg takes; readers read its snapshots.
func NewBackupAgent(cfg BackupAgentConfig, log *slog.Logger, reg prometheus.Registerer, readers Readers) *BackupAgent {
	met := newMetrics(reg)
	b := &BackupAgent{cfg: cfg, log: log, met: met, now: time.Now}
	b.backups = newBackups(cfg.Backup, cfg.NodeID, log, status.NewFigures(reg, func() time.Time { return b.now() }), func() time.Time { return b.now() }, readers)
	b.lock = lease.Lock{NodeID: cfg.NodeID, TTL: cfg.LockLease, Now: func() time.Time { return b.now() }}
	b.capture = capture.New(cfg.Capture, cfg.TempDir, cfg.BackupStore, log, func() time.Time { return b.now() }, reg)
	b.events = NewEventLog(cfg.NodeID, func() time.Time { return b.now() }, log)
	return b
}

// Open reads the TLS and key files; Run calls it unless it was called.
func (b *BackupAgent) Open() error {
	if b.opened {
		return nil
	}
	var err error
	if b.tls, err = b.cfg.tlsConfig(); err != nil {
		return err
	}
	keys, err := b.cfg.Backup.Keyring()
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	b.backups.Keys, b.capture.Keys = keys, keys
	backupjob.LogKeys(b.log, keys)
	b.opened = true
	return nil
}

// Run backs up until ctx is cancelled. Problems with etcd or the store are
// logged and retried; only bad TLS or key files stop it. Package agent
// serves its metrics.
func (b *BackupAgent) Run(ctx context.Context) error {
	if err := b.Open(); err != nil {
		return err
	}
	defer b.events.Start(ctx, b.cfg.BackupStore)()
	b.log.Info("backup agent starting", "node-id", b.cfg.NodeID, "endpoints", b.cfg.Endpoints, "backup-store", b.cfg.BackupStore,
		"interval", b.cfg.Backup.Interval, "retention", b.cfg.Backup.Retention)
	ticker := time.NewTicker(b.cfg.LoopInterval)
	defer ticker.Stop()
	go b.capture.Upload(ctx)
	defer b.capture.Stop()
	for {
		b.cycle(ctx)
		select {
		case <-ctx.Done():
			if b.store != nil {
				b.store.Close()
			}
			return nil
		case <-ticker.C:
		}
	}
}

func (b *BackupAgent) cycle(ctx context.Context) {
	if b.store == nil {
		s, err := store.Open(ctx, b.cfg.BackupStore, store.Options{Create: true})
		if err != nil {
			b.log.Error("backup store unreachable; will retry", "error", err)
			return
		}
		b.store = s
	}
	s := b.store
	if !b.storeChecked {
		// Of several backup agents, one backs up: the store lock decides,
		// which needs create-if-absent.
		switch err := lease.CheckCreateOnce(ctx, s, b.cfg.NodeID); {
		case errors.Is(err, lease.ErrUntrustedStore):
			b.log.Error("not backing up: this store cannot elect one backup agent", "error", err)
			return
		case err != nil:
			b.log.Error("backup store unreachable; will retry", "error", err)
			return
		}
		b.storeChecked = true
	}
	term, err := b.lock.Acquire(ctx, s)
	if err != nil {
		b.log.Error("backup store unreachable; will retry", "error", err)
		return
	}
	boolGauge(b.met.leader, term != 0)
	if term == 0 {
		b.capture.Follow(false, "", nil, nil, false)
		return // another backup agent holds the lock
	}
	due := backupDue(b.backups, b.cfg.Backup.Interval, b.capture.NeedsBase())
	b.followEtcd(ctx, due)
	cmds, err := readCommands(ctx, s, b.now())
	if err != nil {
		b.log.Error("cannot read the command queue; will retry", "error", err)
		return
	}
	actions := plan.PlanBackupAgent(cmds, b.backups.FailedRecently(), due)
	for _, act := range actions {
		err := b.execute(ctx, s, term, act)
		if _, ok := act.(plan.Report); !ok {
			b.met.actionsPerformed.WithLabelValues(actionKind(act), result(err)).Inc()
			b.events.outcome(act, err)
		}
		if err != nil {
			b.log.Error("action failed", "action", act.String(), "error", err)
			return
		}
	}
}

func (b *BackupAgent) execute(ctx context.Context, s *store.Store, term int64, act plan.Action) error {
	switch act := act.(type) {
	case plan.Report:
		b.log.Log(ctx, act.Level, act.Msg, act.Attrs...)
		return nil
	case plan.FailCommand, plan.ForgetCommand:
		return runCommandAction(ctx, s, b.now(), b.log, act)
	case plan.TakeBackup:
		// Fencing: the lock may have passed to another agent while this
		// one was busy.
		held, err := b.lock.Holds(ctx, s, term)
		if err != nil {
			return err
		}
		if !held {
			return fmt.Errorf("%w: the store lock moved to another backup agent", ErrNotLeader)
		}
		req, err := b.request(ctx)
		if err != nil {
			b.backups.Failed(ctx, s, act.Kind, err)
			return err
		}
		req.Kind = act.Kind
		_, err = b.backups.Take(ctx, s, req, act.Reason, act.CommandIDs...)
		if err == nil {
			b.capture.BackedUp()
		}
		return err
	}
	return fmt.Errorf("controller: backup agent cannot perform %s", act)
}

// followEtcd keeps capture following the etcd while this agent holds the
// lock: its timeline is the etcd cluster's ID, as its backups record.
func (b *BackupAgent) followEtcd(ctx context.Context, backupDue bool) {
	if !b.cfg.Capture.Enabled {
		return
	}
	req, err := b.request(ctx)
	if err != nil {
		b.log.Warn("capture waits for a healthy etcd endpoint", "error", err)
		b.capture.Follow(false, "", nil, nil, false)
		return
	}
	b.capture.Follow(true, req.ClusterToken, b.cfg.Endpoints, b.tls, backupDue)
}

// request finds a healthy member to snapshot and describes the cluster
// for the backup's meta: its voting member count and server version.
func (b *BackupAgent) request(ctx context.Context) (backup.Request, error) {
	cfg := etcdclient.Config{Endpoints: b.cfg.Endpoints, DialTimeout: 5 * time.Second, TLS: b.tls, Logger: zap.NewNop()}
	c, err := etcdclient.New(cfg)
	if err != nil {
		return backup.Request{}, fmt.Errorf("controller: etcd client: %w", err)
	}
	defer c.Close()
	var errs []error
	for _, ep := range b.cfg.Endpoints {
		cctx, cancel := context.WithTimeout(ctx, etcdproc.CallTimeout)
		st, err := c.Status(cctx, ep)
		if err == nil {
			var members *etcdclient.MemberListResponse
			members, err = c.MemberList(cctx)
			if err == nil {
				cancel()
				voters := 0
				for _, m := range members.Members {
					if !m.IsLearner {
						voters++
					}
				}
				return backup.Request{
					Client:       etcdclient.Config{DialTimeout: 5 * time.Second, TLS: b.tls},
					Endpoint:     ep,
					TempDir:      b.cfg.TempDir,
					EtcdVersion:  st.Version,
					ClusterSpec:  &spec.ClusterSpec{MemberCount: int32(voters), EtcdVersion: st.Version},
					ClusterToken: fmt.Sprintf("%x", st.Header.ClusterId),
				}, nil
			}
		}
		cancel()
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
	}
	return backup.Request{}, fmt.Errorf("controller: no healthy etcd endpoint: %w", errors.Join(errs...))
}
