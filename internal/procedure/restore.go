package procedure

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// The restore procedure replaces the cluster with one made from a backup;
// the dump-restore procedure first quarantines the cluster and backs it
// up, then restores that backup into another etcd version. Their phases
// are spec.RestoreQuarantining through spec.RestoreLifting; package plan
// documents what each does and when it is done.

// prepareRestore fetches and verifies the backup, then records the
// restore's plan: the new token and members. Until that record is
// written, nothing of the cluster has been touched.
func (e *Executor) prepareRestore(ctx context.Context, obs plan.Observed, act plan.PrepareRestore) error {
	return e.Runner.Do(ctx, Restore, "", func(ctx context.Context, term int64) error {
		meta, err := e.Backups.Validate(ctx, act.Backup)
		if errors.Is(err, backup.ErrNotFound) || errors.Is(err, backup.ErrCorrupt) {
			reason := fmt.Sprintf("cannot restore: %v; the cluster was not touched", err)
			return e.fail(ctx, act.ID, reason)
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
		e.Log.Warn("restore started: stopping the current cluster", "command", act.ID, "backup", act.Backup,
			"cluster-token", token, "members", act.Members, "lock-term", term)
		return e.Runner.Record(ctx, Restore, act.ID, "", st, spec.RestoreStopping, "restore-"+spec.RestoreStopping)
	})
}

// fail marks a command failed, keeping it for the operator to read in
// list-commands.
func (e *Executor) fail(ctx context.Context, id, reason string) error {
	e.Log.Error("queued command failed", "command", id, "reason", reason)
	return e.Runner.Records.SetCommandStatus(ctx, id, spec.CommandStatus{State: spec.CommandFailed, Message: reason}, e.Now())
}

// newRestoreProgress is the plan of a new cluster of the members' nodes
// and version v, under a new token, starting at phase.
func newRestoreProgress(obs plan.Observed, phase string, members []string, v spec.Version) (*spec.RestoreProgress, error) {
	nodes, err := plan.FindNodes(obs.Peers, members)
	if err != nil {
		return nil, err
	}
	token, err := spec.NewClusterToken()
	if err != nil {
		return nil, err
	}
	return &spec.RestoreProgress{Phase: phase, Token: token, Members: members,
		InitialCluster: plan.InitialCluster(nodes), EtcdVersion: v.String()}, nil
}

// step runs one step of the current phase of the restore or dump-restore
// id.
func (e *Executor) step(ctx context.Context, obs plan.Observed, id string, fn func(context.Context, *plan.Command, *spec.RestoreProgress) error) error {
	c, d, err := command(obs, id)
	if err != nil {
		return err
	}
	p := c.Status.Restore
	if p == nil {
		return fmt.Errorf("procedure: restore %s has no progress", id)
	}
	return e.Runner.Do(ctx, d, p.Phase, func(ctx context.Context, _ int64) error { return fn(ctx, c, p) })
}

// setRestorePhase moves a restore to its next phase.
func (e *Executor) setRestorePhase(ctx context.Context, obs plan.Observed, id, phase string) error {
	c, d, err := command(obs, id)
	if err != nil {
		return err
	}
	if c.Status.Restore == nil {
		return fmt.Errorf("procedure: restore %s has no progress to move on", id)
	}
	st := c.Status
	p := *st.Restore
	from := p.Phase
	p.Phase = phase
	st.Restore = &p
	return e.Runner.Record(ctx, d, id, from, st, phase, "restore-"+phase)
}

// stopForRestore tells nodes to stop their old etcd and trash its data,
// the raft leader last.
func (e *Executor) stopForRestore(ctx context.Context, obs plan.Observed, act plan.StopForRestore) error {
	return e.step(ctx, obs, act.ID, func(ctx context.Context, _ *plan.Command, _ *spec.RestoreProgress) error {
		var ids []string
		for id := range act.Tokens {
			ids = append(ids, id)
		}
		return onNodesLeaderLast(ctx, obs, ids, func(ctx context.Context, n plan.Node) error {
			return e.call(ctx, n, callTimeout, func(ctx context.Context, api NodeAPI) error {
				return api.Leave(ctx, peer.LeaveRequest{LeaderID: e.SelfID, Token: act.Tokens[n.ID], Reason: "restore " + act.ID + " replaces this cluster"})
			})
		})
	})
}

// restoreNodes has the chosen nodes restore the backup, in parallel.
func (e *Executor) restoreNodes(ctx context.Context, obs plan.Observed, act plan.RestoreNodes) error {
	return e.step(ctx, obs, act.ID, func(ctx context.Context, c *plan.Command, p *spec.RestoreProgress) error {
		name := p.Backup // a dump-restore's own backup
		if c.Command.RestoreBackup != nil {
			name = c.Command.RestoreBackup.Backup
		}
		req := peer.RestoreRequest{
			LeaderID: e.SelfID,
			Backup:   name,
			Member: etcdproc.MemberState{
				ClusterToken: p.Token, EtcdVersion: p.EtcdVersion, InitialCluster: p.InitialCluster, Quarantined: true,
			},
		}
		return onNodes(ctx, obs, act.NodeIDs, func(ctx context.Context, n plan.Node) error {
			err := e.call(ctx, n, restoreCallTimeout, func(ctx context.Context, api NodeAPI) error { return api.Restore(ctx, req) })
			if err != nil {
				return fmt.Errorf("procedure: restore on %s: %w", n.ID, err)
			}
			return nil
		})
	})
}

// verifyRestore checks the restored cluster, then moves on to backing it
// up.
func (e *Executor) verifyRestore(ctx context.Context, obs plan.Observed, act plan.VerifyRestore) error {
	return e.step(ctx, obs, act.ID, func(ctx context.Context, _ *plan.Command, p *spec.RestoreProgress) error {
		if err := verifyRestored(ctx, obs, p, e.ClientTLS); err != nil {
			return err
		}
		e.Log.Info("restored cluster verified: every member is up and HashKV agrees", "command", act.ID, "members", p.Members)
		return e.setRestorePhase(ctx, obs, act.ID, spec.RestoreBackingUp)
	})
}

// backupRestored takes the fresh backup of the restored cluster, then
// moves on to lifting the quarantine.
func (e *Executor) backupRestored(ctx context.Context, obs plan.Observed, act plan.BackupRestored) error {
	return e.step(ctx, obs, act.ID, func(ctx context.Context, _ *plan.Command, p *spec.RestoreProgress) error {
		n, err := plan.FindNode(obs.Peers, p.Members[0])
		if err != nil {
			return err
		}
		if _, err := e.Backups.Take(ctx, Source{Endpoint: n.QuarantineURLs[0], EtcdVersion: p.EtcdVersion, ClusterToken: p.Token, Spec: obs.Spec}, "after restore "+act.ID); err != nil {
			return err
		}
		return e.setRestorePhase(ctx, obs, act.ID, spec.RestoreLifting)
	})
}

// setQuarantine quarantines the old cluster (dump-restore) or lifts the
// new one's quarantine (the end of a restore).
func (e *Executor) setQuarantine(ctx context.Context, obs plan.Observed, act plan.SetQuarantine) error {
	return e.step(ctx, obs, act.ID, func(ctx context.Context, _ *plan.Command, _ *spec.RestoreProgress) error {
		return e.quarantine(ctx, obs, act)
	})
}

// finishRestore removes the completed restore command.
func (e *Executor) finishRestore(ctx context.Context, obs plan.Observed, act plan.FinishRestore) error {
	_, d, err := command(obs, act.ID)
	if err != nil {
		return err
	}
	if err := e.Runner.Finish(ctx, d, act.ID); err != nil {
		return err
	}
	e.Log.Info("restore complete; the command is removed", "command", act.ID)
	e.Changed()
	return nil
}

// prepareDumpRestore records the plan of a dump-restore. Nothing has been
// touched yet.
func (e *Executor) prepareDumpRestore(ctx context.Context, obs plan.Observed, act plan.PrepareDumpRestore) error {
	c := plan.FindCommand(obs.Commands, act.ID)
	if c == nil || c.Command.DumpRestore == nil {
		return fmt.Errorf("procedure: no dump-restore %s", act.ID)
	}
	return e.Runner.Do(ctx, DumpRestore, "", func(ctx context.Context, term int64) error {
		v, err := spec.ParseSupportedVersion(c.Command.DumpRestore.EtcdVersion)
		if err != nil {
			return err
		}
		progress, err := newRestoreProgress(obs, spec.RestoreQuarantining, act.Members, v)
		if err != nil {
			return err
		}
		progress.OldToken = act.OldToken
		token := progress.Token
		st := spec.CommandStatus{State: spec.CommandRunning, Restore: progress,
			Message: fmt.Sprintf("changing etcd to %s by dump and restore: cluster %s is replaced by cluster %s", v, act.OldToken, token)}
		e.Log.Warn("dump-restore started: quarantining the cluster", "command", act.ID, "version", v.String(),
			"old-cluster-token", act.OldToken, "cluster-token", token, "members", act.Members, "lock-term", term)
		return e.Runner.Record(ctx, DumpRestore, act.ID, "", st, spec.RestoreQuarantining, "restore-"+spec.RestoreQuarantining)
	})
}

// dumpBackup backs up the quarantined cluster and records the backup as
// the one to restore.
func (e *Executor) dumpBackup(ctx context.Context, obs plan.Observed, act plan.DumpBackup) error {
	return e.step(ctx, obs, act.ID, func(ctx context.Context, c *plan.Command, cur *spec.RestoreProgress) error {
		p := *cur
		var from *plan.Node
		for i, n := range obs.Peers {
			if n.Member != nil && n.Member.ClusterToken == p.OldToken && n.Member.Quarantined && n.Healthy && len(n.QuarantineURLs) > 0 {
				from = &obs.Peers[i]
				break
			}
		}
		if from == nil {
			return fmt.Errorf("procedure: dump-restore %s: no quarantined member of cluster %s is healthy to back up", act.ID, p.OldToken)
		}
		info, err := e.Backups.Take(ctx, Source{Endpoint: from.QuarantineURLs[0], EtcdVersion: from.Member.EtcdVersion, ClusterToken: p.OldToken, Spec: obs.Spec},
			"dump for etcd "+p.EtcdVersion+" ("+act.ID+")")
		if err != nil {
			return err
		}
		p.Backup, p.Phase = info.Name, spec.RestoreStopping
		st := c.Status
		st.Restore = &p
		st.Message = fmt.Sprintf("changing etcd to %s by dump and restore of backup %s (revision %d) as cluster %s",
			p.EtcdVersion, info.Name, info.Meta.Revision, p.Token)
		e.Log.Warn("dump-restore: the quarantined cluster is backed up; stopping it", "command", act.ID, "backup", info.Name, "node", from.ID)
		return e.Runner.Record(ctx, DumpRestore, act.ID, cur.Phase, st, spec.RestoreStopping, "restore-"+spec.RestoreStopping)
	})
}

// verifyRestored checks that the restored cluster has exactly its members,
// all voters and up, and that HashKV agrees across them at one revision.
func verifyRestored(ctx context.Context, obs plan.Observed, p *spec.RestoreProgress, tlsCfg *tls.Config) error {
	nodes, err := plan.FindNodes(obs.Peers, p.Members)
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
		return fmt.Errorf("procedure: restored cluster: member list: %w", err)
	}
	if len(members.Members) != len(p.Members) {
		return fmt.Errorf("procedure: restored cluster has %d members, want %d", len(members.Members), len(p.Members))
	}
	st, err := c.Status(ctx, endpoints[0])
	if err != nil {
		return fmt.Errorf("procedure: restored cluster: status of %s: %w", endpoints[0], err)
	}
	rev := st.Header.Revision
	var first *clientv3.HashKVResponse
	for _, ep := range endpoints {
		h, err := c.HashKV(ctx, ep, rev)
		if err != nil {
			return fmt.Errorf("procedure: restored cluster: HashKV of %s at revision %d: %w", ep, rev, err)
		}
		if first == nil {
			first = h
			continue
		}
		if h.Hash != first.Hash || h.CompactRevision != first.CompactRevision {
			return fmt.Errorf("procedure: restored cluster: HashKV differs at revision %d: %s has %d, %s has %d",
				rev, endpoints[0], first.Hash, ep, h.Hash)
		}
	}
	return nil
}
