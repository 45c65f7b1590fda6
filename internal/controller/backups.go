package controller

import (
	"context"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

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
	_, err = lp.backups.Take(ctx, s, backup.Request{
		Client:       clientv3.Config{DialTimeout: 5 * time.Second, TLS: lp.env.EtcdTLS},
		Endpoint:     lp.clientEndpoint,
		TempDir:      filepath.Join(lp.cfg.DataDir, "tmp"),
		EtcdVersion:  obs.Self.Version,
		ClusterSpec:  obs.Spec,
		ClusterToken: obs.Cluster.Token,
		Kind:         act.Kind,
	}, ownDBSize(obs), act.Reason, act.CommandIDs...)
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

// ownDBSize is the size of this node's member's database, which its
// snapshot streams whole: 0 when the leader's view does not show it.
func ownDBSize(obs plan.Observed) int64 {
	if obs.Cluster == nil {
		return 0
	}
	for _, m := range obs.Cluster.Members {
		if m.Name == obs.Self.ID {
			return m.DBSize
		}
	}
	return 0
}
