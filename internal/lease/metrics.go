package lease

import "github.com/prometheus/client_golang/prometheus"

// RegisterMetrics registers the fence's figures with reg: the term of the
// store lock it holds, the fencing token of the steps taken while etcd has
// no quorum.
func (l *Fence) RegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_store_lock_term",
		Help: "The term of the store lock this agent holds (the fencing token of the steps it takes while etcd has no quorum: a first boot, a restore, a lost quorum); 0 while it holds none."},
		func() float64 { return float64(l.held.Load()) }))
}
