package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestEventHistory(t *testing.T) {
	s, _ := openTemp(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	for i := range 5 {
		e := spec.Event{Time: t0.Add(time.Duration(i) * time.Minute), Node: "node/../a\x1b", Action: "add-member b", Outcome: spec.EventOK}
		if err := s.AddEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// The same node at the same nanosecond: both stay.
	same := spec.Event{Time: t0, Node: "n2", Action: "backup periodic", Outcome: spec.EventFailed, Message: strings.Repeat("x", 5000), Count: 3, Since: t0.Add(-time.Hour)}
	for range 2 {
		if err := s.AddEvent(ctx, same); err != nil {
			t.Fatal(err)
		}
	}
	// An event of no use is refused before it is written.
	if err := s.AddEvent(ctx, spec.Event{Time: t0, Node: "n", Action: "x", Outcome: "maybe"}); !errors.Is(err, spec.ErrBadEvent) {
		t.Errorf("a bad outcome: %v", err)
	}
	// Junk in the store is named and passed over; other keys are not events.
	if err := s.Write(ctx, eventKey(t0.Add(10*time.Minute), "evil"), []byte(`{"time":"2026-11-24T12:10:00Z","node":"e","action":"a","outcome":"pwned"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, eventKey(t0.Add(11*time.Minute), "big"), make([]byte, spec.MaxEventSize+1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, EventPrefix+"README", []byte("not an event")); err != nil {
		t.Fatal(err)
	}

	events, problems, err := s.ListEvents(ctx, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 4 || !events[0].Time.Equal(t0.Add(time.Minute)) || !events[3].Time.Equal(t0.Add(4*time.Minute)) {
		t.Fatalf("events since t0+1m: %+v", events)
	}
	if len(problems) != 2 || !errors.Is(problems[0].Err, spec.ErrBadEvent) || !strings.Contains(problems[1].Err.Error(), "too large") {
		t.Fatalf("problems: %+v", problems)
	}
	all, _, _ := s.ListEvents(ctx, time.Time{})
	var long *spec.Event
	for i := range all {
		if all[i].Node == "n2" {
			long = &all[i]
		}
	}
	if len(all) != 7 || long == nil || len(long.Message) > spec.MaxEventMessage || long.Count != 3 {
		t.Fatalf("all events: %d, the long one %+v", len(all), long)
	}

	// Prune: older than a day, and beyond the newest 4.
	removed, err := s.PruneEvents(ctx, t0.Add(5*time.Minute), 4, 24*time.Hour)
	if err != nil || removed != 5 {
		t.Fatalf("pruned %d, %v; want 5 (9 events, keep 4)", removed, err)
	}
	removed, err = s.PruneEvents(ctx, t0.Add(48*time.Hour), 100, 24*time.Hour)
	if err != nil || removed != 4 {
		t.Fatalf("pruned %d, %v; want the 4 older than a day", removed, err)
	}
	if keys, _ := s.List(ctx, EventPrefix, ""); len(keys) != 1 || keys[0] != EventPrefix+"README" {
		t.Errorf("left: %v", keys)
	}
}
