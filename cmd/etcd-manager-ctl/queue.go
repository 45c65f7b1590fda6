package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/storeops"
)

// queueCommands are the commands that work through the store's command
// queue, which the leading agent reads each cycle.
func queueCommands(o *options, stdout io.Writer) []*cobra.Command {
	var wait bool
	var timeout, backupExpiry, restoreExpiry, recoverExpiry, defragExpiry time.Duration
	expireFlag := func(c *cobra.Command, d *time.Duration, def time.Duration) {
		c.Flags().DurationVar(d, "expire-after", def, "fail the command instead of starting it if the leader has not started it this long after it was queued (0: never); once started it never expires")
	}
	backupNow := &cobra.Command{
		Use:   "backup-now",
		Short: "Ask the leading agent for a full backup now, and print its name",
		Long: `backup-now queues a backup-now command in the backup store. The leading agent
takes a full, verified backup on its next cycle (before anything else but a
membership change in progress). With --wait (the default) it waits for the
backup and prints its name; --wait=false prints the command's ID at once, and
list-commands shows its progress.`,
		Example: "  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test backup-now",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.backupNow(cmd.Context(), stdout, wait, timeout, backupExpiry)
		},
	}
	backupNow.Flags().BoolVar(&wait, "wait", true, "wait for the backup and print its name")
	backupNow.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "how long --wait waits; the command stays queued after it")
	expireFlag(backupNow, &backupExpiry, 0)

	var restoreWait, restoreDry bool
	var restoreTimeout time.Duration
	var pf pointFlags
	restore := &cobra.Command{
		Use:   "restore-backup [NAME] [--latest | --to-revision=R | --to-time=RFC3339]",
		Short: "Replace the cluster with one restored from a backup, or from any captured point",
		Long: `restore-backup queues a restore of the named backup (as list-backups prints it),
or of a point in time: with --latest, --to-revision or --to-time it picks the
newest full backup at or before the target (or NAME) and brings it forward with
the changes continuous capture wrote under wal/, up to the target, inclusive.
Targets resolve on the history of the timeline (cluster token) of the newest
backup, that is the current cluster's, unless --timeline names another (or
NAME is given: its own): the timeline itself, then, back through the restores
that made it, the timeline each was restored from, up to where it branched.
list-backups --ranges shows the timelines, where each branched, their captured
ranges and any gaps. A target before the oldest
backup, after the last captured revision or inside a gap is refused before
anything is queued, as is a NAME that is not in the store or not whole
(without its meta or its data: list-backups lists only whole backups),
and so is any restore while another restore, or a recover-quorum, is not
finished: delete-command removes one that is not wanted. A restore the
leader has not started within --expire-after (1h) of being queued, such as
one queued while every agent was down, fails as expired instead of
replacing the cluster long after it was asked for; one that has started
never expires.
The agent holding the store lock then:
  1. fetches the backup and verifies it (sha256, gzip, snapshot); a bad backup
     fails the command and leaves the cluster untouched;
  2. stops etcd on every node, moving the old data to each node's trash;
  3. restores the backup on the spec's member count of nodes, as a new
     cluster, which serves only on the quarantine URLs;
  4. checks that every member is up and HashKV agrees, then lifts the
     quarantine: clients are back from here on;
  5. takes a fresh full backup of the restored cluster while clients write,
     and removes the command once that backup is recorded.
Writes made after the restored point are lost. With --wait (the default) it
prints each phase and returns when the restore is complete, its fresh backup
included, or has failed. --dry-run makes every check above, prints the
backup, the point and the captured segments the restore would use, from the
segments' headers, and queues nothing.`,
		Example: `  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test restore-backup 2026-11-22T05:00:00Z-000001
  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test restore-backup --latest
  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test restore-backup --to-time=2026-11-22T05:07:30Z --bump-revision=1000000 --mark-compacted`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			if name == "" && !pf.target() {
				return usagef("restore-backup: name a backup, or give --latest, --to-revision or --to-time")
			}
			if restoreDry {
				return o.restorePlan(cmd.Context(), stdout, name, pf)
			}
			return o.restoreBackup(cmd.Context(), stdout, cmd.ErrOrStderr(), name, pf, restoreWait, restoreTimeout, restoreExpiry)
		},
	}
	restore.Flags().BoolVar(&pf.latest, "latest", false, "restore the newest point captured: the newest full backup and every captured change after it")
	restore.Flags().Int64Var(&pf.toRevision, "to-revision", 0, "restore the state at this etcd revision, inclusive")
	restore.Flags().StringVar(&pf.toTime, "to-time", "", "restore the state at this moment (RFC3339): the last revision captured at or before it")
	restore.Flags().StringVar(&pf.timeline, "timeline", "", "the timeline (cluster token) to resolve the target on (default: the newest backup's, the current cluster's)")
	restore.Flags().Int64Var(&pf.bump, "bump-revision", 0, "etcd's --bump-revision: raise the restored revision by this much, so that watching clients (Kubernetes) never see a revision twice; needs --mark-compacted and etcd 3.5 or later")
	restore.Flags().StringSliceVar(&pf.keyFiles, "backup-decryption-key-file", nil, "with --to-time, a file holding the age key the captured segments are encrypted with, to read the times inside them (repeat for several); nothing else the ctl does needs a key")
	restore.Flags().BoolVar(&pf.markCompacted, "mark-compacted", false, "etcd's --mark-compacted: mark the restored revision compacted, so that watches from before the restore fail and start again")
	restore.Flags().BoolVar(&pf.requireDigest, "require-digest", false, "refuse a point that no digest checks: one brought forward with captured changes when capture recorded no digest between the backup and the target (see list-backups --ranges)")
	restore.Flags().BoolVar(&restoreWait, "wait", true, "wait until the restore is complete or has failed")
	restore.Flags().DurationVar(&restoreTimeout, "timeout", 30*time.Minute, "how long --wait waits; the restore goes on after it")
	expireFlag(restore, &restoreExpiry, time.Hour)
	restore.Flags().BoolVar(&restoreDry, "dry-run", false, "check the restore and print what it would use (the backup, the revision and timeline, the captured segments) and what it would lose, and queue nothing")

	var recoverTimeout time.Duration
	var lost []string
	recoverQuorum := &cobra.Command{
		Use:   "recover-quorum",
		Short: "Rebuild a cluster that lost quorum from its surviving member's data",
		Long: `recover-quorum is for a cluster that has lost a majority of its members for good
(their data is gone), while at least one member still holds its data. The
agent holding the store lock picks the survivor with the longest raft log and
restarts its etcd with --force-new-cluster: the cluster continues from that
member's data, with nothing it holds lost, writes after the last backup
included. The other nodes then rejoin as new members.

It is refused, and nothing changes, while any member still sees a raft leader
or a quorum of members with data is up. When no member has data left, use
restore-backup instead.

Not reaching the other members is no proof that they lost quorum: the
survivor may be cut off from a cluster that still serves. The agent forces a
new cluster only with evidence for each other member: its agent answers and
its etcd has no leader, or its agent's record in the store is fresh and shows
no leader, or you name it with --lost and its agent has been silent for a
lease. While evidence is missing, the command waits and says which members
are silent; name them with --lost only if their nodes are gone for good.
It is refused while a restore or another recover-quorum is not finished,
and fails as expired if the leader has not started it within
--expire-after (1h).`,
		Example: "  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test recover-quorum",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.recoverQuorum(cmd.Context(), stdout, cmd.ErrOrStderr(), lost, recoverTimeout, recoverExpiry)
		},
	}
	recoverQuorum.Flags().DurationVar(&recoverTimeout, "timeout", 5*time.Minute, "how long to wait for the recovery; the command stays queued after it")
	expireFlag(recoverQuorum, &recoverExpiry, time.Hour)
	recoverQuorum.Flags().StringSliceVar(&lost, "lost", nil, "node IDs of members whose nodes are gone for good (as status lists them); with their agents silent for a lease, they count as having no quorum")

	var defragWait bool
	var defragTimeout time.Duration
	defrag := &cobra.Command{
		Use:   "defrag",
		Short: "Defragment every member now, one at a time, and print which",
		Long: `defrag queues a defrag command in the backup store. The leading agent
defragments every member, one at a time, followers first, and hands raft
leadership on before its own member's turn, so the leader is never
defragmented in place. It starts a member only while every member is healthy
and caught up, whatever the spec's defrag policy and window say. With --wait
(the default) it waits until every member is done; --wait=false prints the
command's ID at once, and list-commands shows its progress.`,
		Example: "  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test defrag",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.defrag(cmd.Context(), stdout, defragWait, defragTimeout, defragExpiry)
		},
	}
	restore.ValidArgsFunction = o.completeFrom(backupNames)
	_ = recoverQuorum.RegisterFlagCompletionFunc("lost", o.completeFrom(nodeIDs))
	defrag.Flags().BoolVar(&defragWait, "wait", true, "wait until every member is defragmented")
	defrag.Flags().DurationVar(&defragTimeout, "timeout", 30*time.Minute, "how long --wait waits; the command stays queued after it")
	expireFlag(defrag, &defragExpiry, 0)

	return []*cobra.Command{
		backupNow,
		restore,
		recoverQuorum,
		defrag,
		{
			Use:   "list-commands",
			Short: "List the queued commands with their state: pending, running, done or failed",
			Long: `list-commands prints one command per line, oldest first: its ID, kind, state
and detail (the backup taken, or why it failed). A failed command stays until
delete-command removes it; a done one is removed by the leader after an hour.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return o.listCommands(cmd.Context(), stdout)
			},
		},
		{
			Use:               "delete-command ID",
			ValidArgsFunction: o.completeFrom(commandIDs),
			Short:             "Remove a command from the queue",
			Long: `delete-command removes the command with the given ID (as list-commands prints it)
from the queue. A command that is running may still finish its current step.`,
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return o.deleteCommand(cmd.Context(), stdout, args[0])
			},
		},
	}
}

func (o *options) backupNow(ctx context.Context, w io.Writer, wait bool, timeout, expireAfter time.Duration) error {
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	id, err := o.queue(ctx, s, spec.Command{BackupNow: &spec.BackupNowCommand{}}, expireAfter)
	if err != nil {
		return fmt.Errorf("backup-now: queue the command: %w", err)
	}
	if !wait {
		return o.emitQueued(w, id)
	}
	var last spec.CommandStatus
	// How far the snapshot's stream has gone, as the leader says, on
	// stderr: stdout takes the backup's name alone.
	var m *meter
	defer func() {
		if m != nil {
			m.Finish()
		}
	}()
	err = watchCommand(ctx, s, id, timeout, func(q store.QueuedCommand, err error) (bool, error) {
		switch {
		case errors.Is(err, store.ErrNotFound):
			return true, fmt.Errorf("backup-now: command %s was deleted before it finished", id)
		case err == nil:
			last = q.Status
			if tr := q.Status.Transfer; tr != nil && q.Status.State == spec.CommandRunning {
				if m == nil {
					m = startMeterAt(o.stderr, "backup-now "+id+": streamed", tr.Total, time.Unix(0, int64(tr.Started)))
				}
				m.Set(tr.Done, tr.Total)
			}
			switch q.Status.State {
			case spec.CommandDone:
				if m != nil && m.total.Load() > 0 {
					m.Set(m.total.Load(), m.total.Load()) // streamed whole
				}
				return true, o.emit(w, commandResult{Command: id, State: spec.CommandDone, Backup: q.Status.Backup}, func() error {
					return fprintf(w, "%s\n", q.Status.Backup)
				})
			case spec.CommandFailed:
				return true, fmt.Errorf("backup-now: command %s failed: %s", id, printable(q.Status.Message))
			}
		}
		return false, nil
	})
	if errors.Is(err, errWaitTimeout) {
		why := "no leading agent has taken it up (is etcd running and healthy?)"
		switch {
		case last.State == spec.CommandRunning:
			why = "it is still running: " + last.Message
		default:
			// Queued while the leader backs off after a failed backup:
			// say what failed.
			if cmds, err := s.ListCommands(ctx); err == nil {
				for _, q := range cmds {
					if q.ID != id && q.Command.BackupNow != nil && q.Status.State == spec.CommandRunning && q.Status.Message != "" {
						why = "the leader waits to retry after a failed backup: " + printable(q.Status.Message)
					}
				}
			}
		}
		return stillQueued{fmt.Errorf("backup-now: no backup after %s: %s; command %s stays queued (see list-commands, or delete-command %s)",
			timeout, why, id, id)}
	}
	return err
}

func (o *options) defrag(ctx context.Context, w io.Writer, wait bool, timeout, expireAfter time.Duration) error {
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	id, err := o.queue(ctx, s, spec.Command{Defrag: &spec.DefragCommand{}}, expireAfter)
	if err != nil {
		return fmt.Errorf("defrag: queue the command: %w", err)
	}
	if !wait {
		return o.emitQueued(w, id)
	}
	progress := o.progressTo(w)
	var last spec.CommandStatus
	shown := 0
	err = watchCommand(ctx, s, id, timeout, func(q store.QueuedCommand, err error) (bool, error) {
		switch {
		case errors.Is(err, store.ErrNotFound):
			return true, fmt.Errorf("defrag: command %s was deleted before it finished", id)
		case err == nil:
			last = q.Status
			for _, n := range q.Status.Defragmented[min(shown, len(q.Status.Defragmented)):] {
				fprintf(progress, "defragmented %s\n", n)
			}
			shown = max(shown, len(q.Status.Defragmented))
			switch q.Status.State {
			case spec.CommandDone:
				return true, o.emit(w, commandResult{Command: id, State: spec.CommandDone, Defragmented: nonNil(q.Status.Defragmented)}, nil)
			case spec.CommandFailed:
				return true, fmt.Errorf("defrag: command %s failed: %s", id, printable(q.Status.Message))
			}
		}
		return false, nil
	})
	if errors.Is(err, errWaitTimeout) {
		why := "no leading agent has taken it up (is etcd running, with every member healthy?)"
		if last.State == spec.CommandRunning {
			why = "it is still running: " + last.Message
		}
		return stillQueued{fmt.Errorf("defrag: not done after %s: %s; command %s stays queued (see list-commands, or delete-command %s)", timeout, why, id, id)}
	}
	return err
}

// errWaitTimeout is watchCommand's error when its timeout passes.
var errWaitTimeout = errors.New("timed out")

// queue adds cmd to the queue, to expire expireAfter from now unless it
// has started (never when 0), and nudges the agents, so that the leading
// agent takes it up at once rather than on its next loop tick.
func (o *options) queue(ctx context.Context, s *store.Store, cmd spec.Command, expireAfter time.Duration) (string, error) {
	now := time.Now()
	if expireAfter < 0 {
		return "", usagef("--expire-after %s cannot be negative; 0 means never", expireAfter)
	}
	if expireAfter > 0 {
		cmd.Expires = spec.Int64(now.Add(expireAfter).UnixNano())
	}
	id, err := s.AddCommand(ctx, cmd, now)
	if err != nil {
		return "", err
	}
	o.nudge(ctx, s)
	return id, nil
}

// nudgeTimeout bounds a nudge: finding the agents, and asking them all.
const nudgeTimeout = 2 * time.Second

// nudge tells every agent it finds that the store changed, through the
// peer API's announcement (an Info call that says the caller's state
// changed), which an operator's client certificate may make: each agent
// then runs a cycle at once, and the leading agent reads the queue in it.
// Without it, the leader reads the queue on its next tick (--loop-interval,
// 2s by default). It is best effort and bounded: an agent it cannot reach,
// or a CA this ctl cannot read, leaves the command to that tick, and says
// nothing. It reads the CA only once it has found agents to tell.
func (o *options) nudge(ctx context.Context, s *store.Store) {
	ctx, cancel := context.WithTimeout(ctx, nudgeTimeout)
	defer cancel()
	recs, err := o.discoverAgents(ctx, s)
	if err != nil || len(recs) == 0 {
		return
	}
	quiet := *o
	quiet.stderr = io.Discard // the command's own output stays as it was
	creds, _, err := quiet.peerCreds(ctx)
	if err != nil {
		return
	}
	var wg sync.WaitGroup
	seen := map[string]bool{}
	for _, r := range recs {
		if seen[r.Address] {
			continue
		}
		seen[r.Address] = true
		name := o.clusterName
		if name == "" {
			name = r.ClusterName
		}
		wg.Go(func() {
			c, err := peer.Dial(r.Address, name, creds)
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = c.Announce(ctx)
		})
	}
	wg.Wait()
}

// watchCommand reads the command every quarter second and hands it, or
// the read's error, to step, until step says it is done or timeout passes
// (errWaitTimeout).
func watchCommand(ctx context.Context, s *store.Store, id string, timeout time.Duration, step func(store.QueuedCommand, error) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// One small read per tick: cheap on any store.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if done, err := step(s.ReadCommand(ctx, id)); done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return errWaitTimeout
		case <-tick.C:
		}
	}
}

func (o *options) listCommands(ctx context.Context, w io.Writer) error {
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	rows, err := storeops.CommandRows(ctx, s)
	if err != nil {
		return err
	}
	if o.structured() {
		return o.emit(w, rows, nil)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		detail := r.Detail
		if r.Phase != "" {
			detail = "phase " + r.Phase + prefixed("; ", detail)
		}
		if r.Backup != "" {
			detail = "backup " + r.Backup + prefixed("; ", detail)
		}
		if r.Expires != "" && r.State == spec.CommandPending {
			detail = prefixed("", detail+"; ") + "expires " + r.Expires
		}
		fprintf(tw, "%s\t%s\t%s\t%s\n", r.ID, r.Kind, r.State, dash(detail))
	}
	return tw.Flush()
}

func (o *options) deleteCommand(ctx context.Context, w io.Writer, id string) error {
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.DeleteCommand(ctx, id); err != nil {
		return fmt.Errorf("delete-command: %w", err)
	}
	return o.emit(w, commandResult{Command: id, State: "deleted"}, func() error {
		return fprintf(w, "deleted command %s\n", id)
	})
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

func (o *options) restoreBackup(ctx context.Context, w, progress io.Writer, name string, pf pointFlags, wait bool, timeout, expireAfter time.Duration) error {
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	name, point, err := checkRestore(ctx, s, name, pf)
	if err != nil {
		return err
	}
	if point.ToRevision > 0 {
		fprintf(progress, "restoring timeline %s at revision %d: backup %s brought forward with captured changes\n", point.Timeline, point.ToRevision, name)
	}
	cmd := spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: name, RestorePoint: point, RequireDigest: pf.requireDigest}}
	// The format carries the spec to restore as; ours is the store's.
	if cs, err := s.ReadSpec(ctx); err == nil {
		cmd.RestoreBackup.ClusterSpec = &cs
	}
	id, err := o.queue(ctx, s, cmd, expireAfter)
	if err != nil {
		return fmt.Errorf("restore-backup: queue the command: %w", err)
	}
	fprintf(progress, "queued restore of %s as command %s\n", name, id)
	if !wait {
		return o.emitQueued(w, id)
	}
	lastPhase, fresh, check := "", "", ""
	downloads := &nodeTransfers{o: o, s: s, w: progress, prefix: "restore " + id + ": "}
	err = watchCommand(ctx, s, id, timeout, func(q store.QueuedCommand, err error) (bool, error) {
		if err == nil && q.Status.State != spec.CommandFailed {
			downloads.poll(ctx)
		}
		if err == nil && q.Status.Restore != nil && q.Status.Restore.Check != "" && check == "" {
			check = q.Status.Restore.Check
			fprintf(progress, "restore %s: %s\n", id, printable(q.Status.Message))
		}
		switch {
		case errors.Is(err, store.ErrNotFound):
			// The leader removes a restore command once it is complete.
			return true, o.emit(w, commandResult{Command: id, State: spec.CommandDone, Backup: name, Point: pointOf(point), Check: check, FreshBackup: fresh}, func() error {
				return fprintf(w, "restored backup %s%s\n", name, prefixed(" ", check))
			})
		case err == nil && q.Status.State == spec.CommandFailed:
			return true, fmt.Errorf("restore-backup: command %s failed: %s", id, printable(q.Status.Message))
		case err == nil && q.Status.Restore != nil && q.Status.Restore.Phase != lastPhase:
			lastPhase = q.Status.Restore.Phase
			fprintf(progress, "restore %s: %s%s\n", id, lastPhase, phaseNote(lastPhase))
		case err == nil && q.Status.Restore != nil && q.Status.Restore.Fresh != "" && q.Status.Restore.Fresh != fresh:
			fresh = q.Status.Restore.Fresh
			fprintf(progress, "restore %s: fresh backup %s taken\n", id, printable(fresh))
		}
		return false, nil
	})
	if errors.Is(err, errWaitTimeout) {
		return stillQueued{fmt.Errorf("restore-backup: not finished after %s (last phase %q); command %s goes on (see list-commands)", timeout, lastPhase, id)}
	}
	return err
}

// phaseNote says what a restore phase means for clients, where it
// matters to the person waiting.
func phaseNote(phase string) string {
	switch phase {
	case spec.RestoreRestoring:
		return " (quarantined: no client can reach the restored cluster yet)"
	case spec.RestoreBackingUp:
		return " (clients are back; a fresh full backup of the restored cluster is taken)"
	}
	return ""
}

func (o *options) recoverQuorum(ctx context.Context, w, progress io.Writer, lost []string, timeout, expireAfter time.Duration) error {
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := storeops.CheckNoneExclusive(ctx, s, time.Now()); err != nil {
		return fmt.Errorf("recover-quorum: %w; nothing was queued", err)
	}
	id, err := o.queue(ctx, s, spec.Command{RecoverQuorum: &spec.RecoverQuorumCommand{Lost: lost}}, expireAfter)
	if err != nil {
		return fmt.Errorf("recover-quorum: queue the command: %w", err)
	}
	fprintf(progress, "queued recover-quorum as command %s\n", id)
	node, note := "", ""
	err = watchCommand(ctx, s, id, timeout, func(q store.QueuedCommand, err error) (bool, error) {
		switch {
		case errors.Is(err, store.ErrNotFound):
			return true, o.emit(w, commandResult{Command: id, State: spec.CommandDone, Node: node}, func() error {
				return fprintf(w, "quorum recovered from %s\n", dash(node))
			})
		case err == nil && q.Status.State == spec.CommandFailed:
			return true, fmt.Errorf("recover-quorum: command %s failed: %s", id, printable(q.Status.Message))
		case err == nil && q.Status.Node != "" && q.Status.Node != node:
			node = q.Status.Node
			fprintf(progress, "recover-quorum %s: rebuilding from %s\n", id, node)
		case err == nil && q.Status.State == spec.CommandPending && q.Status.Message != "" && q.Status.Message != note:
			note = q.Status.Message
			fprintf(progress, "recover-quorum %s: %s\n", id, note)
		}
		return false, nil
	})
	if errors.Is(err, errWaitTimeout) {
		why := ""
		if note != "" {
			why = " (" + note + ")"
		}
		return stillQueued{fmt.Errorf("recover-quorum: not finished after %s%s; command %s stays queued (see list-commands, or delete-command %s)", timeout, why, id, id)}
	}
	return err
}

// checkBackup is storeops.CheckBackup.
func checkBackup(ctx context.Context, s *store.Store, name string) error {
	return storeops.CheckBackup(ctx, s, name)
}

// commandResult is what a command of the queue reports when it is done,
// or queued with --wait=false.
type commandResult struct {
	Command string `json:"command"`
	// State is the command's: pending when queued without waiting,
	// done, or deleted.
	State string `json:"state"`
	// Backup is the backup taken (backup-now) or restored.
	Backup string `json:"backup,omitempty"`
	// Point is where a restore brought the backup forward to.
	Point *spec.RestorePoint `json:"point,omitempty"`
	// Check is what the restore checked before it lifted the quarantine.
	Check string `json:"check,omitempty"`
	// FreshBackup is the full backup taken of the restored cluster.
	FreshBackup string `json:"freshBackup,omitempty"`
	// Node is the member a quorum was recovered from.
	Node string `json:"node,omitempty"`
	// Defragmented are the members defragmented, in order.
	Defragmented []string `json:"defragmented,omitempty"`
}

// emitQueued reports a command queued without waiting: its ID alone, as
// text, for scripts to pass to list-commands or delete-command.
func (o *options) emitQueued(w io.Writer, id string) error {
	return o.emit(w, commandResult{Command: id, State: spec.CommandPending}, func() error {
		_, err := fmt.Fprintln(w, id)
		return err
	})
}

// progressTo is where a command's progress goes: stdout (w) for text,
// stderr when stdout takes a JSON or YAML result alone.
func (o *options) progressTo(w io.Writer) io.Writer {
	if o.structured() {
		return o.stderr
	}
	return w
}

// pointOf is the point a restore was asked to reach, nil for a backup
// restored as it is.
func pointOf(p spec.RestorePoint) *spec.RestorePoint {
	if p == (spec.RestorePoint{}) {
		return nil
	}
	return &p
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// checkRestore makes the checks a restore passes before it is queued:
// the named backup whole, the target reachable, no other restore or
// recover-quorum unfinished. It returns the backup to restore and the
// point to bring it to.
func checkRestore(ctx context.Context, s *store.Store, name string, pf pointFlags) (string, spec.RestorePoint, error) {
	if name != "" {
		if err := checkBackup(ctx, s, name); err != nil {
			return "", spec.RestorePoint{}, fmt.Errorf("restore-backup: %w; nothing was queued", err)
		}
	}
	named := name
	name, point, err := resolvePoint(ctx, s, name, pf)
	if err != nil {
		return "", point, fmt.Errorf("restore-backup: %w", err)
	}
	if name != named {
		if err := checkBackup(ctx, s, name); err != nil {
			return "", point, fmt.Errorf("restore-backup: %w; nothing was queued", err)
		}
	}
	if err := storeops.CheckNoneExclusive(ctx, s, time.Now()); err != nil {
		return "", point, fmt.Errorf("restore-backup: %w; nothing was queued", err)
	}
	return name, point, nil
}

// restorePlanResult is what restore-backup --dry-run reports.
type restorePlanResult struct {
	DryRun          bool   `json:"dryRun"`
	Backup          string `json:"backup"`
	BackupRevision  int64  `json:"backupRevision"`
	BackupTime      string `json:"backupTime,omitempty"`
	EtcdVersion     string `json:"etcdVersion,omitempty"`
	EncryptionKeyID string `json:"encryptionKeyId,omitempty"`
	// Point is where captured changes bring the backup to; nil when the
	// backup is restored as it is.
	Point *spec.RestorePoint `json:"point,omitempty"`
	// Revision is the revision the restored cluster starts from (before
	// any bump): writes after it are lost.
	Revision      int64            `json:"revision"`
	Segments      []plannedSegment `json:"segments"`
	MemberCount   int32            `json:"memberCount,omitempty"`
	RequireDigest bool             `json:"requireDigest,omitempty"`
}

// plannedSegment is a captured segment a restore would read.
type plannedSegment struct {
	Key             string `json:"key"`
	First           int64  `json:"first"`
	Last            int64  `json:"last"`
	Level           int    `json:"level"`
	EncryptionKeyID string `json:"encryptionKeyId,omitempty"`
}

// restorePlan is restore-backup --dry-run: every check a restore makes
// before it is queued, then what it would use; nothing is queued.
func (o *options) restorePlan(ctx context.Context, w io.Writer, name string, pf pointFlags) error {
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	name, point, err := checkRestore(ctx, s, name, pf)
	if err != nil {
		return err
	}
	meta, err := backup.ReadMeta(ctx, s, name)
	if err != nil {
		return fmt.Errorf("restore-backup: %w", err)
	}
	res := restorePlanResult{DryRun: true, Backup: name, BackupRevision: meta.Revision, EtcdVersion: meta.EtcdVersion,
		Point: pointOf(point), Revision: meta.Revision, Segments: []plannedSegment{}, RequireDigest: pf.requireDigest}
	if at, ok := backup.NameTime(name); ok {
		res.BackupTime = rfcTime(at)
	}
	if meta.Encryption != nil {
		res.EncryptionKeyID = meta.Encryption.KeyID
	}
	if cs, err := s.ReadSpec(ctx); err == nil {
		res.MemberCount = cs.MemberCount
	}
	if point.ToRevision > 0 {
		res.Revision = point.ToRevision
		hs, err := changelog.Covering(ctx, s, point.Timeline, changelog.SnapshotRevision(meta.Revision), point.ToRevision)
		if err != nil {
			return fmt.Errorf("restore-backup: %w; nothing was queued", err)
		}
		for _, h := range hs {
			seg := plannedSegment{Key: changelog.KeyOf(h), First: h.First, Last: h.Last, Level: h.Level}
			if h.Encryption != nil {
				seg.EncryptionKeyID = h.Encryption.KeyID
			}
			res.Segments = append(res.Segments, seg)
		}
	}
	return o.emit(w, res, func() error {
		fprintf(w, "dry run: restore-backup would restore backup %s (revision %d, taken %s, etcd %s) as a new cluster of %d member(s)",
			name, meta.Revision, dash(res.BackupTime), dash(meta.EtcdVersion), res.MemberCount)
		if point.ToRevision > 0 {
			fprintf(w, ", brought forward to revision %d of timeline %s with %d captured segment(s)", point.ToRevision, point.Timeline, len(res.Segments))
		}
		fprintf(w, "; every write after revision %d would be lost; nothing was queued\n", res.Revision)
		if point.BumpRevision > 0 {
			fprintf(w, "  revisions bumped by %d and marked compacted: watches from before the restore fail and start again\n", point.BumpRevision)
		}
		if res.EncryptionKeyID != "" {
			fprintf(w, "  the backup is encrypted with %s: every node that restores needs that key\n", res.EncryptionKeyID)
		}
		for _, seg := range res.Segments {
			enc := ""
			if seg.EncryptionKeyID != "" {
				enc = ", encrypted with " + seg.EncryptionKeyID
			}
			fprintf(w, "  segment %s: revisions %d to %d (level %d%s)\n", seg.Key, seg.First, seg.Last, seg.Level, enc)
		}
		return nil
	})
}

// nodeTransfers shows, while a restore runs, each node's download of the
// backup as its agent reports it over the peer API: a line when it has
// moved, at most every lineInterval a node. It is best effort: agents it
// cannot reach, or a CA it cannot read, show nothing.
type nodeTransfers struct {
	o      *options
	s      *store.Store
	w      io.Writer
	prefix string
	next   time.Time
	// creds are read once, on the first poll.
	creds     peer.TransportCredentials
	credsRead bool
	shown     map[string]time.Time
	done      map[string]int64
}

// transferPoll is how often nodeTransfers asks the agents.
const transferPoll = 2 * time.Second

func (t *nodeTransfers) poll(ctx context.Context) {
	now := time.Now()
	if now.Before(t.next) {
		return
	}
	t.next = now.Add(transferPoll)
	if !t.credsRead {
		quiet := *t.o
		quiet.stderr = io.Discard
		t.creds, _, _ = quiet.peerCreds(ctx)
		t.credsRead = true
	}
	if t.creds == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, nudgeTimeout)
	defer cancel()
	recs, err := t.o.discoverAgents(ctx, t.s)
	if err != nil {
		return
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	infos := map[string]peer.NodeInfo{}
	seen := map[string]bool{}
	for _, r := range recs {
		if seen[r.Address] {
			continue
		}
		seen[r.Address] = true
		name := t.o.clusterName
		if name == "" {
			name = r.ClusterName
		}
		wg.Go(func() {
			if info, err := askInfo(ctx, r.Address, name, t.creds); err == nil && info.Transfer != nil {
				mu.Lock()
				infos[info.NodeID] = info
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.shown == nil {
		t.shown, t.done = map[string]time.Time{}, map[string]int64{}
	}
	ids := slices.Sorted(maps.Keys(infos))
	for _, id := range ids {
		tr := *infos[id].Transfer
		last, ok := t.done[id]
		whole := tr.Total > 0 && tr.Done >= tr.Total
		if ok && (tr.Done == last || (!whole && now.Sub(t.shown[id]) < lineInterval)) {
			continue
		}
		t.done[id], t.shown[id] = tr.Done, now
		fprintf(t.w, "%snode %s: %s\n", t.prefix, id, describeTransfer(tr, now))
	}
}
