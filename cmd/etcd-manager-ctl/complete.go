package main

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Shell completion (etcd-manager-ctl completion bash, zsh, fish or
// powershell) completes the commands and flags, and reads the store named
// by --backup-store for what the arguments name: backup names, command
// IDs and node IDs. A store that does not answer within completeTimeout
// completes nothing.

// completeTimeout bounds a completion's reads of the store: a shell waits
// for them.
const completeTimeout = 3 * time.Second

// isCompletion reports whether args ask cobra for completions (the hidden
// commands the completion scripts call).
func isCompletion(args []string) bool {
	return len(args) > 0 && (args[0] == cobra.ShellCompRequestCmd || args[0] == cobra.ShellCompNoDescRequestCmd)
}

// completeFrom completes the first argument from list, which reads the
// store; later arguments complete nothing.
func (o *options) completeFrom(list func(context.Context, *store.Store) ([]string, error)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 || o.backupStore == "" {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completeTimeout)
		defer cancel()
		s, err := store.Open(ctx, o.backupStore, store.Options{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer s.Close()
		names, err := list(ctx, s)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, n := range names {
			if strings.HasPrefix(n, toComplete) {
				out = append(out, n)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// backupNames are the store's backups, newest first.
func backupNames(ctx context.Context, s *store.Store) ([]string, error) {
	names, err := backup.Names(ctx, s)
	slices.Reverse(names)
	return names, err
}

// commandIDs are the queued commands' IDs.
func commandIDs(ctx context.Context, s *store.Store) ([]string, error) {
	cmds, err := s.ListCommands(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(cmds))
	for _, c := range cmds {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// nodeIDs are the node IDs the agents' discovery records in the store
// name.
func nodeIDs(ctx context.Context, s *store.Store) ([]string, error) {
	recs, err := peer.StoreRecords(ctx, s, peer.ReadLimits{Now: time.Now()})
	if len(recs) == 0 && err != nil {
		return nil, err
	}
	var ids []string
	for _, r := range recs {
		if r.NodeID != "" && !slices.Contains(ids, r.NodeID) {
			ids = append(ids, r.NodeID)
		}
	}
	slices.Sort(ids)
	return ids, nil
}
