package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// backups takes full backups, records their outcome (metrics, the
// backup-now command's status) and applies retention. The managing agent
// and the backup-only agent share it.
type backups struct {
	// node is the agent's ID, in the failures it records in the store.
	node       string
	log        *slog.Logger
	met        *metrics
	now        func() time.Time
	retention  string
	retryDelay time.Duration // after the first failure; doubles up to maxRetry
	maxRetry   time.Duration

	// status reads the status of a backup's local copy or of a fetched
	// snapshot, whose trailers were checked as they streamed.
	status backup.VerifyFunc
	// revision reads the revision of a backup's local copy.
	revision backup.RevisionFunc
	// keys encrypt the backups taken, when they hold a writing key.
	keys *crypt.Keyring

	lastOK, lastFailure time.Time
	failures            int // consecutive
}

// retryAt is when a backup may be tried again after failures.
func (b *backups) retryAt() time.Time {
	if b.failures == 0 {
		return time.Time{}
	}
	d := b.retryDelay
	for i := 1; i < b.failures && d < b.maxRetry; i++ {
		d *= 2
	}
	return b.lastFailure.Add(min(d, b.maxRetry))
}

// failedRecently reports whether the last attempt failed and its backoff
// has not run out.
func (b *backups) failedRecently() bool {
	return b.failures > 0 && b.now().Before(b.retryAt())
}

// stored records that the store holds a full backup of this agent's
// cluster begun at, taken by this agent or another: the periodic
// backup's interval runs from the newest.
func (b *backups) stored(at time.Time) {
	if at.After(b.lastOK) && !at.After(b.now()) {
		b.lastOK = at
	}
}

// due reports whether a full backup is due: the periodic one, or one
// capture needs to start a run from (see plan.BackupDue).
func (b *backups) due(interval time.Duration, needsBase bool) bool {
	return plan.BackupDue(b.now(), b.lastOK, interval, b.failedRecently(), needsBase)
}

// take takes one backup. With a commandID, it runs that backup-now
// command: the command's status says running, then done with the
// backup's name; a failed attempt stays running with the error, and is
// retried after the backoff.
func (b *backups) take(ctx context.Context, s *store.Store, req backup.Request, reason string, commandIDs ...string) (backup.Info, error) {
	setStatus := func(st spec.CommandStatus) {
		for _, id := range commandIDs {
			if err := s.SetCommandStatus(ctx, id, st, b.now()); err != nil {
				b.log.Warn("cannot record a command's status", "command", id, "error", err)
			}
		}
	}
	setStatus(spec.CommandStatus{State: spec.CommandRunning, Message: "taking a backup"})
	start := b.now()
	req.Now = start
	if req.Status == nil {
		req.Status = b.status
	}
	if req.Revision == nil {
		req.Revision = b.revision
	}
	if req.Keys == nil {
		req.Keys = b.keys
	}
	info, err := backup.Take(ctx, s, req)
	if err != nil {
		err = fmt.Errorf("controller: backup (%s): %w", reason, err)
		b.failed(ctx, s, req.Kind, err)
		setStatus(spec.CommandStatus{State: spec.CommandRunning,
			Message: fmt.Sprintf("attempt %d failed, retrying at %s: %v", b.failures, b.retryAt().UTC().Format(time.RFC3339), err)})
		return info, err
	}
	b.lastOK, b.failures = b.now(), 0
	took := b.lastOK.Sub(start)
	b.met.backupLastOK.Set(float64(b.lastOK.Unix()))
	b.met.backupFigures(info.Meta)
	if info.HashKVErr != nil {
		b.log.Warn("backup records no HashKV; a restore drill of it checks the revision alone", "name", info.Name, "error", info.HashKVErr)
	}
	if info.HashKVLate != nil {
		b.log.Warn("backup's HashKV was read after its status check, not beside it", "name", info.Name, "error", info.HashKVLate)
	}
	keyID := ""
	if e := info.Meta.Encryption; e != nil {
		keyID = e.KeyID
	}
	b.log.Info("backup taken", "name", info.Name, "reason", reason, "size", info.Meta.Size, "encryption-key-id", keyID,
		"compressed-size", info.Meta.CompressedSize, "revision", info.Meta.Revision, "duration", took.Round(time.Millisecond),
		"stream", info.Stages.Stream.Round(time.Millisecond), "verify", info.Stages.Verify.Round(time.Millisecond), "commit", info.Stages.Commit.Round(time.Millisecond),
		"hashkv-beside-check", info.HashKVBeside)
	setStatus(spec.CommandStatus{State: spec.CommandDone, Backup: info.Name})
	b.prune(ctx, s)
	return info, nil
}

