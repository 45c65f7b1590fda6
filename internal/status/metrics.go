package status

import "github.com/prometheus/client_golang/prometheus"

// gaugeMetrics are the cluster's figures as the leader sees them.
type gaugeMetrics struct {
	clusterMembers *prometheus.GaugeVec
	memberLag      *prometheus.GaugeVec
	memberDBSize   *prometheus.GaugeVec
	alarms         *prometheus.GaugeVec
	leaderChanges  prometheus.Counter
}

func newGaugeMetrics(reg prometheus.Registerer) gaugeMetrics {
	m := gaugeMetrics{
		clusterMembers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "etcd_manager_cluster_members",
			Help: "The cluster's members by state (voter, learner, unhealthy), as the leader sees them; other agents export no series."}, []string{"state"}),
		memberLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "etcd_manager_member_raft_index_lag",
			Help: "How far each member's raft log is behind the furthest member's, as the leader reads them in one pass."}, []string{"member"}),
		memberDBSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "etcd_manager_member_db_size_bytes",
			Help: "Each member's database file size (kind=total) and how much of it holds data (kind=in_use), as the leader reads them."}, []string{"member", "kind"}),
		alarms: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "etcd_manager_alarms",
			Help: "etcd's raised alarms by kind (NOSPACE, CORRUPT): how many members have each, as the leader reads them."}, []string{"alarm"}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_leader_changes_total",
			Help: "Changes of the raft leader that this agent's etcd member saw."}),
	}
	reg.MustRegister(m.clusterMembers, m.memberLag, m.memberDBSize, m.alarms, m.leaderChanges)
	return m
}
