package backupagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	etcdclient "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/capture"
	"github.com/etcd-manager/etcd-manager/internal/controller"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/journal"
	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/status"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/storeops"
)

// Agent takes backups of an etcd that etcd-manager does not manage:
// periodic and on-demand (backup-now), verified, with retention, in the
// same store format as the managing agent. Of several backup agents on one
// store, the holder of the store lock backs up.
type Agent struct {
	cfg     Config
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
	events *journal.Journal
	// storeChecked is set once the store honoured create-if-absent.
	storeChecked bool
	// opened is set once Open read the TLS and key files.
	opened bool
}

// New returns a backup agent for a validated, completed
// configuration, whose metrics reg takes; readers read its snapshots.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer, readers backupjob.Readers) *Agent {
	met := newMetrics(reg)
	b := &Agent{cfg: cfg, log: log, met: met, now: time.Now}
	b.backups = cfg.Backup.NewTaker(cfg.NodeID, log, func() time.Time { return b.now() }, readers)
	figures := status.NewFigures(reg, func() time.Time { return b.now() })
	b.backups.Taken, b.backups.FailedAt = figures.Taken, figures.Failed
	b.lock = lease.Lock{NodeID: cfg.NodeID, TTL: cfg.LockLease, Now: func() time.Time { return b.now() }}
	b.capture = capture.New(cfg.Capture, cfg.TempDir, cfg.BackupStore, log, func() time.Time { return b.now() }, reg)
	b.events = journal.New(cfg.NodeID, func() time.Time { return b.now() }, log, controller.QuietError)
	return b
}

// Open reads the TLS and key files; Run calls it unless it was called.
func (b *Agent) Open() error {
	if b.opened {
		return nil
	}
	var err error
	if b.tls, err = b.cfg.tlsConfig(); err != nil {
		return err
	}
	keys, err := b.cfg.Backup.Keyring()
	if err != nil {
		return fmt.Errorf("backupagent: %w", err)
	}
	b.backups.Keys, b.capture.Keys = keys, keys
	backupjob.LogKeys(b.log, keys)
	b.opened = true
	return nil
}

// Run backs up until ctx is cancelled. Problems with etcd or the store are
// logged and retried; only bad TLS or key files stop it. Package agent
// serves its metrics.
func (b *Agent) Run(ctx context.Context) error {
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

func (b *Agent) cycle(ctx context.Context) {
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
	b.met.setLeader(term != 0)
	if term == 0 {
		b.capture.Follow(false, "", nil, nil, false)
		return // another backup agent holds the lock
	}
	due := b.backups.Due(b.cfg.Backup.Interval, b.capture.NeedsBase())
	b.followEtcd(ctx, due)
	cmds, err := storeops.ReadCommands(ctx, s, b.now())
	if err != nil {
		b.log.Error("cannot read the command queue; will retry", "error", err)
		return
	}
	actions := plan.PlanBackupAgent(cmds, b.backups.FailedRecently(), due)
	for _, act := range actions {
		err := b.execute(ctx, s, term, act)
		if _, ok := act.(plan.Report); !ok {
			b.met.actions.WithLabelValues(controller.ActionLabels(act, err)).Inc()
			b.events.Outcome(act, err)
		}
		if err != nil {
			b.log.Error("action failed", "action", act.String(), "error", err)
			return
		}
	}
}

func (b *Agent) execute(ctx context.Context, s *store.Store, term int64, act plan.Action) error {
	switch act := act.(type) {
	case plan.Report:
		b.log.Log(ctx, act.Level, act.Msg, act.Attrs...)
		return nil
	case plan.FailCommand, plan.ForgetCommand:
		return storeops.RunCommandAction(ctx, s, b.now(), b.log, act)
	case plan.TakeBackup:
		// Fencing: the lock may have passed to another agent while this
		// one was busy.
		held, err := b.lock.Holds(ctx, s, term)
		if err != nil {
			return err
		}
		if !held {
			return fmt.Errorf("%w: the store lock moved to another backup agent", lease.ErrNotHeld)
		}
		req, err := b.request(ctx)
		if err != nil {
			b.backups.Failed(ctx, s, act.Kind, err)
			return err
		}
		req.Kind = act.Kind
		_, err = b.backups.Take(ctx, s, req, 0, act.Reason, act.CommandIDs...)
		if err == nil {
			b.capture.BackedUp()
		}
		return err
	}
	return fmt.Errorf("backupagent: backup agent cannot perform %s", act)
}

// followEtcd keeps capture following the etcd while this agent holds the
// lock: its timeline is the etcd cluster's ID, as its backups record.
func (b *Agent) followEtcd(ctx context.Context, backupDue bool) {
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
func (b *Agent) request(ctx context.Context) (backup.Request, error) {
	cfg := etcdclient.Config{Endpoints: b.cfg.Endpoints, DialTimeout: 5 * time.Second, TLS: b.tls, Logger: zap.NewNop()}
	c, err := etcdclient.New(cfg)
	if err != nil {
		return backup.Request{}, fmt.Errorf("backupagent: etcd client: %w", err)
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
	return backup.Request{}, fmt.Errorf("backupagent: no healthy etcd endpoint: %w", errors.Join(errs...))
}
