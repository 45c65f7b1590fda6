package backupjob

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Taker takes full backups one at a time, backs off after a failure,
// records its outcome (the hooks, the backup-now command's status, the
// store's failure record) and applies retention after each. The managing
// agent and the backup-only agent share it; it belongs to their loop's
// goroutine.
type Taker struct {
	// Node is the agent's ID, in the failures it records in the store.
	Node string
	Log  *slog.Logger
	Now  func() time.Time
	// Retention is the retention policy (see backup.ParseRetention).
	Retention string
	// RetryDelay is the wait after the first failure; it doubles with
	// each further one, up to MaxRetry.
	RetryDelay, MaxRetry time.Duration

	// Status reads the status of a backup's local copy or of a fetched
	// snapshot, whose trailers were checked as they streamed.
	Status backup.VerifyFunc
	// Revision reads the revision of a backup's local copy.
	Revision backup.RevisionFunc
	// Keys encrypt the backups taken, when they hold a writing key.
	Keys *crypt.Keyring
	// Taken is told of each backup taken, when it finished; FailedAt of
	// each failure (the agent's metrics). Either may be nil.
	Taken    func(info backup.Info, at time.Time)
	FailedAt func(at time.Time)

	lastOK, lastFailure time.Time
	failures            int // consecutive
}

// RetryAt is when a backup may be tried again after failures.
func (b *Taker) RetryAt() time.Time {
	if b.failures == 0 {
		return time.Time{}
	}
	d := b.RetryDelay
	for i := 1; i < b.failures && d < b.MaxRetry; i++ {
		d *= 2
	}
	return b.lastFailure.Add(min(d, b.MaxRetry))
}

// FailedRecently reports whether the last attempt failed and its backoff
// has not run out.
func (b *Taker) FailedRecently() bool {
	return b.failures > 0 && b.Now().Before(b.RetryAt())
}

// Stored records that the store holds a full backup of this agent's
// cluster begun at, taken by this agent or another: the periodic
// backup's interval runs from the newest.
func (b *Taker) Stored(at time.Time) {
	if at.After(b.lastOK) && !at.After(b.Now()) {
		b.lastOK = at
	}
}

// ProgressEvery is how often a backup-now's status tells how far the
// snapshot's stream has gone.
var ProgressEvery = 2 * time.Second

// Take takes one backup of about size bytes (0: not known). With a
// commandID, it runs that backup-now command: the command's status says
// running, with how far the stream has gone every ProgressEvery, then
// done with the backup's name; a failed attempt stays running with the
// error, and is retried after the backoff.
func (b *Taker) Take(ctx context.Context, s *store.Store, req backup.Request, size int64, reason string, commandIDs ...string) (backup.Info, error) {
	setStatus := func(st spec.CommandStatus) {
		for _, id := range commandIDs {
			if err := s.SetCommandStatus(ctx, id, st, b.Now()); err != nil {
				b.Log.Warn("cannot record a command's status", "command", id, "error", err)
			}
		}
	}
	setStatus(spec.CommandStatus{State: spec.CommandRunning, Message: "taking a backup"})
	start := b.Now()
	req.Now = start
	if req.Status == nil {
		req.Status = b.Status
	}
	if req.Revision == nil {
		req.Revision = b.Revision
	}
	if req.Keys == nil {
		req.Keys = b.Keys
	}
	stopProgress := func() {}
	if len(commandIDs) > 0 {
		var streamed atomic.Int64
		req.Progress = func(n int64) { streamed.Add(n) }
		stopProgress = reportProgress(func(done int64) {
			setStatus(spec.CommandStatus{State: spec.CommandRunning, Message: "taking a backup: streaming the snapshot",
				Transfer: &spec.Transfer{Done: done, Total: max(size, done), Started: spec.Int64(start.UnixNano())}})
		}, &streamed)
	}
	info, err := backup.Take(ctx, s, req)
	// No progress is written once the outcome is.
	stopProgress()
	if err != nil {
		err = fmt.Errorf("backupjob: backup (%s): %w", reason, err)
		b.Failed(ctx, s, req.Kind, err)
		setStatus(spec.CommandStatus{State: spec.CommandRunning,
			Message: fmt.Sprintf("attempt %d failed, retrying at %s: %v", b.failures, b.RetryAt().UTC().Format(time.RFC3339), err)})
		return info, err
	}
	b.lastOK, b.failures = b.Now(), 0
	took := b.lastOK.Sub(start)
	if b.Taken != nil {
		b.Taken(info, b.lastOK)
	}
	if info.HashKVErr != nil {
		b.Log.Warn("backup records no HashKV; a restore drill of it checks the revision alone", "name", info.Name, "error", info.HashKVErr)
	}
	if info.HashKVLate != nil {
		b.Log.Warn("backup's HashKV was read after its status check, not beside it", "name", info.Name, "error", info.HashKVLate)
	}
	keyID := ""
	if e := info.Meta.Encryption; e != nil {
		keyID = e.KeyID
	}
	b.Log.Info("backup taken", "name", info.Name, "reason", reason, "size", info.Meta.Size, "encryption-key-id", keyID,
		"compressed-size", info.Meta.CompressedSize, "revision", info.Meta.Revision, "duration", took.Round(time.Millisecond),
		"stream", info.Stages.Stream.Round(time.Millisecond), "verify", info.Stages.Verify.Round(time.Millisecond), "commit", info.Stages.Commit.Round(time.Millisecond),
		"hashkv-beside-check", info.HashKVBeside)
	setStatus(spec.CommandStatus{State: spec.CommandDone, Backup: info.Name})
	b.Prune(ctx, s)
	return info, nil
}

