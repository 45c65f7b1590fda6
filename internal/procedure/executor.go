package procedure

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// NodeAPI is what a procedure asks of a node: this agent's own, or a peer
// over the peer API.
type NodeAPI interface {
	Leave(ctx context.Context, req peer.LeaveRequest) error
	Restore(ctx context.Context, req peer.RestoreRequest) error
	Quarantine(ctx context.Context, req peer.QuarantineRequest) error
	Recover(ctx context.Context, req peer.RecoverRequest) error
	Fence(ctx context.Context, req peer.FenceRequest) error
}

// Nodes reaches the nodes a procedure calls.
type Nodes interface {
	// Call makes one call on node n, bounded by timeout.
	Call(ctx context.Context, n plan.Node, timeout time.Duration, call func(context.Context, NodeAPI) error) error
}

// Backups are the backups a procedure reads and takes.
type Backups interface {
	// Validate fetches the named backup and verifies it, returning its
	// meta; a backup that is missing or damaged wraps backup.ErrNotFound
	// or backup.ErrCorrupt, and one too large for the agent's maximum or
	// its disk wraps backup.ErrTooLarge or backup.ErrTempFull.
	// With a point, the backup is brought forward to it as a restore
	// would, and a fault in the segments wraps changelog.ErrCorrupt, ErrGap or
	// ErrRange. A backup or segment encrypted with a key this agent does
	// not hold wraps backup.ErrNoKey.
	Validate(ctx context.Context, name string, p spec.RestorePoint) (Validated, error)
	// Take takes a full backup through the etcd member from.
	Take(ctx context.Context, from Source, kind, reason string) (backup.Info, error)
	// Fits checks from its meta alone that a backup may be unpacked here:
	// one too large for the agent's maximum or its disk wraps
	// backup.ErrTooLarge or backup.ErrTempFull.
	Fits(meta backup.Meta, name string) error
	// RecordBranch records where a restored cluster's timeline began.
	RecordBranch(ctx context.Context, b changelog.Branch) error
}

// Validated is what checking a restore's backup found.
type Validated struct {
	Meta backup.Meta
	// Size is the snapshot's size as restored, once brought forward to
	// the point: what every restoring node needs room for.
	Size int64
	// Keys are the IDs of the encryption keys the backup and the segments
	// applied need: every node that restores them needs them too.
	Keys []string
	// Forward is set when captured changes were applied, and Digest is
	// the revision of the digest capture recorded that the result was
	// checked against (0: none between the backup and the target).
	Forward bool
	Digest  int64
}

// Source is the etcd member a backup is taken from.
type Source struct {
	// Endpoint is the member's client URL (its quarantine URL while it is
	// quarantined).
	Endpoint     string
	EtcdVersion  string
	ClusterToken string
	// Spec is the cluster spec the backup's meta records.
	Spec *spec.ClusterSpec
}

// Executor carries out the planner's procedure actions on the runner.
type Executor struct {
	Runner  *Runner
	Nodes   Nodes
	Backups Backups
	// SelfID names this agent in its calls to nodes.
	SelfID string
	// ClientTLS is the TLS of etcd clients, nil with plain http.
	ClientTLS *tls.Config
	Log       *slog.Logger
	Now       func() time.Time
	// Changed is told when a procedure changed the cluster's membership,
	// so that the next membership change waits for a fresh backup.
	Changed func()
	// WriteKeyID is the ID of the key the backups this agent takes are
	// encrypted with ("" when they are not): a dump-restore's nodes need
	// it.
	WriteKeyID string
}

// Call timeouts for the nodes' side of each step.
const (
	// callTimeout bounds a call that may stop or start etcd.
	callTimeout = 30 * time.Second
	// restoreCallTimeout bounds a node's restore: fetching, verifying and
	// restoring the backup, and starting etcd.
	restoreCallTimeout = 30 * time.Minute
	// etcdCallTimeout bounds a call to etcd.
	etcdCallTimeout = 10 * time.Second
)

