package drill

import "github.com/prometheus/client_golang/prometheus"

// metrics are the drills this agent ran.
type metrics struct {
	drills *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		drills: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "etcd_manager_restore_drills_total",
			Help: "Restore drills this agent ran as leader, by result: ok, failed (the backup did not restore as its meta says), not_run (the drill could not run: no room, the store away)."}, []string{"result"}),
	}
	reg.MustRegister(m.drills)
	return m
}
