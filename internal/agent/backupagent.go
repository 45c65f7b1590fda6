package agent

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/etcd-manager/etcd-manager/internal/backupagent"
)

// RunBackupAgent runs the backup-only agent, for an etcd that etcd-manager
// does not manage, until ctx is cancelled; it serves the agent's metrics
// on cfg.MetricsAddress when set. cfg is validated and completed.
func RunBackupAgent(ctx context.Context, cfg backupagent.Config, log *slog.Logger) error {
	met := newProcessMetrics()
	b := backupagent.New(cfg, log, met, readers())
	if err := b.Open(); err != nil {
		return err
	}
	if cfg.MetricsAddress != "" {
		stop, err := serve(cfg.MetricsAddress, met, func() (bool, string) { return true, "backup agent running" }, nil, false)
		if err != nil {
			return fmt.Errorf("agent: metrics: %w", err)
		}
		defer stop()
	}
	return b.Run(ctx)
}
