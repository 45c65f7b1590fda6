package status

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// figureMetrics are the store's figures as gauges.
type figureMetrics struct {
	backupLastOK   prometheus.Gauge
	backupDuration *prometheus.GaugeVec
	backupSize     *prometheus.GaugeVec
	backupFailures prometheus.Counter
	// Read from the store, alike on every agent: the last failed backup
	// and the restore drills.
	backupLastFailure prometheus.Gauge
	drillLastOK       prometheus.Gauge
	drillLastFailure  prometheus.Gauge
	drillDuration     prometheus.Gauge
}

func newFigureMetrics(reg prometheus.Registerer) figureMetrics {
	m := figureMetrics{
		backupLastOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_backup_last_success_timestamp_seconds",
			Help: "Unix time of the newest backup in the store (its meta's timestamp), read every lease by every agent, or of a backup this agent just took."}),
		backupDuration: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "etcd_manager_backup_last_duration_seconds",
			Help: "How long the newest backup of each kind (periodic, pre-change, on-demand, restored; other for one that records none) took, upload included, from its meta in the store."}, []string{"kind"}),
		backupSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "etcd_manager_backup_last_size_bytes",
			Help: "The snapshot size of the newest backup of each kind, from its meta in the store."}, []string{"kind"}),
		backupFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_backup_failures_total",
			Help: "Backups this agent tried and failed."}),
		backupLastFailure: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_backup_last_failure_timestamp_seconds",
			Help: "Unix time of the last failed backup of any agent, read from the store every lease (0: none recorded)."}),
		drillLastOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_restore_drill_last_success_timestamp_seconds",
			Help: "Unix time of the last restore drill that passed (the newest backup restored into a scratch etcd and checked against its meta), read from the store (0: none)."}),
		drillLastFailure: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_restore_drill_last_failure_timestamp_seconds",
			Help: "Unix time of the last restore drill that failed, read from the store (0: none since the last that passed)."}),
		drillDuration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_restore_drill_last_duration_seconds",
			Help: "How long the newest restore drill took, fetch included, read from the store."}),
	}
	reg.MustRegister(m.backupLastOK, m.backupDuration, m.backupSize, m.backupFailures, m.backupLastFailure, m.drillLastOK, m.drillLastFailure, m.drillDuration)
	return m
}

// backupFigures sets the duration and size of the newest backup of a
// kind from its meta.
func (m figureMetrics) backupFigures(meta backup.Meta) {
	kind := meta.Kind
	if !spec.ValidBackupKind(kind) {
		kind = "other"
	}
	if meta.Seconds > 0 {
		m.backupDuration.WithLabelValues(kind).Set(meta.Seconds)
	} else {
		m.backupDuration.DeleteLabelValues(kind)
	}
	m.backupSize.WithLabelValues(kind).Set(float64(meta.Size))
}

// drillFigures sets the restore drills' figures from their record.
func (m figureMetrics) drillFigures(d *spec.DrillRecord) {
	var ok, failed time.Time
	if p := d.LastPassed; p != nil {
		ok = p.Time
	}
	if f := d.Failing(); f != nil {
		failed = f.Time
	}
	m.drillLastOK.Set(unixOrZero(ok))
	m.drillLastFailure.Set(unixOrZero(failed))
	m.drillDuration.Set(d.Last.Seconds)
}

func unixOrZero(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.Unix())
}
