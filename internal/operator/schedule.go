package operator

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/robfig/cron/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
)

// labelSchedule marks the EtcdBackup objects a schedule created.
const labelSchedule = "etcd-manager.dev/schedule"

// ScheduleReconciler creates EtcdBackup objects on a cron schedule and
// prunes old ones. Backups in the store follow the cluster's retention.
type ScheduleReconciler struct {
	Client client.Client
	Now    func() time.Time
}

// SetupWithManager registers the reconciler.
func (r *ScheduleReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1alpha1.EtcdBackupSchedule{}).Owns(&v1alpha1.EtcdBackup{}).Named("etcdbackupschedule").Complete(r)
}

// NextRun is when a schedule next fires after last (or after created when it
// never ran); a schedule that cannot be parsed is an error.
func NextRun(schedule string, last time.Time) (time.Time, error) {
	s, err := cron.ParseStandard(schedule)
	if err != nil {
		return time.Time{}, fmt.Errorf("operator: schedule %q: %w", schedule, err)
	}
	return s.Next(last), nil
}

// Reconcile creates a backup when one is due and prunes the old ones.
func (r *ScheduleReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	now := time.Now()
	if r.Now != nil {
		now = r.Now()
	}
	var s v1alpha1.EtcdBackupSchedule
	if err := r.Client.Get(ctx, req.NamespacedName, &s); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	st := s.Status.DeepCopy()
	last := s.CreationTimestamp.Time
	if st.LastScheduleTime != nil {
		last = st.LastScheduleTime.Time
	}
	next, err := NextRun(s.Spec.Schedule, last)
	if err != nil {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Valid", Status: metav1.ConditionFalse, Reason: "BadSchedule", Message: err.Error(), ObservedGeneration: s.Generation})
		s.Status = *st
		return ctrl.Result{}, r.Client.Status().Update(ctx, &s)
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Valid", Status: metav1.ConditionTrue, Reason: "ScheduleParsed", Message: "next run " + next.UTC().Format(time.RFC3339), ObservedGeneration: s.Generation})

	var list v1alpha1.EtcdBackupList
	if err := r.Client.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingLabels{labelSchedule: s.Name}); err != nil {
		return ctrl.Result{}, err
	}
	if !s.Spec.Suspend && !now.Before(next) {
		b := &v1alpha1.EtcdBackup{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", s.Name, next.Unix()), Namespace: s.Namespace, Labels: map[string]string{labelSchedule: s.Name}},
			Spec:       s.Spec.BackupTemplate,
		}
		if err := controllerutil.SetControllerReference(&s, b, r.Client.Scheme()); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.Client.Create(ctx, b); client.IgnoreAlreadyExists(err) != nil {
			return ctrl.Result{}, err
		}
		st.LastScheduleTime = &metav1.Time{Time: now}
		if next, err = NextRun(s.Spec.Schedule, now); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.prune(ctx, &s, list.Items, st); err != nil {
		return ctrl.Result{}, err
	}
	s.Status = *st
	if err := r.Client.Status().Update(ctx, &s); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	return ctrl.Result{RequeueAfter: min(max(next.Sub(now), time.Second), pollSteady)}, nil
}

// prune deletes all but the newest succeeded and failed EtcdBackups.
func (r *ScheduleReconciler) prune(ctx context.Context, s *v1alpha1.EtcdBackupSchedule, items []v1alpha1.EtcdBackup, st *v1alpha1.EtcdBackupScheduleStatus) error {
	keepOK, keepFailed := int32(3), int32(1)
	if s.Spec.SuccessfulBackupsHistoryLimit != nil {
		keepOK = *s.Spec.SuccessfulBackupsHistoryLimit
	}
	if s.Spec.FailedBackupsHistoryLimit != nil {
		keepFailed = *s.Spec.FailedBackupsHistoryLimit
	}
	for _, d := range PruneBackups(items, keepOK, keepFailed) {
		if err := r.Client.Delete(ctx, &d); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	for _, b := range items {
		if b.Status.Phase == v1alpha1.BackupSucceeded && b.Status.CompletionTime != nil &&
			(st.LastSuccessfulTime == nil || b.Status.CompletionTime.After(st.LastSuccessfulTime.Time)) {
			st.LastSuccessfulTime = b.Status.CompletionTime
		}
	}
	return nil
}

// PruneBackups returns the EtcdBackups beyond the newest keepOK succeeded
// and keepFailed failed ones; running ones are never pruned.
func PruneBackups(items []v1alpha1.EtcdBackup, keepOK, keepFailed int32) []v1alpha1.EtcdBackup {
	sorted := append([]v1alpha1.EtcdBackup(nil), items...)
	sort.SliceStable(sorted, func(i, j int) bool {
		return sorted[i].CreationTimestamp.After(sorted[j].CreationTimestamp.Time)
	})
	var out []v1alpha1.EtcdBackup
	ok, failed := int32(0), int32(0)
	for _, b := range sorted {
		switch b.Status.Phase {
		case v1alpha1.BackupSucceeded:
			if ok++; ok > keepOK {
				out = append(out, b)
			}
		case v1alpha1.BackupFailed:
			if failed++; failed > keepFailed {
				out = append(out, b)
			}
		}
	}
	return out
}
