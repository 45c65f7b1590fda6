package backupagent

import "github.com/prometheus/client_golang/prometheus"

// metrics are the backup agent's own: whether it holds the store lock,
// and the actions it performed. The backups' figures are status.Figures',
// and capture's its own.
type metrics struct {
	leader  prometheus.Gauge
	actions *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_leader",
			Help: "1 while this agent acts as the manager leader."}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "etcd_manager_actions_total",
			Help: "Actions performed, by kind and result."}, []string{"action", "result"}),
	}
	reg.MustRegister(m.leader, m.actions)
	return m
}

// setLeader says whether this agent holds the store lock.
func (m *metrics) setLeader(held bool) {
	v := 0.0
	if held {
		v = 1
	}
	m.leader.Set(v)
}
