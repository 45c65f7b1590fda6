package spec

import (
	"testing"
	"time"
)

// Failing keeps a failed drill failing until one passes: a drill that
// could not run says nothing of the backup.
func TestDrillFailing(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	at := func(h int, outcome string) *DrillResult {
		return &DrillResult{Time: t0.Add(time.Duration(h) * time.Hour), Node: "a", Outcome: outcome}
	}
	for _, tt := range []struct {
		name string
		rec  DrillRecord
		want *DrillResult
	}{
		{name: "passed", rec: DrillRecord{Last: *at(1, EventOK), LastPassed: at(1, EventOK)}},
		{name: "failed", rec: DrillRecord{Last: *at(2, EventFailed), LastPassed: at(1, EventOK), LastFailed: at(2, EventFailed)},
			want: at(2, EventFailed)},
		{name: "failed, then could not run", rec: DrillRecord{Last: *at(3, DrillNotRun), LastPassed: at(1, EventOK), LastFailed: at(2, EventFailed)},
			want: at(2, EventFailed)},
		{name: "failed, then passed", rec: DrillRecord{Last: *at(3, EventOK), LastPassed: at(3, EventOK), LastFailed: at(2, EventFailed)}},
		{name: "failed, never passed", rec: DrillRecord{Last: *at(3, DrillNotRun), LastFailed: at(2, EventFailed)},
			want: at(2, EventFailed)},
		{name: "a record from before lastFailed", rec: DrillRecord{Last: *at(2, EventFailed), LastPassed: at(1, EventOK)},
			want: at(2, EventFailed)},
		{name: "could not run only", rec: DrillRecord{Last: *at(2, DrillNotRun)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.rec.Validate(); err != nil {
				t.Fatal(err)
			}
			got := tt.rec.Failing()
			if (got == nil) != (tt.want == nil) || (got != nil && !got.Time.Equal(tt.want.Time)) {
				t.Errorf("Failing() = %+v, want %+v", got, tt.want)
			}
		})
	}
	bad := DrillRecord{Last: *at(1, EventOK), LastFailed: at(1, EventOK)}
	if err := bad.Validate(); err == nil {
		t.Error("a last failed drill that passed is valid")
	}
}
