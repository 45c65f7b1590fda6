package plan

import (
	"testing"
	"time"
)

// Since tells how long a condition has held, forgets it once it stops,
// and forgets members that are gone.
func TestSince(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	s := Since{}
	if d := s.Track(1, true, t0); d != 0 {
		t.Errorf("first seen: %s", d)
	}
	if d := s.Track(1, true, t0.Add(time.Minute)); d != time.Minute {
		t.Errorf("a minute on: %s", d)
	}
	if d := s.Track(1, false, t0.Add(2*time.Minute)); d != 0 {
		t.Errorf("no longer holding: %s", d)
	}
	if d := s.Track(1, true, t0.Add(3*time.Minute)); d != 0 {
		t.Errorf("holding again counts afresh: %s", d)
	}
	s.Track(2, true, t0)
	s.Keep([]Member{{ID: 2}})
	if _, ok := s[1]; ok || len(s) != 1 {
		t.Errorf("after Keep: %v", s)
	}
}
