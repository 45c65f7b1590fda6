package history

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the restorable history's figures, read from the store alike
// by every agent. Create them with NewMetrics.
type Metrics struct {
	restorable prometheus.Gauge
}

// NewMetrics returns the figures, registered with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		restorable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_restorable_point_timestamp_seconds",
			Help: "Unix time of the newest point a restore can reach, read from the store every lease: the newest backup's, or, with continuous capture, when the cluster's last durable revision was observed. The RPO now is time() minus it."}),
	}
	reg.MustRegister(m.restorable)
	return m
}

// Show sets the figures from the newest restorable point (see
// NewestPoint); a zero point leaves them as they were.
func (m *Metrics) Show(point time.Time) {
	if !point.IsZero() {
		m.restorable.Set(float64(point.Unix()))
	}
}
