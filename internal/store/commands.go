package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// The command queue: control/<RFC3339 UTC>-<6-digit seq>/_command.json,
// written once by whoever queues the command, and _status.json beside it,
// written by the leader as it works.
const (
	CommandPrefix = "control/"
	CommandObject = "_command.json"
	StatusObject  = "_status.json"
)

// reservedControl are the prefixes under control/ that hold no commands.
var reservedControl = []string{"control/leader/"}

// QueuedCommand is one command in the queue.
type QueuedCommand struct {
	ID      string
	Command spec.Command
	// Err is set when _command.json cannot be parsed or is not a valid
	// command: junk in the queue, which the leader marks failed.
	Err error
	// Newer is set when the command or its status was written by a newer
	// etcd-manager (it wraps spec.ErrNewerFormat): agents wait rather than
	// act on it.
	Newer  error
	Status spec.CommandStatus
}

// Key returns the key of an object of the command.
func (q QueuedCommand) Key(object string) string { return CommandPrefix + q.ID + "/" + object }

// AddCommand queues cmd under a new ID, <now, RFC3339 UTC>-<seq>, and
// returns the ID. Concurrent callers get distinct IDs.
func (s *Store) AddCommand(ctx context.Context, cmd spec.Command, now time.Time) (string, error) {
	if err := cmd.Validate(); err != nil {
		return "", fmt.Errorf("store: %w", err)
	}
	cmd.Timestamp = spec.Int64(now.UnixNano())
	cmd.Format = spec.FormatVersion
	data, err := jsonLine(cmd)
	if err != nil {
		return "", err
	}
	stamp := now.UTC().Format("2006-01-02T15:04:05Z")
	existing, err := s.List(ctx, CommandPrefix+stamp, "/")
	if err != nil {
		return "", err
	}
	seq := len(existing)
	for range 1000 {
		seq++
		id := fmt.Sprintf("%s-%06d", stamp, seq)
		err := s.Create(ctx, CommandPrefix+id+"/"+CommandObject, data)
		if errors.Is(err, ErrExists) {
			continue
		}
		if err != nil {
			return "", err
		}
		return id, nil
	}
	return "", fmt.Errorf("store: no free command ID in %s", stamp)
}

// ListCommands returns the queued commands, oldest first. A command whose
// _command.json is junk is returned with Err set, never dropped: the
// operator must see it.
func (s *Store) ListCommands(ctx context.Context) ([]QueuedCommand, error) {
	dirs, err := s.List(ctx, CommandPrefix, "/")
	if err != nil {
		return nil, err
	}
	var out []QueuedCommand
	for _, dir := range dirs {
		if !strings.HasSuffix(dir, "/") || isReserved(dir) {
			continue
		}
		id := strings.TrimSuffix(strings.TrimPrefix(dir, CommandPrefix), "/")
		q, err := s.ReadCommand(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue // a leftover status, or a command deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ReadCommand reads one command and its status. A missing command wraps
// ErrNotFound; a junk one is returned with Err set.
func (s *Store) ReadCommand(ctx context.Context, id string) (QueuedCommand, error) {
	q := QueuedCommand{ID: id, Status: spec.CommandStatus{State: spec.CommandPending}}
	data, err := s.Read(ctx, q.Key(CommandObject))
	if err != nil {
		return q, err
	}
	q.Command, q.Err = spec.DecodeCommand(data)
	if errors.Is(q.Err, spec.ErrNewerFormat) {
		q.Newer, q.Err = fmt.Errorf("%s: %w", q.Key(CommandObject), q.Err), nil
	}
	if q.Err != nil {
		q.Err = fmt.Errorf("%s: %w", q.Key(CommandObject), q.Err)
	}
	data, err = s.Read(ctx, q.Key(StatusObject))
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return q, err
	default:
		st, err := spec.DecodeCommandStatus(data)
		if errors.Is(err, spec.ErrNewerFormat) {
			q.Newer = fmt.Errorf("%s: %w", q.Key(StatusObject), err)
			err = nil
		}
		if err != nil {
			// Only the leader writes it; a bad one is rewritten on its
			// next step. Show it rather than hide the command.
			st = spec.CommandStatus{State: spec.CommandPending, Message: err.Error()}
		}
		q.Status = st
	}
	return q, nil
}

// SetCommandStatus records the leader's progress on a command.
func (s *Store) SetCommandStatus(ctx context.Context, id string, st spec.CommandStatus, now time.Time) error {
	st.Updated = spec.Int64(now.UnixNano())
	st.Format = spec.FormatVersion
	data, err := jsonLine(st)
	if err != nil {
		return err
	}
	return s.Write(ctx, CommandPrefix+id+"/"+StatusObject, data)
}

// DeleteCommand removes a command from the queue: the command first, so
// that it is gone even if removing its status fails. A command that is not
// there wraps ErrNotFound.
func (s *Store) DeleteCommand(ctx context.Context, id string) error {
	if id == "" || strings.Contains(id, "/") || isReserved(CommandPrefix+id+"/") {
		return fmt.Errorf("%w: %q is not a command ID", ErrNotFound, id)
	}
	key := CommandPrefix + id + "/" + CommandObject
	if _, err := s.Read(ctx, key); err != nil {
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("%w: no command %s in %s", ErrNotFound, id, s.url)
		}
		return err
	}
	if err := s.Delete(ctx, key); err != nil {
		return err
	}
	return s.Delete(ctx, CommandPrefix+id+"/"+StatusObject)
}

func isReserved(dir string) bool {
	for _, r := range reservedControl {
		if dir == r {
			return true
		}
	}
	return false
}
