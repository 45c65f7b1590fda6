package plan

import (
	"log/slog"
	"slices"
	"testing"
)

func TestInfoOnce(t *testing.T) {
	window := Report{Level: slog.LevelInfo, Msg: "defragmentation is due and waits for its maintenance window"}
	gate := Report{Level: slog.LevelInfo, Msg: "a CA rotation waits for the operator"}
	lock := Report{Level: slog.LevelWarn, Msg: "the store lock is held elsewhere"}
	// Each cycle's reports, and which of them are logged.
	cycles := []struct {
		reports []Report
		logged  []string
	}{
		{[]Report{gate, window}, []string{gate.Msg, window.Msg}},
		// Two info reports side by side stay quiet while they last, and
		// a warning beside them is logged every cycle.
		{[]Report{gate, window, lock}, []string{lock.Msg}},
		{[]Report{gate, window, lock}, []string{lock.Msg}},
		// One goes for a cycle: it is said again when it comes back.
		{[]Report{window}, nil},
		{[]Report{gate, window}, []string{gate.Msg}},
		// The same message twice in a cycle is said once.
		{[]Report{}, nil},
		{[]Report{window, window}, []string{window.Msg}},
	}
	var o ReportsOnce
	for i, c := range cycles {
		o.Cycle()
		var got []string
		for _, r := range c.reports {
			if o.First(r) {
				got = append(got, r.Msg)
			}
		}
		if !slices.Equal(got, c.logged) {
			t.Errorf("cycle %d: logged %q, want %q", i, got, c.logged)
		}
	}
}
