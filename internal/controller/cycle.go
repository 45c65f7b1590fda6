package controller

import (
	"fmt"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/status"
)

// Cycle is one round of the loop as its observers see it: what it
// observed, what the planner decided, and what came of each action it
// carried out. The loop publishes each round twice: once planned, before
// any action runs (Done false, no Results), so that what a long action
// does shows while it runs; and once the round ended, early or not (Done
// true).
type Cycle struct {
	Observed plan.Observed
	// Actions are the planner's, reports included.
	Actions []plan.Action
	// Results are the actions carried out, in order. A round stops at
	// the first action that fails, waits or changes something, so the
	// actions after it have none.
	Results []Result
	// Done is set on the publication at the round's end.
	Done bool
	// Facts are what the status page shows beside the observation: the
	// store's newest backup, restorable point and drills as last read,
	// and the warnings of this round's plan.
	Facts status.Facts
}

// Result is what came of one action.
type Result struct {
	Action plan.Action
	// Err is nil for an action done; procedure.ErrWait for one that must
	// wait.
	Err error
}

// Observer receives each cycle, on the loop's goroutine: it must return
// promptly and must not keep the cycle's slices.
type Observer func(Cycle)

// publishCycle hands the round to the observers. An observer that
// panics is logged and the others still run: they show the cycle, they
// never steer it.
func (lp *loop) publishCycle(obs plan.Observed, at time.Time, actions []plan.Action, results []Result, done bool) {
	if len(lp.env.Observers) == 0 {
		return
	}
	defer func() {
		// The round's end is published after the loop's own recover.
		if r := recover(); r != nil {
			lp.met.panics.Inc()
			lp.log.Error("publishing a cycle panicked; recovered", "panic", fmt.Sprint(r))
		}
	}()
	c := Cycle{Observed: obs, Actions: actions, Results: results, Done: done, Facts: status.Facts{
		Cluster: lp.cfg.ClusterName, Node: lp.node.ID(), Now: at, Procedure: plan.ActiveProcedure(obs),
		Warnings: plan.StatusLines(actions), Newest: lp.newestBackup(), Restorable: lp.restorable, Drills: lp.drillRecord,
	}}
	for _, o := range lp.env.Observers {
		func() {
			defer func() {
				if r := recover(); r != nil {
					lp.met.panics.Inc()
					lp.log.Error("a cycle observer panicked; recovered", "panic", fmt.Sprint(r))
				}
			}()
			o(c)
		}()
	}
}

// newestBackup is the newest backup the store's figures read, or the one
// this agent took since, if that is newer.
func (lp *loop) newestBackup() *backup.Info {
	taken := lp.lastTaken.Load()
	if taken == nil || (lp.newestStored != nil && lp.newestStored.Name >= taken.Name) {
		return lp.newestStored
	}
	return taken
}
