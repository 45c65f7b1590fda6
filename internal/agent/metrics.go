package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/etcd-manager/etcd-manager/internal/node"
	"github.com/etcd-manager/etcd-manager/internal/version"
)

// metrics are the agent's own Prometheus metrics: its certificates and the
// member data its node set aside. Their registry takes the loop's too, and
// the Go runtime's and the process's collectors; the agent serves it on
// --metrics-address.
type metrics struct {
	reg          *prometheus.Registry
	certExpiry   prometheus.Gauge
	certRenewals prometheus.Counter
	// Certificates, by certificate (node, ca).
	certificateExpiry *prometheus.GaugeVec
	dataDiscarded     *prometheus.CounterVec
}

// newProcessMetrics returns a registry with the Go runtime's and the
// process's collectors, which every agent serves.
func newProcessMetrics() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
	return reg
}

func newMetrics() *metrics {
	m := &metrics{
		reg: newProcessMetrics(),
		certExpiry: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_node_certificate_expiry_timestamp_seconds",
			Help: "Unix time the node certificate in use expires; it is renewed two thirds into its life."}),
		certRenewals: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_node_certificate_issued_total",
			Help: "Node certificates this agent issued itself (at start and on renewal)."}),
		certificateExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "etcd_manager_certificate_expiry_timestamp_seconds",
			Help: "Unix time each certificate the agent uses expires: certificate=node (its own, renewed two thirds into its life) or ca (the CA that issued it)."}, []string{"certificate"}),
		dataDiscarded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "etcd_manager_member_data_discarded_total",
			Help: "Times this node set its own member's data aside to be rebuilt from its peers, by why: initial-check (etcd's initial corruption check), damaged-db (the database failed its check after an unclean exit), hash-mismatch (the leader found its HashKV disagrees)."}, []string{"reason"}),
	}
	for _, r := range []string{node.DiscardInitialCheck, node.DiscardDamagedDB, node.DiscardHashMismatch} {
		m.dataDiscarded.WithLabelValues(r)
	}
	m.reg.MustRegister(m.certExpiry, m.certRenewals, m.certificateExpiry, m.dataDiscarded)
	return m
}

// buildInfo is etcd_manager_build_info: 1, labelled with the agent's
// build, so that a fleet's versions show on one query.
func buildInfo() prometheus.Collector {
	v := version.Get()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "etcd_manager_build_info",
		Help: "Always 1; its labels are the agent's build: version (the module's, or (devel)), revision (the VCS commit) and goversion."},
		[]string{"version", "revision", "goversion"})
	g.WithLabelValues(v.Version, v.Revision, v.GoVersion).Set(1)
	return g
}