// failed counts a failed backup and records it in the store, where every
// agent reads the time of the last failure from.
func (b *backups) failed(ctx context.Context, s *store.Store, kind string, err error) {
	b.lastFailure = b.now()
	b.failures++
	b.met.backupFailures.Inc()
	b.met.backupLastFailure.Set(float64(b.lastFailure.Unix()))
	if !spec.ValidBackupKind(kind) {
		kind = ""
	}
	f := spec.BackupFailure{Time: b.lastFailure.UTC(), Node: b.node, Kind: kind, Message: err.Error()}
	if f.Node == "" {
		f.Node = "unknown"
	}
	if rerr := s.RecordBackupFailure(ctx, f); rerr != nil {
		b.log.Warn("cannot record the failed backup in the store", "error", rerr)
	}
}

// prune applies the retention policy. It never deletes the newest backup
// nor one that a queued restore names; if the queue cannot be read, it
// deletes nothing. Failures are logged: an old backup kept too long does
// no harm.
func (b *backups) prune(ctx context.Context, s *store.Store) {
	policy, err := backup.ParseRetention(b.retention)
	if err != nil {
		b.log.Error("invalid retention policy; keeping every backup", "error", err)
		return
	}
	cmds, err := s.ListCommands(ctx)
	if err != nil {
		b.log.Warn("cannot read the command queue; keeping every backup this time", "error", err)
		return
	}
	protected := map[string]bool{}
	for _, c := range cmds {
		if r := c.Command.RestoreBackup; r != nil && !c.Status.Finished() {
			protected[r.Backup] = true
		}
	}
	infos, err := backup.List(ctx, s)
	if err != nil {
		b.log.Warn("cannot list backups to apply retention", "error", err)
		return
	}
	for _, name := range policy.Expired(infos, b.now(), protected) {
		if err := backup.Remove(ctx, s, name); err != nil {
			b.log.Warn("cannot delete an expired backup", "name", name, "error", err)
			continue
		}
		b.log.Info("expired backup deleted", "name", name, "policy", policy.String())
	}
	// Captured segments are kept from each timeline's oldest kept backup
	// on: what lies before it cannot be reached any more. The listing
	// must be whole: a backup left out would move a floor up.
	kept, err := backup.ListAll(ctx, s)
	if err != nil {
		b.log.Warn("cannot list every backup; keeping every captured segment this time", "error", err)
		return
	}
	floors := map[string]int64{}
	var oldest time.Time
	for _, in := range kept {
		if at := time.Unix(int64(in.Meta.Timestamp), 0); oldest.IsZero() || at.Before(oldest) {
			oldest = at
		}
		t := in.Meta.ClusterToken
		if t == "" {
			continue
		}
		if f, ok := floors[t]; !ok || changelog.SnapshotRevision(in.Meta.Revision) < f {
			floors[t] = changelog.SnapshotRevision(in.Meta.Revision)
		}
	}
	pruned, err := changelog.Prune(ctx, s, floors, oldest)
	if err != nil {
		b.log.Warn("cannot delete captured segments that no kept backup reaches", "error", err)
	}
	if pruned.Segments > 0 {
		b.log.Info("captured segments no kept backup reaches deleted", "segments", pruned.Segments, "timelines", pruned.Timelines)
	}
}

