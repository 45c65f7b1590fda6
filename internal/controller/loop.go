package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/capture"
	"github.com/etcd-manager/etcd-manager/internal/drill"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/history"
	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/maintenance"
	"github.com/etcd-manager/etcd-manager/internal/membership"
	"github.com/etcd-manager/etcd-manager/internal/node"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/procedure"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/status"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/storeops"
)

// loop is the control loop. Everything in it belongs to the loop's
// goroutine, but for the lease, which the procedure runner renews while
// a step runs.
type loop struct {
	cfg  Config
	env  Env
	log  *slog.Logger
	now  func() time.Time
	met  *metrics
	node *node.Node

	store          *store.Store
	discovery      peer.Discovery
	client         *clientv3.Client
	clientEndpoint string
	peers          map[string]*peer.Client
	// memberConns holds a client of each etcd member's client URL, kept
	// across cycles (see memberClient).
	memberConns map[string]*clientv3.Client
	lease       *lease.Fence
	// unhealthySince and learnerSince track, per etcd member, since when
	// it has been unhealthy, or a learner.
	unhealthySince, learnerSince plan.Since
	// lastRecord is what the agent last published about its etcd, and
	// lastQueueRead when it last read the command queue.
	lastRecord    *peer.EtcdReport
	lastQueueRead time.Time
	// revoked is the store's revocation list as last read, and
	// revokedErr the last reason it could not be used, said once.
	revoked    pki.Revocations
	revokedErr string
	// failures are the leader's actions that failed, backing off.
	failures *failures
	// storeChecked is set once the store's create-if-absent was checked,
	// and untrusted then when it failed.
	storeChecked bool
	untrusted    error
	// offsets are the clock offsets measured to each peer in the last
	// cycle, by node ID; storeOffset the one to the store's clock.
	offsets     map[string]time.Duration
	storeOffset time.Duration
	// noLeaderSince is when this node's etcd was first seen without a
	// raft leader, zero while it has one.
	noLeaderSince time.Time
	// termFloor is the highest fencing term seen: obeyed by a node, or of
	// a command's status. The store lock's next term goes above it.
	termFloor int64
	// announced is this node's state as last announced to its peers
	// (see announce).
	announced string
	// lastWait is the last action that had to wait, and why.
	lastWait string
	// soon is set by a cycle that waits on something due within moments
	// (etcd settling after a change, a learner catching up): the next
	// cycle runs after SoonInterval rather than a whole loop interval.
	soon bool
	// acted is set by a cycle that performed an action, and spell follows
	// the busy spells they make up (see Env.ReleasePages).
	acted bool
	spell spell
	// http reads etcd's /version, reused across cycles.
	http *http.Client
	// peerHTTP reads the local etcd's peer port (see observeNotServing).
	peerHTTP *http.Client
	// lastHousekeeping is when the local trash and tmp, and the store's
	// old records, were last tidied.
	lastHousekeeping time.Time
	lastPublish      time.Time
	// lastStoreFigures is when the backup figures were last read from
	// the store.
	lastStoreFigures time.Time
	// newestStored and restorable are the store's newest backup and
	// restorable point, as last read (the status page); drillable is the
	// newest backup of this cluster's timeline, what a drill restores.
	newestStored *backup.Info
	drillable    *backup.Info
	// lastTaken is the newest backup this agent took, set as it is
	// recorded (from whichever goroutine took it).
	lastTaken atomic.Pointer[backup.Info]
	// historyMet shows the newest restorable point.
	historyMet *history.Metrics
	restorable time.Time
	// figures reads and shows the store's backup figures; drillRecord is
	// the restore drills' record as last read.
	figures *status.Figures
	drills  *drill.Driller
	// drillClock follows the lead for the drills' schedule.
	drillClock drillClock
	// activitySince is when a roll or defragmentation last stepped.
	activitySince  time.Time
	drillRecord    *spec.DrillRecord
	drillRecordErr error
	// backups are those this agent took while leading; lastChange is its
	// last membership change.
	backups    *backupjob.Taker
	lastChange time.Time
	// versionBackup is the version a backup was last taken for, before a
	// version change moved members to it.
	versionBackup string
	// spaceCompacted is set once this agent compacted etcd to its head
	// for the NOSPACE alarm it sees; cleared when no alarm is raised.
	spaceCompacted bool
	// defragger defragments members, and remembers the nodes whose
	// isolated defragmentation failed.
	defragger *maintenance.Defragger
	// hash schedules the leader's HashKV comparisons, which hasher
	// carries out.
	hash   hashCheck
	hasher *maintenance.HashChecker
	// maint records the leader's maintenance work, for status; alarms
	// are those it last saw.
	maint peer.Maintenance
	// newest caches the newest backup of each cluster token for a
	// recover-quorum, read at newestAt.
	newest   map[string]plan.BackupPoint
	newestAt time.Time
	// infos logs an info-level report in the first of a run of cycles
	// that report it; warnings and errors are logged every cycle.
	infos plan.ReportsOnce
	// warnings are the status lines of the last plan's reports, shown by
	// etcd-manager-ctl status while this agent leads.
	warnings []string

	procedures *procedure.Executor
	members    *membership.Executor
	capture    *capture.Capturer
	// clockRefused is why capture was last refused for the clocks, said
	// once; "" while it is not.
	clockRefused string
	compaction   *maintenance.Compactor
}

