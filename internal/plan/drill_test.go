package plan

import (
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestDrillDue(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	rec := func(at time.Time) *spec.DrillRecord {
		return &spec.DrillRecord{Last: spec.DrillResult{Time: at, Node: "a", Outcome: spec.EventOK}}
	}
	notRun := func(at time.Time) *spec.DrillRecord {
		return &spec.DrillRecord{Last: spec.DrillResult{Time: at, Node: "a", Outcome: spec.DrillNotRun}}
	}
	for _, c := range []struct {
		name                   string
		now                    time.Time
		interval               time.Duration
		rec                    *spec.DrillRecord
		leadSince, lastStarted time.Time
		want                   bool
	}{
		{"off", t0.Add(10 * day), 0, nil, t0, time.Time{}, false},
		{"not leading", t0.Add(10 * day), day, nil, time.Time{}, time.Time{}, false},
		{"no record: an interval after the lead began", t0.Add(day), day, nil, t0, time.Time{}, true},
		{"no record: too soon after the lead began", t0.Add(day - time.Second), day, nil, t0, time.Time{}, false},
		{"the record is older than the interval", t0.Add(time.Hour), day, rec(t0.Add(time.Hour - day)), t0, time.Time{}, true},
		{"the record is recent, though the lead is old", t0.Add(10 * day), day, rec(t0.Add(10*day - time.Hour)), t0, time.Time{}, false},
		{"a stale record read while this agent's drill ran", t0.Add(2 * day), day, rec(t0), t0, t0.Add(2*day - time.Minute), false},
		{"a record from the future counts from the lead", t0.Add(day), day, rec(t0.Add(100 * day)), t0, time.Time{}, true},
		{"a drill that could not run is tried again sooner", t0.Add(time.Hour), day, notRun(t0), t0, t0, true},
		{"but not at once", t0.Add(time.Minute), day, notRun(t0), t0, t0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := DrillDue(c.now, c.interval, c.rec, c.leadSince, c.lastStarted); got != c.want {
				t.Errorf("DrillDue = %v, want %v", got, c.want)
			}
		})
	}
}

// A drill steps aside for whatever needs the leader's disk.
func TestDrillBusy(t *testing.T) {
	restore := Command{ID: "c", Command: spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b"}}}
	for _, c := range []struct {
		name     string
		obs      Observed
		actions  []Action
		activity bool
		busy     bool
	}{
		{"idle", Observed{}, []Action{Report{Msg: "x"}}, false, false},
		{"a restore queued", Observed{Commands: []Command{restore}}, nil, false, true},
		{"a backup due", Observed{}, []Action{TakeBackup{Kind: spec.BackupPeriodic}}, false, true},
		{"a defragmentation", Observed{}, []Action{DefragMember{NodeID: "a"}}, false, true},
		{"a roll between its steps", Observed{}, nil, true, true},
	} {
		if got := DrillBusy(c.obs, c.actions, c.activity) != ""; got != c.busy {
			t.Errorf("%s: busy = %v, want %v", c.name, got, c.busy)
		}
	}
}
