package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Restore drills: every --restore-drill-interval the leader restores the
// newest backup into a scratch etcd on loopback in its tmp/ folder, and
// checks the restored revision and HashKV against the backup's meta. The
// cluster is not touched. The outcome goes to the store (so that every
// agent reports it), the metrics and the event history.

// Bounds of a drill: as a whole, and for etcd's start on the restored
// data (which reads the whole database), each a base plus a share per GiB
// of the backup.
const (
	drillTimeoutBase   = 10 * time.Minute
	drillTimeoutPerGiB = 2 * time.Minute
	drillStartBase     = time.Minute
	drillStartPerGiB   = time.Minute
	drillStopTimeout   = 10 * time.Second
	drillRecordTimeout = 10 * time.Second
	// drillRetry is the wait after a drill that could not run, when it
	// is shorter than the interval.
	drillRetry = 30 * time.Minute
)

// Errors that mean the backup did not restore as its meta says, as
// opposed to a drill that could not run.
var (
	errDrillMismatch = errors.New("controller: the restored data differs from the backup's meta")
	errDrillRestore  = errors.New("controller: the backup does not restore")
)

// drillFailed reports whether err says the backup is bad (or cannot be
// read with the keys held), rather than that the drill could not run.
func drillFailed(err error) bool {
	for _, e := range []error{backup.ErrCorrupt, backup.ErrNoKey, backup.ErrTooLarge, errDrillMismatch, errDrillRestore} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// drillDue reports whether a drill is due: interval after the last one
// recorded (drillRetry, when shorter, after one that could not run), or,
// before any, interval after this agent began to lead; and as long after
// this agent last started one, whatever the record it read says. A
// recorded time in the future (another agent's clock, or junk) counts
// from the lead instead.
func drillDue(now time.Time, interval time.Duration, rec *spec.DrillRecord, leadSince, lastStarted time.Time) bool {
	if interval <= 0 || leadSince.IsZero() {
		return false
	}
	base, wait := leadSince, interval
	if rec != nil && !rec.Last.Time.After(now) {
		base = rec.Last.Time
		if rec.Last.Outcome == spec.DrillNotRun {
			wait = min(interval, drillRetry)
		}
	}
	if lastStarted.After(base) {
		base = lastStarted
	}
	return now.Sub(base) >= wait
}

// drillBusy says why no drill may run now ("" when one may): a drill
// shares the leader's disk with what these need.
func drillBusy(obs plan.Observed, actions []plan.Action, activity bool) string {
	if plan.ActiveExclusive(obs.Commands) != nil {
		return "a restore or recovery is queued"
	}
	if proc, _ := plan.Activity(actions); proc != "" || activity {
		return "the members are being rolled or defragmented"
	}
	for _, act := range actions {
		if _, ok := act.(plan.TakeBackup); ok {
			return "a backup is due"
		}
	}
	return ""
}

// driller runs one drill at a time, in the background.
type driller struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	// leadSince is when this agent began to lead, lostSince when it last
	// saw no cluster to lead, started when it last started a drill.
	leadSince, lostSince, started time.Time
}

// running reports whether a drill runs now.
func (d *driller) running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done == nil {
		return false
	}
	select {
	case <-d.done:
		d.done, d.cancel = nil, nil
		return false
	default:
		return true
	}
}

// start runs drill in a goroutine of its own.
func (d *driller) start(ctx context.Context, drill func(context.Context)) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	d.mu.Lock()
	d.cancel, d.done = cancel, done
	d.mu.Unlock()
	go func() {
		defer close(done)
		defer cancel()
		drill(ctx)
	}()
}

// interrupt cancels a drill in progress without waiting for it.
func (d *driller) interrupt() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel != nil {
		d.cancel()
	}
}

