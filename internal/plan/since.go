package plan

import (
	"slices"
	"time"
)

// Since remembers, per etcd member, when a condition was first seen to
// hold, as long as it goes on holding.
type Since map[uint64]time.Time

// Track returns how long the condition has held for member id, 0 when it
// does not hold now.
func (s Since) Track(id uint64, holds bool, now time.Time) time.Duration {
	if !holds {
		delete(s, id)
		return 0
	}
	t, ok := s[id]
	if !ok {
		t = now
		s[id] = now
	}
	return now.Sub(t)
}

// Keep forgets members that are gone.
func (s Since) Keep(members []Member) {
	for id := range s {
		if !slices.ContainsFunc(members, func(m Member) bool { return m.ID == id }) {
			delete(s, id)
		}
	}
}
