package maintenance

import "github.com/prometheus/client_golang/prometheus"

// compactorMetrics are the compactor's figures.
type compactorMetrics struct {
	revision    prometheus.Gauge
	held        prometheus.Gauge
	overtaken   prometheus.Counter
	compactions *prometheus.CounterVec
}

func newCompactorMetrics(reg prometheus.Registerer) compactorMetrics {
	m := compactorMetrics{
		revision: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_compaction_revision",
			Help: "The revision this agent last compacted etcd to, while it leads etcd."}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_compaction_held_by_capture",
			Help: "1 while continuous capture holds compaction back: the policy asks for more than capture has made durable in the store."}),
		overtaken: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_compaction_overtook_capture_total",
			Help: "Times compaction went past what capture had made durable in the store (capture lagged too long, or the database neared its quota); each is followed by a full backup."}),
		compactions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "etcd_manager_compactions_total",
			Help: "Compactions this agent asked etcd for, by result."}, []string{"result"}),
	}
	reg.MustRegister(m.revision, m.held, m.overtaken, m.compactions)
	return m
}

// setBool sets g to 1 for true, 0 for false.
func setBool(g prometheus.Gauge, v bool) {
	if v {
		g.Set(1)
	} else {
		g.Set(0)
	}
}
