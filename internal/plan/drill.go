package plan

import (
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// DrillRetry is the wait after a restore drill that could not run, when
// it is shorter than the interval.
const DrillRetry = 30 * time.Minute

// DrillDue reports whether a drill is due: interval after the last one
// recorded (DrillRetry, when shorter, after one that could not run), or,
// before any, interval after this agent began to lead; and as long after
// this agent last started one, whatever the record it read says. A
// recorded time in the future (another agent's clock, or junk) counts
// from the lead instead.
func DrillDue(now time.Time, interval time.Duration, rec *spec.DrillRecord, leadSince, lastStarted time.Time) bool {
	if interval <= 0 || leadSince.IsZero() {
		return false
	}
	base, wait := leadSince, interval
	if rec != nil && !rec.Last.Time.After(now) {
		base = rec.Last.Time
		if rec.Last.Outcome == spec.DrillNotRun {
			wait = min(interval, DrillRetry)
		}
	}
	if lastStarted.After(base) {
		base = lastStarted
	}
	return now.Sub(base) >= wait
}

// DrillBusy says why no drill may run now ("" when one may): a drill
// shares the leader's disk with what these need.
func DrillBusy(obs Observed, actions []Action, activity bool) string {
	if ActiveExclusive(obs.Commands) != nil {
		return "a restore or recovery is queued"
	}
	if proc, _ := Activity(actions); proc != "" || activity {
		return "the members are being rolled or defragmented"
	}
	for _, act := range actions {
		if _, ok := act.(TakeBackup); ok {
			return "a backup is due"
		}
	}
	return ""
}