// Execute carries out act if it is a procedure's, reporting whether it
// was.
func (e *Executor) Execute(ctx context.Context, obs plan.Observed, act plan.Action) (bool, error) {
	e.Runner.OnTakeOver = func(ctx context.Context, term int64) { e.fenceNodes(ctx, obs, term) }
	switch act := act.(type) {
	case plan.PrepareRestore:
		return true, e.prepareRestore(ctx, obs, act)
	case plan.PrepareDumpRestore:
		return true, e.prepareDumpRestore(ctx, obs, act)
	case plan.StopForRestore:
		return true, e.stopForRestore(ctx, obs, act)
	case plan.SetRestorePhase:
		return true, e.setRestorePhase(ctx, act.ID, act.On.Command, act.Phase)
	case plan.RestoreNodes:
		return true, e.restoreNodes(ctx, obs, act)
	case plan.VerifyRestore:
		return true, e.verifyRestore(ctx, obs, act)
	case plan.BackupRestored:
		return true, e.backupRestored(ctx, obs, act)
	case plan.DumpBackup:
		return true, e.dumpBackup(ctx, obs, act)
	case plan.SetQuarantine:
		if act.ID == "" {
			return false, nil // a stray quarantine: the etcd leader's, not a procedure's
		}
		return true, e.setQuarantine(ctx, obs, act)
	case plan.FinishRestore:
		return true, e.finishRestore(ctx, obs, act)
	case plan.RecoverMember:
		return true, e.recoverMember(ctx, obs, act)
	case plan.FinishRecover:
		return true, e.finishRecover(ctx, act)
	case plan.NoteCommand:
		cur := spec.CommandStatus{}
		if c := act.On.Command; c != nil {
			cur = c.Status
		}
		return true, e.Runner.Note(ctx, act.ID, cur, act.Message)
	case plan.HoldNodes:
		return true, e.holdNodes(ctx, obs, act)
	case plan.ReleaseHolds:
		return true, e.releaseHolds(ctx, act)
	case plan.FailCommand:
		// A procedure's command is failed by its driver, under its term,
		// so that the failure outranks the statuses it wrote before.
		c := act.On.Command
		if c == nil || !obs.LockHeld || !isProcedure(c) {
			return false, nil
		}
		return true, e.Runner.Fail(ctx, act.ID, c.Status, act.Reason)
	}
	return false, nil
}

// isProcedure reports whether c is carried out by a procedure.
func isProcedure(c *plan.Command) bool {
	k := c.Command
	return k.RestoreBackup != nil || k.DumpRestore != nil || k.RecoverQuorum != nil
}

// command returns the command id of a procedure action, as the plan
// attached it (c), and its definition.
func command(id string, c *plan.Command) (*plan.Command, Definition, error) {
	if c == nil {
		return nil, Definition{}, fmt.Errorf("procedure: command %s is gone", id)
	}
	switch {
	case c.Command.DumpRestore != nil:
		return c, DumpRestore, nil
	case c.Command.RecoverQuorum != nil:
		return c, RecoverQuorum, nil
	default:
		return c, Restore, nil
	}
}

// phaseOf is the phase the command's status records, empty before the
// first record.
func phaseOf(c *plan.Command) string {
	switch {
	case c.Status.Restore != nil:
		return c.Status.Restore.Phase
	case c.Status.Node != "":
		return PhaseForcing
	}
	return ""
}

// call makes one call on a node, naming this agent as the leader.
func (e *Executor) call(ctx context.Context, n plan.Node, timeout time.Duration, fn func(context.Context, NodeAPI) error) error {
	return e.Nodes.Call(ctx, n, timeout, fn)
}

// onNodes calls fn for each of the nodes, in parallel, and joins the
// errors.
func onNodes(ctx context.Context, nodes []plan.Node, fn func(context.Context, plan.Node) error) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(ctx, n)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// onNodesLeaderLast is onNodes for stopping or restarting every member of
// a cluster: the raft leader goes after the others. A leader stopped
// while its followers stop too spends etcd's whole request timeout (7 s
// by default) trying to hand leadership to one of them; after them, it
// either hands it to one already back or stops at once.
func onNodesLeaderLast(ctx context.Context, nodes []plan.Node, fn func(context.Context, plan.Node) error) error {
	var first, last []plan.Node
	for _, n := range nodes {
		if n.MemberID != 0 && n.RaftLeader == n.MemberID {
			last = append(last, n)
		} else {
			first = append(first, n)
		}
	}
	if err := onNodes(ctx, first, fn); err != nil || len(last) == 0 {
		return err
	}
	return onNodes(ctx, last, fn)
}

