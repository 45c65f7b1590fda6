// Command etcd-manager is the agent that runs on every node: it supervises
// the local etcd and, with its peers, steers the cluster toward the spec in
// the backup store.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/etcd-manager/etcd-manager/cmd/internal/children"
	"github.com/etcd-manager/etcd-manager/cmd/internal/flags"
	"github.com/etcd-manager/etcd-manager/internal/agent"
	"github.com/etcd-manager/etcd-manager/internal/backupagent"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/version"
)

// defaultMemoryLimit is the Go runtime's soft memory limit unless
// GOMEMLIMIT sets one: the agent's live heap is small, and without a limit
// the garbage of a large backup's stream lets the heap balloon before the
// collector runs. It is soft: a larger live heap only makes the collector
// run more often.
const defaultMemoryLimit = 32 << 20

// defaultGCPercent is the collector's target unless GOGC sets one: the
// heap may grow by half its live size between collections, not by all of
// it. During a 1 GiB backup to file:// the agent's anonymous memory peaked
// at 21.7 MiB instead of 26.0-27.4, and the backup took about 3% longer
// (make bench). At idle the agent allocates little, so it collects
// seldom either way.
const defaultGCPercent = 50

// tuneCollector sets the agents' collector, unless the environment sets
// it. Only the long-running agents: the child processes the agent starts
// (verify-snapshot, check-data, compact-db) read a whole database, live
// for seconds and allocate garbage all the way through, and keep Go's
// defaults. Under the agent's settings, the status check of a 1 GiB
// snapshot took 1.05-1.25 s instead of 0.77-0.80 s.
func tuneCollector() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}

func main() {
	cfg := agent.Default()
	logCfg := cli.DefaultLogConfig()
	cmd := &cobra.Command{
		Use:     "etcd-manager",
		Version: version.Get().String(),
		Short:   "Run and heal an etcd cluster from the spec in a backup store",
		Long: `etcd-manager runs on every node of an etcd cluster. It starts the local etcd
of the version the cluster spec asks for, restarts it when it dies, and keeps
its state under --data-dir so that a restart picks up where it left off.

The spec lives in the backup store; set it with etcd-manager-ctl:

  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test \
    --member-count=1 --etcd-version=3.6.16 configure-cluster`,
		Example: `  etcd-manager --insecure --etcd-insecure --address 127.0.0.1 --etcd-address 127.0.0.1 \
    --cluster-name=test --backup-store=file:///tmp/etcd-manager/backups/test \
    --data-dir=/tmp/etcd-manager/data/test/1 --client-urls=http://127.0.0.1:4001 \
    --quarantine-client-urls=http://127.0.0.1:8001 --peer-urls=http://127.0.0.1:2380`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tuneCollector()
			log, err := logCfg.NewLogger(os.Stderr)
			if err != nil {
				return err
			}
			cfg.Complete()
			if err := cfg.Validate(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return agent.NewAgent(cfg, log).Run(ctx)
		},
	}
	flags.Agent(cmd.Flags(), &cfg)
	flags.Log(cmd.Flags(), &logCfg)
	backupAgent := newBackupAgentCommand()
	cmd.AddCommand(backupAgent)
	cmd.AddCommand(children.Agent()...)
	args := os.Args[1:]
	if len(args) > 0 && args[0] == backupAgent.Name() {
		cmd.SetArgs(append(args[:1:1], flags.Normalize(backupAgent.Flags(), args[1:])...))
	} else {
		cmd.SetArgs(flags.Normalize(cmd.Flags(), args))
	}
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "etcd-manager:", err)
		os.Exit(1)
	}
}

// newBackupAgentCommand is etcd-manager backup-agent: backups only, for an
// etcd that etcd-manager does not manage.
func newBackupAgentCommand() *cobra.Command {
	cfg := backupagent.Default()
	logCfg := cli.DefaultLogConfig()
	cmd := &cobra.Command{
		Use:   "backup-agent",
		Short: "Back up an etcd that etcd-manager does not manage",
		Long: `backup-agent takes the same verified full backups as the managing agent, of an
etcd cluster that something else runs: every --backup-interval, and on demand
with etcd-manager-ctl backup-now. It applies the same retention and writes the
same store format, so list-backups and restore-backup work on its backups.

It needs room in --temp-dir for one full database. Several backup agents may
share a store (one beside each member, say): a lock in the store picks the
one that backs up.`,
		Example: `  etcd-manager backup-agent --endpoints=https://10.0.0.1:2379,https://10.0.0.2:2379 \
    --cacert=/etc/etcd/ca.crt --cert=/etc/etcd/backup.crt --key=/etc/etcd/backup.key \
    --backup-store=s3://my-bucket/my-cluster/backups/etcd/main`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tuneCollector()
			log, err := logCfg.NewLogger(os.Stderr)
			if err != nil {
				return err
			}
			cfg.Complete()
			if err := cfg.Validate(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return agent.RunBackupAgent(ctx, cfg, log)
		},
	}
	flags.BackupAgent(cmd.Flags(), &cfg)
	flags.Log(cmd.Flags(), &logCfg)
	return cmd
}
