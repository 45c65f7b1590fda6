package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// The event history: events/<20-digit Unix nanoseconds>-<node>.json, one
// small object per event, written once; the leader prunes the oldest.
const EventPrefix = "events/"

// Event history bounds.
const (
	// MaxEvents is how many events the history keeps, and the most a
	// listing reads.
	MaxEvents = 1000
	// EventMaxAge is how long an event is kept.
	EventMaxAge = 30 * 24 * time.Hour
)

// eventKey is the key of an event at t recorded by node, whose ID is kept
// to the characters of a cluster token.
func eventKey(t time.Time, node string) string {
	clean := []byte(spec.Clip(node, 64))
	for i, c := range clean {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			clean[i] = '_'
		}
	}
	return fmt.Sprintf("%s%020d-%s.json", EventPrefix, t.UnixNano(), clean)
}

// eventTime is the time in an event key's name, false for another key.
func eventTime(key string) (time.Time, bool) {
	name, ok := strings.CutPrefix(key, EventPrefix)
	if !ok || len(name) < 21 || name[20] != '-' || !strings.HasSuffix(name, ".json") {
		return time.Time{}, false
	}
	ns, err := strconv.ParseInt(name[:20], 10, 64)
	if err != nil || ns <= 0 {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// AddEvent records an event, its message clipped to spec.MaxEventMessage.
// Two events of one node at the same nanosecond both stay.
func (s *Store) AddEvent(ctx context.Context, e spec.Event) error {
	e.Message = spec.Clip(e.Message, spec.MaxEventMessage)
	e.Action = spec.Clip(e.Action, spec.MaxEventAction)
	if err := e.Validate(); err != nil {
		return err
	}
	data, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	at := e.Time
	for range 3 {
		err = s.Create(ctx, eventKey(at, e.Node), data)
		if !errors.Is(err, ErrExists) {
			return err
		}
		at = at.Add(time.Nanosecond)
	}
	return err
}

// EventProblem is an event object that could not be read.
type EventProblem struct {
	Key string
	Err error
}

// ListEvents reads the events at or after since, oldest first: the
// newest MaxEvents of them at most. Objects that cannot be read are
// returned apart, by key, and the rest still are.
func (s *Store) ListEvents(ctx context.Context, since time.Time) ([]spec.Event, []EventProblem, error) {
	keys, err := s.eventKeys(ctx)
	if err != nil {
		return nil, nil, err
	}
	first := slices.IndexFunc(keys, func(k string) bool {
		t, _ := eventTime(k)
		return !t.Before(since)
	})
	if first < 0 {
		return nil, nil, nil
	}
	return s.readEvents(ctx, newest(keys[first:], MaxEvents))
}

// RecentEvents reads the newest n events, oldest first, as ListEvents
// does: it reads only their objects.
func (s *Store) RecentEvents(ctx context.Context, n int) ([]spec.Event, []EventProblem, error) {
	keys, err := s.eventKeys(ctx)
	if err != nil {
		return nil, nil, err
	}
	return s.readEvents(ctx, newest(keys, n))
}

// eventKeys are the keys of the event objects, oldest first: the names'
// numbers have one width, so their order is the events'.
func (s *Store) eventKeys(ctx context.Context) ([]string, error) {
	keys, err := s.List(ctx, EventPrefix, "")
	if err != nil {
		return nil, err
	}
	events := slices.DeleteFunc(keys, func(k string) bool {
		_, ok := eventTime(k)
		return !ok
	})
	sort.Strings(events)
	return events, nil
}

// newest are the last n of keys.
func newest(keys []string, n int) []string {
	return keys[max(len(keys)-n, 0):]
}

// readEvents reads the event objects keys, passing over those gone.
func (s *Store) readEvents(ctx context.Context, keys []string) ([]spec.Event, []EventProblem, error) {
	var events []spec.Event
	var problems []EventProblem
	for _, k := range keys {
		data, err := s.ReadMax(ctx, k, spec.MaxEventSize)
		if errors.Is(err, ErrNotFound) {
			continue // pruned meanwhile
		}
		if err == nil {
			var e spec.Event
			if e, err = spec.DecodeEvent(data); err == nil {
				events = append(events, e)
				continue
			}
		}
		problems = append(problems, EventProblem{Key: k, Err: err})
	}
	return events, problems, nil
}

// PruneEvents deletes the events older than maxAge before now, and the
// oldest beyond the newest keep. It returns how many it deleted.
func (s *Store) PruneEvents(ctx context.Context, now time.Time, keep int, maxAge time.Duration) (int, error) {
	events, err := s.eventKeys(ctx)
	if err != nil {
		return 0, err
	}
	removed := 0
	for i, k := range events {
		t, _ := eventTime(k)
		if len(events)-i <= keep && now.Sub(t) <= maxAge {
			break
		}
		if err := s.Delete(ctx, k); err != nil && !errors.Is(err, ErrNotFound) {
			return removed, err
		}
		removed++
	}
	return removed, nil
}
