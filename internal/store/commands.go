package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
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
	// StatusObject is the status written outside any procedure (term 0);
	// a procedure's driver writes _status-<term>.json instead, and readers
	// take the highest term.
	StatusObject = "_status.json"
	// ChoiceObject is a procedure's choice, created once.
	ChoiceObject = "_choice.json"
)

// statusObject is the name of the status written under term.
func statusObject(term int64) string {
	if term == 0 {
		return StatusObject
	}
	return fmt.Sprintf("_status-%020d.json", term)
}

// statusTerm is the term of a status object's name, or -1 for another
// object.
func statusTerm(name string) int64 {
	if name == StatusObject {
		return 0
	}
	n, ok := strings.CutPrefix(name, "_status-")
	if !ok {
		return -1
	}
	n, ok = strings.CutSuffix(n, ".json")
	if !ok {
		return -1
	}
	t, err := strconv.ParseInt(n, 10, 64)
	if err != nil || t <= 0 || t > spec.MaxTerm {
		return -1 // not a status an agent wrote
	}
	return t
}

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
	Newer error
	// Status is the status of the highest term, with the choice applied;
	// StatusTerm is that term, from the object's name (so it is known
	// even when the status is damaged).
	Status     spec.CommandStatus
	StatusTerm int64
	// Choice is the procedure's choice, nil before one was made.
	Choice *spec.Choice
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
	cmd.Format = cmd.NeededFormat()
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
		switch {
		case errors.Is(err, ErrNotFound):
			continue // a leftover status, or a command deleted meanwhile
		case errors.Is(err, ErrUnreachable):
			return nil, err
		case err != nil:
			// One object that cannot be read is that command's problem,
			// not the whole queue's: the leader marks it failed.
			q.Err = err
		}
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ReadCommand reads one command, the status of the highest term and the
// procedure's choice. A missing command wraps ErrNotFound; a junk one is
// returned with Err set, as is one whose status or choice is damaged.
func (s *Store) ReadCommand(ctx context.Context, id string) (QueuedCommand, error) {
	q := QueuedCommand{ID: id, Status: spec.CommandStatus{State: spec.CommandPending}}
	data, err := s.ReadMax(ctx, q.Key(CommandObject), MaxCommandSize)
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
	objects, err := s.List(ctx, CommandPrefix+id+"/", "")
	if err != nil {
		return q, err
	}
	statusKey, best, hasChoice := "", int64(-1), false
	for _, key := range objects {
		name := strings.TrimPrefix(key, CommandPrefix+id+"/")
		if t := statusTerm(name); t > best {
			statusKey, best = key, t
		}
		hasChoice = hasChoice || name == ChoiceObject
	}
	if statusKey != "" {
		q.StatusTerm = best
		if err := s.readStatus(ctx, &q, statusKey, best); err != nil {
			return q, err
		}
	}
	if hasChoice {
		data, err := s.ReadMax(ctx, q.Key(ChoiceObject), MaxStatusSize)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return q, err
		default:
			c, err := spec.DecodeChoice(data)
			switch {
			case errors.Is(err, spec.ErrNewerFormat):
				q.Newer = fmt.Errorf("%s: %w", q.Key(ChoiceObject), err)
			case err != nil:
				q.Err = fmt.Errorf("%s: %w", q.Key(ChoiceObject), err)
			default:
				q.Choice = &c
				c.Apply(&q.Status)
			}
		}
	}
	return q, nil
}

// readStatus reads the status object at key, written under term.
func (s *Store) readStatus(ctx context.Context, q *QueuedCommand, key string, term int64) error {
	data, err := s.ReadMax(ctx, key, MaxStatusSize)
	if errors.Is(err, ErrNotFound) {
		return nil // deleted meanwhile
	}
	if err != nil {
		return err
	}
	st, err := spec.DecodeCommandStatus(data)
	switch {
	case errors.Is(err, spec.ErrNewerFormat):
		q.Newer = fmt.Errorf("%s: %w", key, err)
	case err != nil:
		// A damaged status is an error for its command, which the leader
		// marks failed; a restore cannot go on from it.
		q.Err = fmt.Errorf("%s: %w", key, err)
		st = spec.CommandStatus{State: spec.CommandPending, Message: err.Error()}
	case st.Term != term:
		q.Err = fmt.Errorf("%s: the status says term %d, its name term %d", key, st.Term, term)
	}
	q.Status = st
	return nil
}

// SetCommandStatus records the leader's progress on a command outside any
// procedure (a backup-now, a junk command marked failed).
func (s *Store) SetCommandStatus(ctx context.Context, id string, st spec.CommandStatus, now time.Time) error {
	return s.SetCommandStatusAt(ctx, id, 0, st, now)
}

// SetCommandStatusAt records a procedure driver's progress under its
// fencing term. Each term has an object of its own, so a stale driver's
// late write lands in its own, older object, which readers ignore.
func (s *Store) SetCommandStatusAt(ctx context.Context, id string, term int64, st spec.CommandStatus, now time.Time) error {
	if !validID(id) {
		return fmt.Errorf("%w: %q is not a command ID", ErrNotFound, id)
	}
	st.Updated = spec.Int64(now.UnixNano())
	st.Format = spec.FormatBase
	st.Term = term
	data, err := jsonLine(st)
	if err != nil {
		return err
	}
	return s.Write(ctx, CommandPrefix+id+"/"+statusObject(term), data)
}

// CreateChoice records a procedure's choice once. If a choice is there
// already (another driver's, or this one's before a crash), it is
// returned instead, and that is the one to act on.
func (s *Store) CreateChoice(ctx context.Context, id string, c spec.Choice) (spec.Choice, error) {
	if !validID(id) {
		return c, fmt.Errorf("%w: %q is not a command ID", ErrNotFound, id)
	}
	c.Format = spec.FormatBase
	data, err := jsonLine(c)
	if err != nil {
		return c, err
	}
	key := CommandPrefix + id + "/" + ChoiceObject
	err = s.Create(ctx, key, data)
	if !errors.Is(err, ErrExists) {
		return c, err
	}
	data, err = s.ReadMax(ctx, key, MaxStatusSize)
	if err != nil {
		return c, err
	}
	existing, err := spec.DecodeChoice(data)
	if err != nil {
		return c, fmt.Errorf("store: %s in %s: %w", key, s.url, err)
	}
	return existing, nil
}

// DeleteCommand removes a command from the queue: the command first, so
// that it is gone even if removing the rest fails, then its statuses and
// choice. A command that is not there wraps ErrNotFound.
func (s *Store) DeleteCommand(ctx context.Context, id string) error {
	if !validID(id) {
		return fmt.Errorf("%w: %q is not a command ID", ErrNotFound, id)
	}
	key := CommandPrefix + id + "/" + CommandObject
	if _, err := s.ModTime(ctx, key); err != nil {
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("%w: no command %s in %s", ErrNotFound, id, s.url)
		}
		return err
	}
	if err := s.Delete(ctx, key); err != nil {
		return err
	}
	rest, err := s.List(ctx, CommandPrefix+id+"/", "")
	if err != nil {
		return err
	}
	for _, k := range rest {
		if err := s.Delete(ctx, k); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

// validID reports whether id can name a command: one path element, not
// a reserved prefix.
func validID(id string) bool {
	return id != "" && !strings.Contains(id, "/") && !isReserved(CommandPrefix+id+"/")
}

func isReserved(dir string) bool {
	for _, r := range reservedControl {
		if dir == r {
			return true
		}
	}
	return false
}