// LiftStrayQuarantine lifts a quarantine that no command explains, such
// as one a called-off dump-restore left. The agent beside etcd's leader
// does it, outside any procedure (term 0).
func (e *Executor) LiftStrayQuarantine(ctx context.Context, obs plan.Observed, act plan.SetQuarantine) error {
	e.Log.Warn("lifting a quarantine that no command explains", "cluster-token", act.Token, "nodes", act.NodeIDs)
	return e.quarantine(ctx, obs, act, 0)
}

// quarantine has the nodes restart their members of act.Token in or out
// of quarantine, in parallel, the raft leader last.
func (e *Executor) quarantine(ctx context.Context, obs plan.Observed, act plan.SetQuarantine, term int64) error {
	nodes, err := plan.ReachedAll(act.NodeIDs, act.On.Nodes)
	if err != nil {
		return err
	}
	return onNodesLeaderLast(ctx, nodes, func(ctx context.Context, n plan.Node) error {
		return e.call(ctx, n, callTimeout, func(ctx context.Context, api NodeAPI) error {
			req := peer.QuarantineRequest{LeaderID: e.SelfID, Term: term, Token: act.Token, Quarantined: act.Quarantine}
			if term != 0 {
				req.NotAfter = e.Runner.NotAfter()
			}
			return api.Quarantine(ctx, req)
		})
	})
}

// FenceAll tells every reachable node that a driver of term holds the
// store lock now: the loop calls it when it takes a new term, so that a
// driver that stalled and resumes is refused everywhere, before this one
// acts or not.
func (e *Executor) FenceAll(ctx context.Context, obs plan.Observed, term int64) {
	e.fenceNodes(ctx, obs, term)
}

// holdNodes has each node stop its etcd and keep it stopped under the
// driver's term, and read where its data stands (recover-quorum's step
// before it forces a survivor).
func (e *Executor) holdNodes(ctx context.Context, obs plan.Observed, act plan.HoldNodes) error {
	c, d, err := command(act.ID, act.On.Command)
	if err != nil {
		return err
	}
	return e.Runner.Do(ctx, d, c, phaseOf(c), func(ctx context.Context, term int64) error {
		errs := make([]error, len(act.Nodes))
		var wg sync.WaitGroup
		for i, n := range act.Nodes {
			wg.Go(func() {
				errs[i] = e.call(ctx, n, callTimeout, func(ctx context.Context, api NodeAPI) error {
					return api.Fence(ctx, peer.FenceRequest{LeaderID: e.SelfID, Term: term, Hold: true, NotAfter: e.Runner.NotAfter()})
				})
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		e.Log.Warn("held the etcd of the members with data down, to read where each one's data stands", "command", act.ID, "nodes", plan.NodeIDs(act.Nodes), "term", term)
		return nil
	})
}

// releaseHolds ends the holds no procedure needs: each under the term
// that holds it.
func (e *Executor) releaseHolds(ctx context.Context, act plan.ReleaseHolds) error {
	errs := make([]error, len(act.Nodes))
	var wg sync.WaitGroup
	for i, n := range act.Nodes {
		wg.Go(func() {
			errs[i] = e.call(ctx, n, callTimeout, func(ctx context.Context, api NodeAPI) error {
				return api.Fence(ctx, peer.FenceRequest{LeaderID: e.SelfID, Term: n.HeldBy, Release: true})
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	e.Log.Info("released the holds on etcd that no procedure needs", "nodes", plan.NodeIDs(act.Nodes))
	return nil
}

// fenceNodes tells every reachable node that the driver of term took over,
// before it acts: a driver that stalled before it and resumes is refused
// by all of them, not only by those the new driver has called since.
// Nodes not reached learn of it from the new driver's first call.
func (e *Executor) fenceNodes(ctx context.Context, obs plan.Observed, term int64) {
	err := onNodes(ctx, obs.Peers, func(ctx context.Context, n plan.Node) error {
		return e.call(ctx, n, callTimeout, func(ctx context.Context, api NodeAPI) error {
			return api.Fence(ctx, peer.FenceRequest{LeaderID: e.SelfID, Term: term})
		})
	})
	if err != nil {
		e.Log.Warn("not every node was told of the new driver's term; they learn it from its first call", "term", term, "error", err)
	}
}
