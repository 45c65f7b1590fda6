package controller

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// A dump-restore changes the etcd version where no rolling change can
// (3.5 to 3.4, or down by several minors). It is a restore with two
// phases in front, recorded like the others:
//
//	quarantining: every member of the old cluster restarts serving clients
//	              on its quarantine URLs only, so no write is acknowledged
//	              that the backup would miss
//	dumping:      a backup of the quarantined cluster
//
// then stopping, restoring (into the new version, with that version's own
// tool), verifying, backing-up and lifting, as a restore does. Until the
// old cluster is stopped, setting the spec back calls it off and lifts the
// quarantine.

// queueDumpRestore queues the command that runs a dump-restore.
func (a *Agent) queueDumpRestore(ctx context.Context, act plan.QueueDumpRestore) error {
	s, err := a.openStore(ctx)
	if err != nil {
		return err
	}
	id, err := s.AddCommand(ctx, spec.Command{
		Timestamp:   spec.Int64(a.now().UnixNano()),
		DumpRestore: &spec.DumpRestoreCommand{EtcdVersion: act.Version},
	}, a.now())
	if err != nil {
		return err
	}
	a.log.Warn("changing the etcd version by dump and restore: clients are cut off until the new cluster serves",
		"command", id, "version", act.Version)
	return nil
}

// prepareDumpRestore records the plan of a dump-restore. Nothing has been
// touched yet.
func (a *Agent) prepareDumpRestore(ctx context.Context, s *store.Store, obs plan.Observed, act plan.PrepareDumpRestore) error {
	c := findCommand(obs.Commands, act.ID)
	if c == nil || c.Command.DumpRestore == nil {
		return fmt.Errorf("controller: no dump-restore %s", act.ID)
	}
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
	if err := s.SetCommandStatus(ctx, act.ID, st, a.now()); err != nil {
		return err
	}
	a.log.Warn("dump-restore started: quarantining the cluster", "command", act.ID, "version", v.String(),
		"old-cluster-token", act.OldToken, "cluster-token", token, "members", act.Members, "lock-term", a.lockTerm)
	crashPoint(a.log, "restore-"+spec.RestoreQuarantining)
	return nil
}

// dumpBackup backs up the quarantined cluster and records the backup as
// the one to restore.
func (a *Agent) dumpBackup(ctx context.Context, s *store.Store, obs plan.Observed, act plan.DumpBackup) error {
	c := findCommand(obs.Commands, act.ID)
	if c == nil || c.Status.Restore == nil {
		return fmt.Errorf("controller: dump-restore %s has no progress", act.ID)
	}
	p := *c.Status.Restore
	var from *plan.Node
	for i, n := range obs.Peers {
		if n.Member != nil && n.Member.ClusterToken == p.OldToken && n.Member.Quarantined && n.Healthy && len(n.QuarantineURLs) > 0 {
			from = &obs.Peers[i]
			break
		}
	}
	if from == nil {
		return fmt.Errorf("controller: dump-restore %s: no quarantined member of cluster %s is healthy to back up", act.ID, p.OldToken)
	}
	info, err := a.backups.take(ctx, s, backup.Request{
		Client:       clientv3.Config{DialTimeout: 5 * time.Second, TLS: a.etcdTLS},
		Endpoint:     from.QuarantineURLs[0],
		TempDir:      filepath.Join(a.cfg.DataDir, "tmp"),
		EtcdVersion:  from.Member.EtcdVersion,
		ClusterSpec:  obs.Spec,
		ClusterToken: p.OldToken,
	}, "dump for etcd "+p.EtcdVersion+" ("+act.ID+")")
	if err != nil {
		return err
	}
	p.Backup, p.Phase = info.Name, spec.RestoreStopping
	st := c.Status
	st.Restore = &p
	st.Message = fmt.Sprintf("changing etcd to %s by dump and restore of backup %s (revision %d) as cluster %s",
		p.EtcdVersion, info.Name, info.Meta.Revision, p.Token)
	if err := s.SetCommandStatus(ctx, act.ID, st, a.now()); err != nil {
		return err
	}
	a.log.Warn("dump-restore: the quarantined cluster is backed up; stopping it", "command", act.ID, "backup", info.Name, "node", from.ID)
	crashPoint(a.log, "restore-"+spec.RestoreStopping)
	return nil
}
