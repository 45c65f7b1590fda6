package status

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// Gauges sets the cluster's metrics from each observation: the leader's
// view, or no series on other agents. Create it with NewGauges.
type Gauges struct {
	met gaugeMetrics
	// lastRaftLeader is the raft leader last seen.
	lastRaftLeader uint64
}

// NewGauges returns the gauges, registered with reg.
func NewGauges(reg prometheus.Registerer) *Gauges {
	return &Gauges{met: newGaugeMetrics(reg)}
}

// Set sets the gauges from one observation.
func (g *Gauges) Set(obs plan.Observed) {
	m := g.met
	if l := obs.Self.RaftLeader; l != 0 {
		if g.lastRaftLeader != 0 && l != g.lastRaftLeader {
			m.leaderChanges.Inc()
		}
		g.lastRaftLeader = l
	}
	m.clusterMembers.Reset()
	m.memberLag.Reset()
	m.memberDBSize.Reset()
	m.alarms.Reset()
	c := obs.Cluster
	if c == nil {
		return
	}
	var furthest uint64
	for _, mem := range c.Members {
		furthest = max(furthest, mem.RaftIndex)
	}
	states := map[string]int{"voter": 0, "learner": 0, "unhealthy": 0}
	for _, mem := range c.Members {
		switch {
		case !mem.Healthy:
			states["unhealthy"]++
		case mem.IsLearner:
			states["learner"]++
		default:
			states["voter"]++
		}
		name := mem.Name
		if name == "" {
			name = fmt.Sprintf("%x", mem.ID)
		}
		if mem.Healthy {
			m.memberLag.WithLabelValues(name).Set(float64(furthest - mem.RaftIndex))
			m.memberDBSize.WithLabelValues(name, "total").Set(float64(mem.DBSize))
			m.memberDBSize.WithLabelValues(name, "in_use").Set(float64(mem.DBSizeInUse))
		}
	}
	for state, n := range states {
		m.clusterMembers.WithLabelValues(state).Set(float64(n))
	}
	if c.AlarmsKnown {
		m.alarms.WithLabelValues("NOSPACE").Set(float64(len(c.NoSpace)))
		m.alarms.WithLabelValues("CORRUPT").Set(float64(len(c.Corrupt)))
	}
}