// run runs cycles until ctx is cancelled.
func (lp *loop) run(ctx context.Context) {
	ticker := time.NewTicker(lp.cfg.LoopInterval)
	defer ticker.Stop()
	quick, soon := 0, 0
	for {
		// After a change, look again at once to take the next step, but
		// only a few times in a row, so that a change that does not
		// converge cannot spin.
		lp.soon, lp.acted = false, false
		changed := lp.cycle(ctx)
		if lp.spell.cycle(lp.acted || lp.soon || changed) {
			lp.releasePages()
		}
		if changed && quick < maxQuickCycles {
			quick++
			continue
		}
		quick = 0
		// While a step waits on something due within moments, look again
		// after SoonInterval, for at most maxSoonCycles in a row.
		var after <-chan time.Time
		if lp.soon && soon < maxSoonCycles && SoonInterval < lp.cfg.LoopInterval {
			soon++
			after = time.After(SoonInterval)
		} else if !lp.soon {
			soon = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-lp.env.Wake:
		case <-after:
		}
	}
}

// releasePages gives back the binary's pages a busy spell touched (see
// pageout.go). It is best effort: a kernel without MADV_PAGEOUT only costs
// a debug line.
func (lp *loop) releasePages() {
	if lp.env.ReleasePages == nil {
		return
	}
	n, err := lp.env.ReleasePages()
	if err != nil {
		lp.log.Debug("cannot release the binary's pages", "error", err)
		return
	}
	lp.log.Debug("advised the kernel to page out the binary's read-only pages after a busy spell", "advised-bytes", n)
}

// Bounds of the cycles that look again soon: how soon, and how many in a
// row (about 10 s of them) before the loop interval applies again.
const (
	// SoonInterval is exported for the agent, which wakes the loop for a
	// peer's news at most this often.
	SoonInterval  = 250 * time.Millisecond
	maxSoonCycles = 40
)

// httpClient is the loop's client for etcd's HTTP endpoints.
func (lp *loop) httpClient() *http.Client {
	if lp.http == nil {
		lp.http = etcdproc.NewHTTPClient(lp.env.EtcdTLS)
	}
	return lp.http
}

// close releases what the loop holds open.
func (lp *loop) close() {
	lp.drills.Stop()
	lp.capture.Stop()
	for _, c := range lp.peers {
		_ = c.Close()
	}
	for _, c := range lp.memberConns {
		_ = c.Close()
	}
	if lp.client != nil {
		_ = lp.client.Close()
	}
	if lp.store != nil {
		_ = lp.store.Close()
	}
}

// activityLinger is how long a roll or defragmentation stays shown in the
// procedure metric after its last step: its steps are cycles apart, with
// waits for health between them.
const activityLinger = time.Minute

// showActivity shows a roll or a defragmentation that the planned actions
// step, until activityLinger after its last step; a procedure of the
// runner shows itself.
func (lp *loop) showActivity(obs plan.Observed, actions []plan.Action) {
	if plan.ActiveExclusive(obs.Commands) != nil {
		lp.activitySince = time.Time{}
		return
	}
	if proc, phase := plan.Activity(actions); proc != "" {
		lp.procedures.Runner.Show(proc, phase)
		lp.activitySince = lp.now()
		return
	}
	if !lp.activitySince.IsZero() && lp.now().Sub(lp.activitySince) > activityLinger {
		lp.procedures.Runner.Idle()
		lp.activitySince = time.Time{}
	}
}

// maxQuickCycles bounds back-to-back cycles after changes.
const maxQuickCycles = 5