// Failed counts a failed backup and records it in the store, where every
// agent reads the time of the last failure from.
func (b *Taker) Failed(ctx context.Context, s *store.Store, kind string, err error) {
	b.lastFailure = b.Now()
	b.failures++
	if b.FailedAt != nil {
		b.FailedAt(b.lastFailure)
	}
	if !spec.ValidBackupKind(kind) {
		kind = ""
	}
	f := spec.BackupFailure{Time: b.lastFailure.UTC(), Node: b.Node, Kind: kind, Message: err.Error()}
	if f.Node == "" {
		f.Node = "unknown"
	}
	if rerr := s.RecordBackupFailure(ctx, f); rerr != nil {
		b.Log.Warn("cannot record the failed backup in the store", "error", rerr)
	}
}

// Prune applies the retention policy. It never deletes the newest backup
// nor one that a queued restore names; if the queue cannot be read, it
// deletes nothing. Failures are logged: an old backup kept too long does
// no harm.
func (b *Taker) Prune(ctx context.Context, s *store.Store) {
	policy, err := backup.ParseRetention(b.Retention)
	if err != nil {
		b.Log.Error("invalid retention policy; keeping every backup", "error", err)
		return
	}
	cmds, err := s.ListCommands(ctx)
	if err != nil {
		b.Log.Warn("cannot read the command queue; keeping every backup this time", "error", err)
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
		b.Log.Warn("cannot list backups to apply retention", "error", err)
		return
	}
	for _, name := range policy.Expired(infos, b.Now(), protected) {
		if err := backup.Remove(ctx, s, name); err != nil {
			b.Log.Warn("cannot delete an expired backup", "name", name, "error", err)
			continue
		}
		b.Log.Info("expired backup deleted", "name", name, "policy", policy.String())
	}
	// Captured segments are kept from each timeline's oldest kept backup
	// on: what lies before it cannot be reached any more. The listing
	// must be whole: a backup left out would move a floor up.
	kept, err := backup.ListAll(ctx, s)
	if err != nil {
		b.Log.Warn("cannot list every backup; keeping every captured segment this time", "error", err)
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
		b.Log.Warn("cannot delete captured segments that no kept backup reaches", "error", err)
	}
	if pruned.Segments > 0 {
		b.Log.Info("captured segments no kept backup reaches deleted", "segments", pruned.Segments, "timelines", pruned.Timelines)
	}
}

// LastOK is when the newest full backup of the cluster began, as this
// taker knows: its own, or one the store holds (see Stored).
func (b *Taker) LastOK() time.Time { return b.lastOK }

// Due reports whether a full backup is due: the periodic one, or one
// capture needs to start a run from (see plan.BackupDue).
func (b *Taker) Due(interval time.Duration, needsBase bool) bool {
	return plan.BackupDue(b.Now(), b.lastOK, interval, b.FailedRecently(), needsBase)
}

// reportProgress calls report with the bytes done every ProgressEvery
// until the func it returns is called, which waits for the last report.
func reportProgress(report func(done int64), done *atomic.Int64) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(ProgressEvery)
		defer tick.Stop()
		last := int64(-1)
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				if n := done.Load(); n != last {
					last = n
					report(n)
				}
			}
		}
	})
	return func() {
		close(quit)
		wg.Wait()
	}
}
