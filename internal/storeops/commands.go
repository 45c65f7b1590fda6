package storeops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// ReadCommands reads the command queue for the planner, each command
// with its age at now.
func ReadCommands(ctx context.Context, s *store.Store, now time.Time) ([]plan.Command, error) {
	qs, err := s.ListCommands(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]plan.Command, 0, len(qs))
	for _, q := range qs {
		at := int64(q.Status.Updated)
		if at == 0 {
			at = int64(q.Command.Timestamp)
		}
		out = append(out, plan.Command{ID: q.ID, Command: q.Command, Err: q.Err, Newer: q.Newer, Status: q.Status, StatusTerm: q.StatusTerm,
			Age: now.Sub(time.Unix(0, at)), Expired: q.Command.Expires != 0 && now.UnixNano() > int64(q.Command.Expires)})
	}
	return out, nil
}

// RunCommandAction performs the queue's bookkeeping actions
// (plan.FailCommand, plan.ForgetCommand).
func RunCommandAction(ctx context.Context, s *store.Store, now time.Time, log *slog.Logger, act plan.Action) error {
	switch act := act.(type) {
	case plan.FailCommand:
		log.Error("queued command failed", "command", act.ID, "reason", act.Reason)
		// Under the term of the status it replaces: a failure below it
		// would go unseen, and be planned again every cycle.
		return s.SetCommandStatusAt(ctx, act.ID, act.Term, spec.CommandStatus{State: spec.CommandFailed, Message: act.Reason}, now)
	case plan.ForgetCommand:
		err := s.DeleteCommand(ctx, act.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	}
	return fmt.Errorf("storeops: not a command action: %T", act)
}

// ErrExclusivePending is the error of CheckNoneExclusive.
var ErrExclusivePending = errors.New("storeops: a command that replaces the cluster is not finished")

// CheckNoneExclusive refuses, naming it, a restore, dump-restore or
// recover-quorum command in the queue that is neither finished nor
// expired before it started: another such command queued behind it
// would replace the cluster again once it is done.
func CheckNoneExclusive(ctx context.Context, s *store.Store, now time.Time) error {
	cmds, err := ReadCommands(ctx, s, now)
	if err != nil {
		return err
	}
	c := plan.ActiveExclusive(cmds)
	if c == nil {
		return nil
	}
	state := c.Status.State
	if p := c.Status.Restore; p != nil && p.Phase != "" {
		state += ", phase " + p.Phase
	}
	return fmt.Errorf("%w: command %s, a %s queued %s, is %s; wait for it (list-commands), or remove it with delete-command %s if it is not wanted, then queue again",
		ErrExclusivePending, c.ID, c.Command.Kind(), time.Unix(0, int64(c.Command.Timestamp)).UTC().Format(time.RFC3339), state, c.ID)
}
