// Package children holds the hidden subcommands that etcd-manager and
// etcd-manager-ctl run as children of themselves, so that reading a whole
// database, which may be damaged and may make bbolt crash or grow without
// bound, happens outside the process that asked.
package children

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/etcd-manager/etcd-manager/internal/agent"
	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
)

// VerifySnapshot is the verify-snapshot subcommand: backup.VerifyCommand's
// child side.
func VerifySnapshot() *cobra.Command {
	var statusOnly, revisionOnly bool
	var memoryCeiling int64
	cmd := &cobra.Command{
		Use:    agent.VerifySnapshotCommand + " PATH",
		Short:  "Verify an etcd snapshot file and print its status as JSON (run by the binary itself)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		Run: func(cmd *cobra.Command, args []string) {
			if revisionOnly {
				os.Exit(backup.RunRevision(args[0], memoryCeiling, os.Stdout, os.Stderr))
			}
			os.Exit(backup.RunVerify(args[0], statusOnly, memoryCeiling, os.Stdout, os.Stderr))
		},
	}
	cmd.Flags().BoolVar(&statusOnly, agent.StatusOnlyFlag, false, "only read the status, for a snapshot whose sha256 trailer was already checked")
	cmd.Flags().BoolVar(&revisionOnly, agent.RevisionOnlyFlag, false, "only print the snapshot's revision, without checking it")
	cmd.Flags().Int64Var(&memoryCeiling, backup.MemoryCeilingFlag, 0, "stop the check, as failing, once it holds more than this many bytes of memory (0: no ceiling); the caller sets it from the snapshot's size")
	cmd.MarkFlagsMutuallyExclusive(agent.StatusOnlyFlag, agent.RevisionOnlyFlag)
	return cmd
}

// Agent are the agent's children: verify-snapshot, check-data and
// compact-db.
func Agent() []*cobra.Command {
	return []*cobra.Command{VerifySnapshot(), {
		Use:    agent.CheckDataCommand + " DATA_DIR",
		Short:  "Check the bbolt database under an etcd data dir, which no etcd holds open, and print the result as JSON (used by the agent)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		Run: func(cmd *cobra.Command, args []string) {
			os.Exit(etcdproc.RunCheckData(cmd.Context(), args[0], os.Stdout, os.Stderr))
		},
	}, {
		Use:    agent.CompactDBCommand + " DATA_DIR",
		Short:  "Defragment the bbolt database under an etcd data dir, which no etcd holds open, into a compact copy renamed over it, and print the result as JSON (used by the agent)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		Run: func(cmd *cobra.Command, args []string) {
			os.Exit(etcdproc.RunCompactDB(cmd.Context(), args[0], os.Stdout, os.Stderr))
		},
	}}
}
