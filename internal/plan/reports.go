package plan

import "log/slog"

// ReportsOnce says which of a plan's reports to log: every warning and
// error, and an info-level report only when the cycle before did not
// reach it, so that a state that lasts (a shut maintenance window, a
// gate) is said once however many other reports come and go beside it.
type ReportsOnce struct{ last, cur map[string]bool }

// Cycle starts a cycle.
func (o *ReportsOnce) Cycle() { o.last, o.cur = o.cur, map[string]bool{} }

// First reports whether r is to be logged, and notes it as reached.
func (o *ReportsOnce) First(r Report) bool {
	if r.Level > slog.LevelInfo {
		return true
	}
	if o.cur == nil {
		o.cur = map[string]bool{}
	}
	log := !o.last[r.Msg] && !o.cur[r.Msg]
	o.cur[r.Msg] = true
	return log
}
