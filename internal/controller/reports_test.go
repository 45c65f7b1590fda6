package controller

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/plan"
)

func TestInfoOnce(t *testing.T) {
	window := plan.Report{Level: slog.LevelInfo, Msg: "defragmentation is due and waits for its maintenance window"}
	gate := plan.Report{Level: slog.LevelInfo, Msg: "a CA rotation waits for the operator"}
	lock := plan.Report{Level: slog.LevelWarn, Msg: "the store lock is held elsewhere"}
	// Each cycle's reports, and which of them are logged.
	cycles := []struct {
		reports []plan.Report
		logged  []string
	}{
		{[]plan.Report{gate, window}, []string{gate.Msg, window.Msg}},
		// Two info reports side by side stay quiet while they last, and
		// a warning beside them is logged every cycle.
		{[]plan.Report{gate, window, lock}, []string{lock.Msg}},
		{[]plan.Report{gate, window, lock}, []string{lock.Msg}},
		// One goes for a cycle: it is said again when it comes back.
		{[]plan.Report{window}, nil},
		{[]plan.Report{gate, window}, []string{gate.Msg}},
		// The same message twice in a cycle is said once.
		{[]plan.Report{}, nil},
		{[]plan.Report{window, window}, []string{window.Msg}},
	}
	var o infoOnce
	for i, c := range cycles {
		o.cycle()
		var got []string
		for _, r := range c.reports {
			if o.first(r) {
				got = append(got, r.Msg)
			}
		}
		if !slices.Equal(got, c.logged) {
			t.Errorf("cycle %d: logged %q, want %q", i, got, c.logged)
		}
	}
}
