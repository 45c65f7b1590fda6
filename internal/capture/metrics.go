package capture

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/changelog"
)

// register registers capture's metrics with reg: its settings, and the
// spool's and the runs' status as changelog reports it.
func (c *Capturer) register(reg prometheus.Registerer) {
	status := func(f func(changelog.Status) float64) func() float64 {
		return func() float64 {
			c.mu.Lock()
			w := c.changes
			c.mu.Unlock()
			if w == nil {
				return 0
			}
			return f(w.Status())
		}
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_enabled",
			Help: "1 when this agent runs with continuous capture (--capture): its leader's capture is expected to follow every change."},
			func() float64 { return b2f(c.cfg.Enabled) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_set_aside",
			Help: "Spooled segments that did not read and were set aside, since the agent started: each ended its run there."},
			status(func(s changelog.Status) float64 { return float64(s.SetAside) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_running",
			Help: "1 while this agent captures its cluster's changes into the store (the leader, with --capture)."},
			status(func(s changelog.Status) float64 { return b2f(s.Running) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_durable_revision",
			Help: "The last revision this agent's capture made durable in the store."},
			status(func(s changelog.Status) float64 { return float64(s.Durable) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_durable_timestamp_seconds",
			Help: "Unix time capture observed the last revision it made durable in the store: a restore can reach it."},
			status(func(s changelog.Status) float64 {
				if s.DurableTime.IsZero() {
					return 0
				}
				return float64(s.DurableTime.UnixNano()) / 1e9
			})),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_spool_bytes",
			Help: "Captured changes on local disk waiting for the store."},
			status(func(s changelog.Status) float64 { return float64(s.SpoolBytes) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_spool_full",
			Help: "1 while capture is stopped because its spool reached --capture-max-spool-bytes."},
			status(func(s changelog.Status) float64 { return b2f(s.SpoolFull) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "etcd_manager_capture_gaps",
			Help: "Times capture could not continue from the last captured revision and started again after a full backup, since the agent started."},
			status(func(s changelog.Status) float64 { return float64(s.Gaps) })),
	)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