// stop cancels a drill in progress and waits for it to clean up.
func (d *driller) stop() {
	d.mu.Lock()
	cancel, done := d.cancel, d.done
	d.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// tendDrill starts a restore drill of the newest backup when one is due
// and this agent leads a cluster that nothing else needs the disk for,
// and interrupts one in progress when that changes: when this agent has
// seen no cluster to lead for a lease, or when a backup, a restore, a
// roll or a defragmentation comes. An interrupted drill is not recorded.
func (lp *loop) tendDrill(ctx context.Context, obs plan.Observed, actions []plan.Action) {
	d := &lp.drills
	now := lp.now()
	if obs.Cluster == nil {
		// One failed read is no loss of the lead.
		if d.lostSince.IsZero() {
			d.lostSince = now
		}
		if now.Sub(d.lostSince) >= lp.cfg.LeaderLease {
			d.leadSince = time.Time{}
			if d.running() {
				lp.log.Info("no longer leading; stopping the restore drill")
				d.interrupt()
			}
		}
		return
	}
	d.lostSince = time.Time{}
	if d.leadSince.IsZero() {
		d.leadSince = now
	}
	if why := drillBusy(obs, actions, !lp.activitySince.IsZero()); why != "" {
		if d.running() {
			lp.log.Info("stopping the restore drill; it will run again later", "reason", why)
			d.interrupt()
			d.started = time.Time{}
		}
		return
	}
	if lp.cfg.RestoreDrillInterval <= 0 || d.running() || lp.newestStored == nil || obs.StoreErr != nil {
		return
	}
	if err := lp.drillRecordErr; err != nil && !errors.Is(err, spec.ErrBadRecord) {
		return // the store did not answer; the next read will tell
	}
	if !drillDue(now, lp.cfg.RestoreDrillInterval, lp.drillRecord, d.leadSince, d.started) {
		return
	}
	name := lp.newestStored.Name
	d.started = now
	lp.log.Info("restore drill started", "backup", name)
	d.start(ctx, func(ctx context.Context) {
		defer func() {
			// As in the loop: a bug met on bad data must not take the
			// agent, and its etcd, down.
			if r := recover(); r != nil {
				lp.met.panics.Inc()
				lp.log.Error("a restore drill panicked; recovered", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			}
		}()
		lp.drill(ctx, name, obs.Self.Version)
	})
}

// drill runs one drill of backup name and records its outcome.
func (lp *loop) drill(ctx context.Context, name, runningVersion string) {
	start := lp.now()
	res := spec.DrillResult{Time: start.UTC(), Node: lp.nodeID, Backup: name, Outcome: spec.EventOK}
	// A store of its own: the loop's is not shared across goroutines.
	s, err := store.Open(ctx, lp.cfg.BackupStore, store.Options{})
	opened := err == nil
	var got drillResult
	if opened {
		defer s.Close()
		got, err = lp.restoreDrill(ctx, s, name, runningVersion)
	}
	if ctx.Err() != nil {
		lp.log.Info("restore drill stopped", "backup", name)
		return // stopped, not failed: nothing to record
	}
	res.Seconds = lp.now().Sub(start).Seconds()
	res.Revision, res.HashKV = got.revision, got.hashKV
	res.Message = got.note
	result, outcome := "ok", spec.EventOK
	switch {
	case err != nil && drillFailed(err):
		res.Outcome, res.Message, result, outcome = spec.EventFailed, err.Error(), "failed", spec.EventFailed
		lp.log.Error("restore drill failed: the newest backup did not restore as its meta says", "backup", name, "error", err)
	case err != nil:
		res.Outcome, res.Message, result, outcome = spec.DrillNotRun, err.Error(), "not_run", spec.EventFailed
		lp.log.Warn("restore drill could not run; it says nothing of the backup, and is tried again later", "backup", name, "error", err)
	default:
		lp.log.Info("restore drill passed", "backup", name, "revision", got.revision, "hashkv-checked", got.hashKV != nil,
			"duration", time.Duration(res.Seconds*float64(time.Second)).Round(time.Millisecond))
	}
	lp.met.drills.WithLabelValues(result).Inc()
	msg := res.Message
	if res.Outcome == spec.DrillNotRun {
		msg = "could not run: " + msg
	}
	lp.events.add(spec.Event{Time: lp.now(), Action: "restore-drill " + name, Outcome: outcome, Message: spec.Clip(msg, spec.MaxEventMessage)})
	if !opened {
		return // no store to record the outcome in; the log and the event say it
	}
	rctx, rcancel := context.WithTimeout(context.Background(), drillRecordTimeout)
	defer rcancel()
	if err := s.RecordDrill(rctx, res); err != nil {
		lp.log.Warn("cannot record the restore drill's outcome in the store", "backup", name, "error", err)
	}
}

// drillFits checks that a drill of a backup fits in dir: the snapshot
// and the data restored from it are on that disk at once, and both must
// leave free the reserve any fetch leaves, so that a drill never fills
// the disk the live etcd runs on. (Fetch checks the maximum size.) It
// returns the room there is.
func drillFits(opts backup.FetchOptions, dir, name string, meta backup.Meta) (int64, error) {
	if meta.Size <= 0 {
		return 0, fmt.Errorf("controller: backup %s records no size (an older etcd-manager or kops wrote it): a drill could not bound what it unpacks", name)
	}
	opts.MaxBytes = 0
	room, err := opts.Room(dir)
	if err != nil {
		return 0, fmt.Errorf("controller: free space for a restore drill: %w", err)
	}
	if need := 2 * meta.Size; need > room {
		return room, fmt.Errorf("controller: a restore drill of %s needs %d bytes in %s (the snapshot and its restored copy), and %d may be used: %w",
			name, need, dir, room, backup.ErrTempFull)
	}
	return room, nil
}

// drillResult is what a drill found.
type drillResult struct {
	revision int64
	hashKV   *uint32
	note     string
}

// restoreDrill fetches backup name into a folder of tmp/, restores it
// with the etcd version that took it (or, lacking that, the running one),
// starts a scratch etcd on it and compares it with the meta.
func (lp *loop) restoreDrill(ctx context.Context, s *store.Store, name, runningVersion string) (drillResult, error) {
	var out drillResult
	meta, err := backup.ReadMeta(ctx, s, name)
	if err != nil {
		return out, err
	}
	ctx, cancel := context.WithTimeout(ctx, drillTimeoutBase+time.Duration(meta.Size>>30)*drillTimeoutPerGiB)
	defer cancel()
	tmp := filepath.Join(lp.cfg.DataDir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return out, fmt.Errorf("controller: %w", err)
	}
	dir, err := os.MkdirTemp(tmp, "drill-")
	if err != nil {
		return out, fmt.Errorf("controller: %w", err)
	}
	defer os.RemoveAll(dir)

	opts := lp.cfg.fetchOptions(lp.backups.status, lp.keys)
	room, err := drillFits(opts, dir, name, meta)
	if err != nil {
		return out, err
	}
	// Whatever the meta read again says, the snapshot takes at most half
	// the room, and its restored copy the other half.
	if opts.MaxBytes <= 0 || opts.MaxBytes > room/2 {
		opts.MaxBytes = room / 2
	}
	snap, meta, err := backup.Fetch(ctx, s, name, filepath.Join(dir, "fetch"), opts)
	if err != nil {
		return out, err
	}

	bins, err := lp.drillBinaries(meta.EtcdVersion, runningVersion)
	if err != nil {
		return out, err
	}
	ports, err := etcdproc.FreeLoopbackPorts(2)
	if err != nil {
		return out, err
	}
	tlsFiles := lp.etcdTLSFiles()
	peerURL := etcdproc.LoopbackURL(ports[0], tlsFiles == nil)
	clientURL := etcdproc.LoopbackURL(ports[1], tlsFiles == nil)
	token := make([]byte, 8)
	_, _ = rand.Read(token)
	es := etcdproc.Spec{
		Binaries:       bins,
		Name:           "restore-drill",
		DataDir:        filepath.Join(dir, "data"),
		ClientURLs:     []string{clientURL},
		PeerURLs:       []string{peerURL},
		InitialCluster: "restore-drill=" + peerURL,
		ClusterToken:   "restore-drill-" + hex.EncodeToString(token),
		TLS:            tlsFiles,
	}
	if err := bins.RestoreSnapshot(ctx, etcdproc.RestoreOptions{SnapshotPath: snap, DataDir: es.DataDir, Name: es.Name,
		PeerURLs: es.PeerURLs, InitialCluster: es.InitialCluster, Token: es.ClusterToken}); err != nil {
		return out, fmt.Errorf("%w: %s: %w", errDrillRestore, name, err)
	}
	_ = os.Remove(snap) // the restored copy is what etcd reads

	logPath := filepath.Join(dir, "etcd.log")
	proc, err := etcdproc.StartScratch(es, logPath)
	if err != nil {
		return out, err
	}
	defer proc.Stop(drillStopTimeout)
	c, err := etcdproc.NewClient([]string{clientURL}, lp.etcdTLS)
	if err != nil {
		return out, err
	}
	defer c.Close()
	startBy := drillStartBase + time.Duration(meta.Size>>30)*drillStartPerGiB
	sctx, cancel := context.WithTimeout(ctx, startBy)
	var st *clientv3.StatusResponse
	err = proc.WaitReady(sctx, func(ctx context.Context) error {
		st, err = c.Status(ctx, clientURL)
		return err
	})
	cancel()
	if errors.Is(err, etcdproc.ErrScratchExited) {
		return out, fmt.Errorf("%w: etcd did not start on the restored data of %s: %w: %s", errDrillRestore, name, err, etcdproc.LogTail(logPath))
	}
	if err != nil {
		return out, fmt.Errorf("controller: restore drill of %s: %w: %s", name, err, etcdproc.LogTail(logPath))
	}
	return checkDrill(ctx, c, clientURL, meta, st.Header.Revision)
}

// drillChecker is the part of an etcd client a drill's check needs.
type drillChecker interface {
	etcdproc.HashKVer
	Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error)
}

// checkDrill compares the restored etcd with the backup's meta: its
// revision reaches the meta's, and its HashKV at that revision is the one
// the member had when the backup was taken. A compaction of the member
// between the snapshot and its HashKV is replayed on the scratch etcd
// first, as the hash covers the history after the compacted revision.
func checkDrill(ctx context.Context, c drillChecker, endpoint string, meta backup.Meta, revision int64) (drillResult, error) {
	out := drillResult{revision: revision}
	if revision < meta.Revision {
		return out, fmt.Errorf("%w: the restored etcd is at revision %d, behind the meta's %d", errDrillMismatch, revision, meta.Revision)
	}
	want := meta.HashKV
	if want == nil || meta.Revision == 0 {
		out.note = "revision checked; the backup records no HashKV"
		return out, nil
	}
	h, err := etcdproc.HashKV(ctx, c, endpoint, meta.Revision)
	if err != nil {
		return out, fmt.Errorf("controller: HashKV of the restored etcd at revision %d: %w", meta.Revision, err)
	}
	if h.CompactRevision < want.CompactRevision {
		if _, err := c.Compact(ctx, want.CompactRevision, clientv3.WithCompactPhysical()); err != nil {
			return out, fmt.Errorf("controller: compact the restored etcd to revision %d: %w", want.CompactRevision, err)
		}
		if h, err = etcdproc.HashKV(ctx, c, endpoint, meta.Revision); err != nil {
			return out, fmt.Errorf("controller: HashKV of the restored etcd at revision %d: %w", meta.Revision, err)
		}
	}
	out.hashKV = &h.Hash
	switch {
	case h.CompactRevision != want.CompactRevision:
		return out, fmt.Errorf("%w: the restored etcd is compacted to revision %d, the member was at %d when the backup was taken",
			errDrillMismatch, h.CompactRevision, want.CompactRevision)
	case h.Hash != want.Hash:
		return out, fmt.Errorf("%w: the restored data's HashKV at revision %d is %d; the member's was %d when the backup was taken",
			errDrillMismatch, meta.Revision, h.Hash, want.Hash)
	}
	return out, nil
}

// drillBinaries are the binaries of the version that took the backup,
// or of the running one when that is not installed.
func (lp *loop) drillBinaries(backupVersion, runningVersion string) (etcdproc.Binaries, error) {
	var errs []error
	for _, v := range []string{backupVersion, runningVersion} {
		ver, err := spec.ParseVersion(v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		bins, err := etcdproc.FindBinaries(lp.cfg.EtcdBinDir, ver)
		if err == nil {
			return bins, nil
		}
		errs = append(errs, err)
	}
	return etcdproc.Binaries{}, fmt.Errorf("controller: no etcd to run a restore drill with: %w", errors.Join(errs...))
}