// cycle runs one observe → plan → act round, and reports whether it
// changed something. It never panics on bad data and never returns an
// error: problems are logged and retried next cycle.
func (lp *loop) cycle(ctx context.Context) (changed bool) {
	// The round as its observers see it (see Cycle): published once it
	// is planned, and again when it ends. The last publication is
	// deferred first, so that it runs after the recover below: no
	// observer runs while a panic unwinds.
	var round Cycle
	var observed time.Time
	defer func() {
		if !observed.IsZero() {
			lp.publishCycle(round.Observed, observed, round.Actions, round.Results, true)
		}
	}()
	defer func() {
		// A bug met on bad data must not crash-loop the agent: its etcd
		// keeps running, and the next cycle tries again.
		if r := recover(); r != nil {
			lp.met.panics.Inc()
			lp.log.Error("a control-loop cycle panicked; recovered, and will try again", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			changed = false
		}
	}()
	if _, bad := lp.node.CorruptData(); bad {
		// Reported, never acted on alone: the leader judges by the
		// majority's HashKV which copy is damaged.
		if err := lp.node.StopForFailedCheck(ctx); err != nil {
			lp.log.Error("cannot stop etcd after its failed initial corruption check; will retry", "error", err)
		}
	}
	lp.met.backingOff.Set(float64(lp.failures.prune(lp.now())))
	obs := lp.observe(ctx)
	round.Observed, observed = obs, lp.now()
	lp.met.loopCycles.Inc()
	lp.storeFigures(ctx, lp.store, obs)
	lp.housekeeping(ctx, lp.store, obs)
	lp.syncCapture(obs)
	lp.compact(ctx, obs)
	actions := plan.Plan(obs)
	round.Actions = actions
	lp.soon = lp.soon || plan.LookAgainSoon(obs)
	lp.warnings = plan.StatusLines(actions)
	lp.showActivity(obs, actions)
	lp.tendDrill(ctx, obs, actions)
	lp.infos.Cycle()
	lp.publishCycle(obs, observed, actions, nil, false)
	for _, act := range actions {
		if ctx.Err() != nil {
			return false
		}
		if r, ok := act.(plan.Report); ok {
			if lp.infos.First(r) {
				lp.log.Log(ctx, r.Level, r.Msg, r.Attrs...)
			}
			continue
		}
		lp.log.Info("performing action", "action", act.String())
		lp.acted = true
		err := lp.execute(ctx, obs, act)
		round.Results = append(round.Results, Result{Action: act, Err: err})
		lp.met.actionsPerformed.WithLabelValues(ActionLabels(act, err)).Inc()
		lp.noteOutcome(act, err)
		lp.env.Events.Outcome(act, err)
		switch {
		case waiting(err):
			// Tried again soon, and said once while it keeps waiting.
			if why := act.String() + ": " + err.Error(); why != lp.lastWait {
				lp.log.Info("action must wait; will retry", "action", act.String(), "reason", err)
				lp.lastWait = why
			}
			lp.soon = true
			return false
		case err != nil:
			lp.log.Error("action failed; will retry", "action", act.String(), "error", err,
				"failures", lp.failures.count(plan.ActionKey(act)))
			return false
		}
		lp.lastWait = ""
		if b, ok := act.(plan.TakeBackup); act.Mutates() || (ok && b.Kind == spec.BackupPreChange) {
			// Re-observe before acting again; a backup before a change
			// is followed by the change.
			return true
		}
	}
	return false
}

// execute performs one action: the node's own steps on the node,
// procedure steps on the runner, the rest (membership, versions,
// backups) here.
func (lp *loop) execute(ctx context.Context, obs plan.Observed, act plan.Action) error {
	if ok, err := lp.procedures.Execute(ctx, obs, act); ok {
		return err
	}
	switch act := act.(type) {
	case plan.StartEtcd:
		return lp.node.StartEtcd(ctx)
	case plan.StopRevoked:
		return lp.node.StopRevoked(ctx)
	case plan.ResumeMember:
		return lp.resumeMember(ctx, obs, act)
	case plan.ResumeUnjudged:
		return lp.node.ResumeUnjudged(ctx, act.Reason)
	case plan.MarkBootstrapped:
		return lp.node.MarkBootstrapped()
	case plan.ConfirmCreate:
		return lp.node.ConfirmCreate(ctx, act.Token)
	case plan.AbandonPending:
		return lp.node.AbandonPending(ctx, act.Token, act.Reason)
	case plan.CreateCluster:
		return lp.members.Create(ctx, obs, act)
	case plan.AddMember:
		return lp.changed(lp.members.Add(ctx, obs, act))
	case plan.PromoteMember:
		return lp.members.Promote(ctx, act)
	case plan.RemoveMember:
		return lp.changed(lp.members.Remove(ctx, obs, act))
	case plan.EvictNode:
		return lp.members.Evict(ctx, obs, act)
	case plan.SetQuarantine:
		// A stray quarantine is lifted by etcd's leader, which re-checks
		// that it still leads first.
		if _, err := lp.members.Leader(ctx); err != nil {
			return err
		}
		return lp.procedures.LiftStrayQuarantine(ctx, obs, act)
	case plan.SetMemberVersion:
		return lp.changed(lp.members.SetVersion(ctx, obs, act))
	case plan.SetMemberSettings:
		return lp.changed(lp.members.SetSettings(ctx, obs, act))
	case plan.SetPeerCertCheck:
		return lp.changed(lp.members.SetPeerCertCheck(ctx, obs, act))
	case plan.SyncCA:
		return lp.members.SyncCA(ctx, obs, act)
	case plan.AdvanceCARotation:
		return lp.advanceCARotation(ctx, act)
	case plan.DefragMember:
		return lp.defrag(ctx, obs, act)
	case plan.FinishDefrag:
		return lp.finishDefrag(ctx, obs, act)
	case plan.RecoverSpace:
		return lp.recoverSpace(ctx, act)
	case plan.DisarmNoSpace:
		return lp.disarmNoSpace(ctx, obs, act)
	case plan.CheckHashes:
		return lp.checkHashes(ctx, obs, act)
	case plan.DiscardMemberData:
		return lp.changed(lp.discardMemberData(ctx, obs, act))
	case plan.DisarmCorrupt:
		return lp.disarmCorrupt(ctx, act)
	case plan.SetPeerURLs:
		return lp.changed(lp.members.SetPeerURLs(ctx, obs, act))
	case plan.MoveLeader:
		return lp.members.MoveLeader(ctx, act)
	case plan.EnableDowngrade:
		return lp.members.EnableDowngrade(ctx, act)
	case plan.TakeBackup:
		return lp.takeBackup(ctx, obs, act)
	case plan.QueueDumpRestore:
		return lp.queueDumpRestore(ctx, act)
	case plan.FailCommand, plan.ForgetCommand:
		s, err := lp.openStore(ctx)
		if err != nil {
			return err
		}
		return storeops.RunCommandAction(ctx, s, lp.now(), lp.log, act)
	default:
		return fmt.Errorf("controller: unknown action %T", act)
	}
}

// noteOutcome counts the failures of the leader's own cluster changes, so
// that one that keeps failing backs off and the planner passes it over;
// a success forgets them. Backups (which back off on their own) and
// procedure steps (which a restore needs, in order) are not counted.
func (lp *loop) noteOutcome(act plan.Action, err error) {
	switch act := act.(type) {
	case plan.AddMember, plan.PromoteMember, plan.EvictNode, plan.SetMemberVersion, plan.SetMemberSettings, plan.SetPeerCertCheck,
		plan.SetPeerURLs, plan.MoveLeader, plan.EnableDowngrade, plan.DefragMember, plan.RecoverSpace, plan.DisarmNoSpace,
		plan.CheckHashes, plan.DiscardMemberData, plan.ResumeMember, plan.DisarmCorrupt, plan.SyncCA, plan.AdvanceCARotation:
	case plan.SetQuarantine:
		if act.ID != "" {
			return
		}
	case plan.RemoveMember:
		if err == nil && act.StuckLearner && act.NodeID != "" {
			// Its node failed to join in time; do not add it again at once.
			lp.failures.failed(plan.ActionKey(plan.AddMember{NodeID: act.NodeID}), errors.New(act.Reason), lp.now())
		}
	default:
		return
	}
	key := plan.ActionKey(act)
	switch {
	case err == nil:
		lp.failures.succeeded(key)
	case !waiting(err) && !lostLead(err):
		lp.failures.failed(key, err, lp.now())
	}
	lp.met.backingOff.Set(float64(lp.failures.prune(lp.now())))
}

// changed records a membership change, so the next one waits for a fresh
// backup.
func (lp *loop) changed(err error) error {
	if err == nil {
		lp.lastChange = lp.now()
	}
	return err
}

// openStore opens the backup store once, retrying on later cycles while
// it is unreachable.
func (lp *loop) openStore(ctx context.Context) (*store.Store, error) {
	if lp.store != nil {
		return lp.store, nil
	}
	s, err := store.Open(ctx, lp.cfg.BackupStore, store.Options{Create: true})
	if err != nil {
		return nil, err
	}
	lp.store = s
	return s, nil
}

// localClient returns a client for the local etcd's endpoint.
func (lp *loop) localClient(endpoint string) (*clientv3.Client, error) {
	if lp.client != nil && lp.clientEndpoint == endpoint {
		return lp.client, nil
	}
	if lp.client != nil {
		_ = lp.client.Close()
		lp.client = nil
	}
	c, err := etcdproc.NewClient([]string{endpoint}, lp.env.EtcdTLS)
	if err != nil {
		return nil, err
	}
	lp.client, lp.clientEndpoint = c, endpoint
	return c, nil
}
