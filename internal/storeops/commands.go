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
			Age: now.Sub(time.Unix(0, at))})
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
