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

// defragMetrics are the leader's defragmentations.
type defragMetrics struct {
	defrags       *prometheus.CounterVec
	lastOK        prometheus.Gauge
	lastDuration  prometheus.Gauge
	lastReclaimed prometheus.Gauge
}

func newDefragMetrics(reg prometheus.Registerer) defragMetrics {
	m := defragMetrics{
		defrags: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "etcd_manager_defrags_total",
			Help: "Members this agent defragmented as leader, by result."}, []string{"result"}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_defrag_last_success_timestamp_seconds",
			Help: "Unix time this agent last defragmented a member."}),
		lastDuration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_defrag_last_duration_seconds",
			Help: "How long the last defragmentation took (the member's clients stall, or fail over, meanwhile)."}),
		lastReclaimed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_defrag_last_reclaimed_bytes",
			Help: "How much the last defragmentation shrank the member's database."}),
	}
	// Counters start at 0 for each result, so that the first defrag
	// shows as an increase.
	for _, r := range []string{"success", "failure"} {
		m.defrags.WithLabelValues(r)
	}
	reg.MustRegister(m.defrags, m.lastOK, m.lastDuration, m.lastReclaimed)
	return m
}

// hashMetrics are the leader's HashKV comparisons.
type hashMetrics struct {
	checks       *prometheus.CounterVec
	lastAgree    prometheus.Gauge
	disagreement prometheus.Gauge
}

func newHashMetrics(reg prometheus.Registerer) hashMetrics {
	m := hashMetrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "etcd_manager_hash_checks_total",
			Help: "Comparisons of the voting members' HashKV at one revision by this agent as leader, by outcome: agree, mismatch (a member's data differs), inconclusive (a member did not answer, or a compaction came between)."}, []string{"outcome"}),
		lastAgree: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_hash_check_last_agree_timestamp_seconds",
			Help: "Unix time of the last comparison in which every voting member's HashKV agreed."}),
		disagreement: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_data_corrupt",
			Help: "1 when this agent's last comparison as leader found the voting members' data disagree with no copy held by a majority: the cluster is CORRUPT, and nothing is rebuilt on its own; 0 otherwise."}),
	}
	reg.MustRegister(m.checks, m.lastAgree, m.disagreement)
	return m
}