// readCommands reads the queue for the planner.
func readCommands(ctx context.Context, s *store.Store, now time.Time) ([]plan.Command, error) {
	qs, err := s.ListCommands(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]plan.Command, 0, len(qs))
	for _, q := range qs {
		at := int64(q.Status.Updated)
		if at == 0 {
			at = int64(q.Command.Timestamp)
		}
		out = append(out, plan.Command{ID: q.ID, Command: q.Command, Err: q.Err, Newer: q.Newer, Status: q.Status, StatusTerm: q.StatusTerm,
			Age: now.Sub(time.Unix(0, at))})
	}
	return out, nil
}

// runCommandAction performs the queue's bookkeeping actions.
func runCommandAction(ctx context.Context, s *store.Store, now time.Time, log *slog.Logger, act plan.Action) error {
	switch act := act.(type) {
	case plan.FailCommand:
		log.Error("queued command failed", "command", act.ID, "reason", act.Reason)
		// Under the term of the status it replaces: a failure below it
		// would go unseen, and be planned again every cycle.
		return s.SetCommandStatusAt(ctx, act.ID, act.Term, spec.CommandStatus{State: spec.CommandFailed, Message: act.Reason}, now)
	case plan.ForgetCommand:
		err := s.DeleteCommand(ctx, act.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	}
	return fmt.Errorf("controller: not a command action: %T", act)
}

// newestRead is how long the newest backups read for a recover-quorum
// are reused: listing them reads every backup's meta.
const newestRead = time.Minute

// newestBackups returns the newest backup of each cluster token.
func (lp *loop) newestBackups(ctx context.Context, s *store.Store) (map[string]plan.BackupPoint, error) {
	if lp.newest != nil && lp.now().Sub(lp.newestAt) < newestRead {
		return lp.newest, nil
	}
	infos, err := backup.List(ctx, s)
	if err != nil {
		return nil, err
	}
	out := map[string]plan.BackupPoint{}
	for _, in := range infos { // oldest first
		if t := in.Meta.ClusterToken; t != "" {
			out[t] = plan.BackupPoint{Name: in.Name, Revision: in.Meta.Revision}
		}
	}
	lp.newest, lp.newestAt = out, lp.now()
	return out, nil
}

// takeBackup takes a full backup through the local etcd, the leader.
func (lp *loop) takeBackup(ctx context.Context, obs plan.Observed, act plan.TakeBackup) error {
	s, err := lp.openStore(ctx)
	if err != nil {
		return err
	}
	_, err = lp.backups.take(ctx, s, backup.Request{
		Client:       clientv3.Config{DialTimeout: 5 * time.Second, TLS: lp.etcdTLS},
		Endpoint:     lp.clientEndpoint,
		TempDir:      filepath.Join(lp.cfg.DataDir, "tmp"),
		EtcdVersion:  obs.Self.Version,
		ClusterSpec:  obs.Spec,
		ClusterToken: obs.Cluster.Token,
		Kind:         act.Kind,
	}, act.Reason, act.CommandIDs...)
	if err == nil {
		lp.capture.BackedUp()
	}
	if err == nil && act.ForVersion != "" {
		lp.versionBackup = act.ForVersion
	}
	return err
}

// queueDumpRestore queues the command that runs a dump-restore.
func (lp *loop) queueDumpRestore(ctx context.Context, act plan.QueueDumpRestore) error {
	s, err := lp.openStore(ctx)
	if err != nil {
		return err
	}
	id, err := s.AddCommand(ctx, spec.Command{
		Timestamp:   spec.Int64(lp.now().UnixNano()),
		DumpRestore: &spec.DumpRestoreCommand{EtcdVersion: act.Version},
	}, lp.now())
	if err != nil {
		return err
	}
	lp.log.Warn("changing the etcd version by dump and restore: clients are cut off until the new cluster serves",
		"command", id, "version", act.Version)
	return nil
}
