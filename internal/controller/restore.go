package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// CrashAtEnv names a crash point (see crashPoint) at which the agent
// kills itself. It exists for the crash-safety tests.
const CrashAtEnv = "ETCD_MANAGER_TEST_CRASH_AT"

// crashPoint SIGKILLs the agent, as a crash would, when CrashAtEnv names
// this point. Its etcd dies with it (parent-death signal).
func crashPoint(log *slog.Logger, name string) {
	if os.Getenv(CrashAtEnv) != name {
		return
	}
	log.Error("test hook: crashing here", "point", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// restoreCallTimeout bounds a node's restore: fetching, verifying and
// restoring the backup, and starting etcd.
const restoreCallTimeout = 30 * time.Minute

// executeRestore performs a restore step. Every step first re-checks that
// this agent still holds the store lock: the fencing token of a restore.
func (a *Agent) executeRestore(ctx context.Context, obs plan.Observed, act plan.Action) error {
	s, err := a.fencedStore(ctx)
	if err != nil {
		return err
	}
	switch act := act.(type) {
	case plan.PrepareRestore:
		return a.prepareRestore(ctx, s, obs, act)
	case plan.StopForRestore:
		var ids []string
		for id := range act.Tokens {
			ids = append(ids, id)
		}
		return a.onNodesLeaderLast(ctx, obs, ids, func(ctx context.Context, n plan.Node) error {
			return a.leaveNode(ctx, n, peer.LeaveRequest{Token: act.Tokens[n.ID], Reason: "restore " + act.ID + " replaces this cluster"})
		})
	case plan.SetRestorePhase:
		return a.setRestorePhase(ctx, s, obs, act.ID, act.Phase)
	case plan.RestoreNodes:
		return a.restoreNodes(ctx, obs, act)
	case plan.VerifyRestore:
		p, err := restoreProgress(obs, act.ID)
		if err != nil {
			return err
		}
		if err := verifyRestored(ctx, obs, p, a.etcdTLS); err != nil {
			return err
		}
		a.log.Info("restored cluster verified: every member is up and HashKV agrees", "command", act.ID, "members", p.Members)
		return a.setRestorePhase(ctx, s, obs, act.ID, spec.RestoreBackingUp)
	case plan.BackupRestored:
		p, err := restoreProgress(obs, act.ID)
		if err != nil {
			return err
		}
		n, err := findNode(obs.Peers, p.Members[0])
		if err != nil {
			return err
		}
		if _, err := a.backups.take(ctx, s, backup.Request{
			Client:       clientv3.Config{DialTimeout: 5 * time.Second, TLS: a.etcdTLS},
			Endpoint:     n.QuarantineURLs[0],
			TempDir:      filepath.Join(a.cfg.DataDir, "tmp"),
			EtcdVersion:  p.EtcdVersion,
			ClusterSpec:  obs.Spec,
			ClusterToken: p.Token,
		}, "after restore "+act.ID); err != nil {
			return err
		}
		return a.setRestorePhase(ctx, s, obs, act.ID, spec.RestoreLifting)
	case plan.SetQuarantine:
		return a.setQuarantine(ctx, obs, act)
	case plan.PrepareDumpRestore:
		return a.prepareDumpRestore(ctx, s, obs, act)
	case plan.DumpBackup:
		return a.dumpBackup(ctx, s, obs, act)
	case plan.FinishRestore:
		if err := s.DeleteCommand(ctx, act.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		a.log.Info("restore complete; the command is removed", "command", act.ID)
		a.lastChange = a.now()
		return nil
	}
	return fmt.Errorf("controller: not a restore action: %T", act)
}

// setQuarantine has the nodes restart their members of act.Token in or out
// of quarantine, in parallel.
func (a *Agent) setQuarantine(ctx context.Context, obs plan.Observed, act plan.SetQuarantine) error {
	if act.ID == "" {
		a.log.Warn("lifting a quarantine that no command explains", "cluster-token", act.Token, "nodes", act.NodeIDs)
	}
	return a.onNodesLeaderLast(ctx, obs, act.NodeIDs, func(ctx context.Context, n plan.Node) error {
		return a.askNode(ctx, n, func(ctx context.Context, api nodeAPI) error {
			return api.Quarantine(ctx, peer.QuarantineRequest{LeaderID: a.lock.NodeID, Token: act.Token, Quarantined: act.On})
		})
	})
}

// fencedStore opens the store after checking that this agent still holds
// the store lock, the fencing token of restore and recover-quorum steps.
func (a *Agent) fencedStore(ctx context.Context) (*store.Store, error) {
	s, err := a.openStore(ctx)
	if err != nil {
		return nil, err
	}
	held, err := a.lock.Holds(ctx, s, a.lockTerm)
	if err != nil {
		return nil, fmt.Errorf("controller: check the store lock: %w", err)
	}
	if !held {
		return nil, fmt.Errorf("%w: the store lock (term %d) has passed to another agent", ErrNotLeader, a.lockTerm)
	}
	return s, nil
}

// tempDir makes a fresh folder under <data-dir>/tmp; the caller removes it.
func (a *Agent) tempDir(prefix string) (string, error) {
	tmp := filepath.Join(a.cfg.DataDir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return "", fmt.Errorf("controller: %w", err)
	}
	dir, err := os.MkdirTemp(tmp, prefix)
	if err != nil {
		return "", fmt.Errorf("controller: %w", err)
	}
	return dir, nil
}

// prepareRestore fetches and verifies the backup, then records the
// restore's plan: the new token and members. Until that record is
// written, nothing of the cluster has been touched.
func (a *Agent) prepareRestore(ctx context.Context, s *store.Store, obs plan.Observed, act plan.PrepareRestore) error {
	dir, err := a.tempDir("validate-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	_, meta, err := backup.Fetch(ctx, s, act.Backup, dir, a.backups.verify)
	if errors.Is(err, backup.ErrNotFound) || errors.Is(err, backup.ErrCorrupt) {
		reason := fmt.Sprintf("cannot restore: %v; the cluster was not touched", err)
		return runCommandAction(ctx, s, a.now(), a.log, plan.FailCommand{ID: act.ID, Reason: reason})
	}
	if err != nil {
		return err
	}
	v, err := spec.ParseSupportedVersion(obs.Spec.EtcdVersion)
	if err != nil {
		return err
	}
	progress, err := newRestoreProgress(obs, spec.RestoreStopping, act.Members, v)
	if err != nil {
		return err
	}
	token := progress.Token
	st := spec.CommandStatus{State: spec.CommandRunning, Restore: progress,
		Message: fmt.Sprintf("restoring backup %s (etcd %s, revision %d) as cluster %s", act.Backup, meta.EtcdVersion, meta.Revision, token)}
	if err := s.SetCommandStatus(ctx, act.ID, st, a.now()); err != nil {
		return err
	}
	a.log.Warn("restore started: stopping the current cluster", "command", act.ID, "backup", act.Backup,
		"cluster-token", token, "members", act.Members, "lock-term", a.lockTerm)
	crashPoint(a.log, "restore-"+spec.RestoreStopping)
	return nil
}

// newRestoreProgress is the plan of a new cluster of the members' nodes
// and version v, under a new token, starting at phase.
func newRestoreProgress(obs plan.Observed, phase string, members []string, v spec.Version) (*spec.RestoreProgress, error) {
	nodes, err := findNodes(obs.Peers, members)
	if err != nil {
		return nil, err
	}
	token, err := newToken()
	if err != nil {
		return nil, err
	}
	return &spec.RestoreProgress{Phase: phase, Token: token, Members: members,
		InitialCluster: initialCluster(nodes), EtcdVersion: v.String()}, nil
}

func (a *Agent) setRestorePhase(ctx context.Context, s *store.Store, obs plan.Observed, id, phase string) error {
	c := findCommand(obs.Commands, id)
	if c == nil || c.Status.Restore == nil {
		return fmt.Errorf("controller: restore %s has no progress to move on", id)
	}
	st := c.Status
	p := *st.Restore
	p.Phase = phase
	st.Restore = &p
	if err := s.SetCommandStatus(ctx, id, st, a.now()); err != nil {
		return err
	}
	a.log.Info("restore moves on", "command", id, "phase", phase)
	crashPoint(a.log, "restore-"+phase)
	return nil
}

// onNodes calls fn for each of the nodes, in parallel, and joins the
// errors.
func (a *Agent) onNodes(ctx context.Context, obs plan.Observed, ids []string, fn func(context.Context, plan.Node) error) error {
	nodes, err := findNodes(obs.Peers, ids)
	if err != nil {
		return err
	}
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
func (a *Agent) onNodesLeaderLast(ctx context.Context, obs plan.Observed, ids []string, fn func(context.Context, plan.Node) error) error {
	var first, last []string
	for _, id := range ids {
		n, err := findNode(obs.Peers, id)
		if err == nil && n.MemberID != 0 && n.RaftLeader == n.MemberID {
			last = append(last, id)
		} else {
			first = append(first, id)
		}
	}
	if err := a.onNodes(ctx, obs, first, fn); err != nil || len(last) == 0 {
		return err
	}
	return a.onNodes(ctx, obs, last, fn)
}

// restoreNodes has the chosen nodes restore the backup, in parallel.
func (a *Agent) restoreNodes(ctx context.Context, obs plan.Observed, act plan.RestoreNodes) error {
	c := findCommand(obs.Commands, act.ID)
	if c == nil || c.Status.Restore == nil {
		return fmt.Errorf("controller: restore %s has no progress", act.ID)
	}
	p := c.Status.Restore
	name := p.Backup // a dump-restore's own backup
	if c.Command.RestoreBackup != nil {
		name = c.Command.RestoreBackup.Backup
	}
	req := peer.RestoreRequest{
		LeaderID: a.lock.NodeID,
		Backup:   name,
		Member: etcdproc.MemberState{
			ClusterToken: p.Token, EtcdVersion: p.EtcdVersion, InitialCluster: p.InitialCluster, Quarantined: true,
		},
	}
	return a.onNodes(ctx, obs, act.NodeIDs, func(ctx context.Context, n plan.Node) error { return a.restoreNode(ctx, n, req) })
}

func (a *Agent) restoreNode(ctx context.Context, n plan.Node, req peer.RestoreRequest) error {
	err := a.askNodeFor(ctx, n, restoreCallTimeout, func(ctx context.Context, api nodeAPI) error { return api.Restore(ctx, req) })
	if err != nil {
		return fmt.Errorf("controller: restore on %s: %w", n.ID, err)
	}
	return nil
}

// verifyRestored checks that the restored cluster has exactly its members,
// all voters and up, and that HashKV agrees across them at one revision.
func verifyRestored(ctx context.Context, obs plan.Observed, p *spec.RestoreProgress, tlsCfg *tls.Config) error {
	nodes, err := findNodes(obs.Peers, p.Members)
	if err != nil {
		return err
	}
	var endpoints []string
	for _, n := range nodes {
		endpoints = append(endpoints, n.QuarantineURLs[0])
	}
	c, err := etcdproc.NewClient(endpoints, tlsCfg)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
	defer cancel()
	members, err := c.MemberList(ctx)
	if err != nil {
		return fmt.Errorf("controller: restored cluster: member list: %w", err)
	}
	if len(members.Members) != len(p.Members) {
		return fmt.Errorf("controller: restored cluster has %d members, want %d", len(members.Members), len(p.Members))
	}
	st, err := c.Status(ctx, endpoints[0])
	if err != nil {
		return fmt.Errorf("controller: restored cluster: status of %s: %w", endpoints[0], err)
	}
	rev := st.Header.Revision
	var first *clientv3.HashKVResponse
	for _, ep := range endpoints {
		h, err := c.HashKV(ctx, ep, rev)
		if err != nil {
			return fmt.Errorf("controller: restored cluster: HashKV of %s at revision %d: %w", ep, rev, err)
		}
		if first == nil {
			first = h
			continue
		}
		if h.Hash != first.Hash || h.CompactRevision != first.CompactRevision {
			return fmt.Errorf("controller: restored cluster: HashKV differs at revision %d: %s has %d, %s has %d",
				rev, endpoints[0], first.Hash, ep, h.Hash)
		}
	}
	return nil
}

func restoreProgress(obs plan.Observed, id string) (*spec.RestoreProgress, error) {
	c := findCommand(obs.Commands, id)
	if c == nil || c.Status.Restore == nil {
		return nil, fmt.Errorf("controller: restore %s has no progress", id)
	}
	return c.Status.Restore, nil
}

func findCommand(cmds []plan.Command, id string) *plan.Command {
	for i := range cmds {
		if cmds[i].ID == id {
			return &cmds[i]
		}
	}
	return nil
}

func findNode(peers []plan.Node, id string) (plan.Node, error) {
	nodes, err := findNodes(peers, []string{id})
	if err != nil {
		return plan.Node{}, err
	}
	return nodes[0], nil
}

// Restore serves the peer API: become a member of a new cluster restored
// from a backup. It is idempotent: a node that already holds the new
// cluster's data only makes sure its etcd runs.
func (a *Agent) Restore(ctx context.Context, req peer.RestoreRequest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := req.Member
	token := m.ClusterToken
	if cur := a.state.Member; cur != nil && cur.ClusterToken == token && a.layout.HasEtcdData(token) {
		if a.proc.Status().Wanted {
			return nil
		}
		return a.startEtcdLocked(ctx)
	}
	v, err := spec.ParseSupportedVersion(m.EtcdVersion)
	if err != nil {
		return err
	}
	bins, err := etcdproc.FindBinaries(a.cfg.EtcdBinDir, v)
	if err != nil {
		return err
	}
	if cur := a.state.Member; cur != nil && cur.ClusterToken != token {
		if err := a.leaveLocked(ctx, "restore of backup "+req.Backup+" replaces this cluster"); err != nil {
			return err
		}
	}
	s, err := a.openStore(ctx)
	if err != nil {
		return err
	}
	dir, err := a.tempDir("restore-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path, _, err := backup.Fetch(ctx, s, req.Backup, dir, a.backups.verify)
	if err != nil {
		return err
	}
	out := a.layout.EtcdDataDir(token)
	if _, err := os.Stat(out); err == nil {
		// Left by a restore that crashed before it was recorded.
		trashed, err := a.layout.Trash(token, a.now())
		if err != nil {
			return err
		}
		a.log.Warn("moved an unfinished restore aside", "cluster-token", token, "data-moved-to", trashed)
	}
	staging := out + ".restoring"
	if err := os.RemoveAll(staging); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	err = bins.RestoreSnapshot(ctx, etcdproc.RestoreOptions{
		SnapshotPath:   path,
		DataDir:        staging,
		Name:           a.state.NodeID,
		PeerURLs:       a.cfg.PeerURLs,
		InitialCluster: m.InitialCluster,
		Token:          token,
	})
	if err != nil {
		os.RemoveAll(staging)
		return fmt.Errorf("controller: restore backup %s: %w", req.Backup, err)
	}
	if err := os.Rename(staging, out); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	crashPoint(a.log, "restore-node-data") // restored data, not yet in the state
	m.NewCluster, m.Pending, m.PeerURLs = false, false, a.cfg.PeerURLs
	st := a.state
	st.Member = &m
	if err := a.setState(st); err != nil {
		return err
	}
	a.log.Warn("restored backup; starting etcd in quarantine", "backup", req.Backup, "cluster-token", token, "leader", req.LeaderID)
	defer a.poke()
	return a.startEtcdLocked(ctx)
}

// Quarantine serves the peer API: restart etcd serving clients on the
// quarantine URLs only, or on the client URLs again.
func (a *Agent) Quarantine(ctx context.Context, req peer.QuarantineRequest) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.state.Member
	if cur == nil || cur.ClusterToken != req.Token {
		return fmt.Errorf("controller: quarantine cluster %s: this node is not its member", req.Token)
	}
	if cur.Quarantined == req.Quarantined {
		return nil
	}
	m := *cur
	m.Quarantined = req.Quarantined
	st := a.state
	st.Member = &m
	if err := a.setState(st); err != nil {
		return err
	}
	a.log.Warn("restarting etcd to change its quarantine", "quarantined", req.Quarantined, "leader", req.LeaderID)
	defer a.poke()
	return a.startEtcdLocked(ctx)
}
