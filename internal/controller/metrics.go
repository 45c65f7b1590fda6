package controller

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the loop's Prometheus metrics; the agent serves them, with
// its own, on --metrics-address.
type metrics struct {
	leader           prometheus.Gauge
	etcdHealthy      prometheus.Gauge
	etcdRevision     prometheus.Gauge
	actionsPerformed *prometheus.CounterVec
	backingOff       prometheus.Gauge
	panics           prometheus.Counter
	// NOSPACE recoveries by this agent as leader.
	noSpaceRecoveries prometheus.Counter
	// Corruption: the members rebuilt.
	corruptDiscarded prometheus.Counter
	// The agent's own view.
	loopCycles prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_leader",
			Help: "1 while this agent acts as the manager leader."}),
		etcdRevision: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_etcd_revision",
			Help: "The revision this node's etcd last reported while it answered: with etcd_manager_capture_durable_revision, how far capture is behind."}),
		etcdHealthy: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_etcd_healthy",
			Help: "1 while the local etcd answers."}),
		actionsPerformed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "etcd_manager_actions_total",
			Help: "Actions performed, by kind and result."}, []string{"action", "result"}),
		backingOff: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_actions_backing_off",
			Help: "Cluster changes of the leader that failed and have not succeeded since; each backs off (up to 5 minutes) while the rest of its work goes on, and is forgotten once not tried for 10 minutes."}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_loop_panics_total",
			Help: "Control-loop cycles that panicked and were recovered; each is a bug to report."}),
		noSpaceRecoveries: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_nospace_recoveries_total",
			Help: "NOSPACE alarms this agent disarmed as leader, once compaction and defragmentation left every database well under the quota."}),
		corruptDiscarded: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_corrupt_members_discarded_total",
			Help: "Members whose data disagreed with the majority's, set aside by this agent as leader to be rebuilt from their peers."}),
		loopCycles: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_loop_cycles_total",
			Help: "Cycles of the agent's control loop (observe, plan, act)."}),
	}
	reg.MustRegister(m.loopCycles)
	reg.MustRegister(m.corruptDiscarded, m.noSpaceRecoveries, m.leader, m.etcdHealthy, m.etcdRevision,
		m.actionsPerformed, m.backingOff, m.panics)
	return m
}

func boolGauge(g prometheus.Gauge, v bool) {
	if v {
		g.Set(1)
	} else {
		g.Set(0)
	}
}
