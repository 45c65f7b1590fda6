package controller

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// metrics are the loop's Prometheus metrics; the agent serves them, with
// its own, on --metrics-address.
type metrics struct {
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
	leader            prometheus.Gauge
	etcdHealthy       prometheus.Gauge
	etcdRevision      prometheus.Gauge
	actionsPerformed  *prometheus.CounterVec
	backingOff        prometheus.Gauge
	panics            prometheus.Counter
	// NOSPACE recoveries by this agent as leader.
	noSpaceRecoveries prometheus.Counter
	// Corruption: the members rebuilt.
	corruptDiscarded prometheus.Counter
	// The agent's own view.
	loopCycles prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
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
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_leader",
			Help: "1 while this agent acts as the manager leader."}),
		etcdRevision: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_etcd_revision",
			Help: "The revision this node's etcd last reported while it answered: with etcd_manager_capture_durable_revision, how far capture is behind."}),
		etcdHealthy: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_etcd_healthy",
			Help: "1 while the local etcd answers."}),
		actionsPerformed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "etcd_manager_actions_total",
			Help: "Actions performed, by kind and result."}, []string{"action", "result"}),
		backingOff: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcd_manager_actions_backing_off",
			Help: "Cluster changes of the leader that failed and have not succeeded since; each backs off (up to 5 minutes) while the rest of its work goes on, and is forgotten once not tried for 10 minutes."}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_loop_panics_total",
			Help: "Control-loop cycles that panicked and were recovered; each is a bug to report."}),
		noSpaceRecoveries: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_nospace_recoveries_total",
			Help: "NOSPACE alarms this agent disarmed as leader, once compaction and defragmentation left every database well under the quota."}),
		corruptDiscarded: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_corrupt_members_discarded_total",
			Help: "Members whose data disagreed with the majority's, set aside by this agent as leader to be rebuilt from their peers."}),
		loopCycles: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcd_manager_loop_cycles_total",
			Help: "Cycles of the agent's control loop (observe, plan, act)."}),
	}
	reg.MustRegister(m.backupLastFailure, m.drillLastOK, m.drillLastFailure, m.drillDuration)
	reg.MustRegister(m.loopCycles)
	reg.MustRegister(m.corruptDiscarded, m.noSpaceRecoveries, m.backupLastOK, m.backupDuration, m.backupSize, m.backupFailures, m.leader, m.etcdHealthy, m.etcdRevision,
		m.actionsPerformed, m.backingOff, m.panics)
	return m
}

// backupFigures sets the duration and size of the newest backup of a
// kind from its meta.
func (m *metrics) backupFigures(meta backup.Meta) {
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
func (m *metrics) drillFigures(d *spec.DrillRecord) {
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

func boolGauge(g prometheus.Gauge, v bool) {
	if v {
		g.Set(1)
	} else {
		g.Set(0)
	}
}
