package operator

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// BackupReconciler turns an EtcdBackup into a backup-now command in the
// cluster's store, and follows it.
type BackupReconciler struct {
	Client client.Client
	Ctl    StoreCtl
	Events events.EventRecorder
}

// SetupWithManager registers the reconciler.
func (r *BackupReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1alpha1.EtcdBackup{}).Named("etcdbackup").Complete(r)
}

// Reconcile queues the backup once, then follows it to its end.
func (r *BackupReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var b v1alpha1.EtcdBackup
	if err := r.Client.Get(ctx, req.NamespacedName, &b); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if b.Status.Phase == v1alpha1.BackupSucceeded || b.Status.Phase == v1alpha1.BackupFailed {
		return ctrl.Result{}, nil
	}
	st := b.Status.DeepCopy()
	if st.Phase == "" {
		st.Phase = v1alpha1.BackupPending
	}
	var c v1alpha1.EtcdCluster
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: b.Spec.ClusterName}, &c); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		st.Message = fmt.Sprintf("no EtcdCluster %s in this namespace", b.Spec.ClusterName)
		return r.update(ctx, &b, st, pollSteady)
	}
	pod, err := RunningPod(ctx, r.Client, &c)
	if err != nil {
		st.Message = "waiting for a running member pod: " + err.Error()
		return r.update(ctx, &b, st, pollProgress)
	}
	if st.CommandID == "" {
		id, err := r.Ctl.BackupNow(ctx, &c, pod)
		if err != nil {
			st.Message = "cannot queue the backup: " + err.Error()
			return r.update(ctx, &b, st, pollProgress)
		}
		st.Phase, st.CommandID, st.Message = v1alpha1.BackupRunning, id, "queued as command "+id
		return r.update(ctx, &b, st, pollProgress)
	}
	rows, err := r.Ctl.Commands(ctx, &c, pod)
	if err != nil {
		st.Message = "cannot read the command queue: " + err.Error()
		return r.update(ctx, &b, st, pollProgress)
	}
	row, found := findCommand(rows, st.CommandID)
	switch {
	case !found:
		// Finished commands leave the queue after a while: a backup taken
		// since this object was made is the one it asked for.
		st.Phase, st.Message = v1alpha1.BackupFailed, fmt.Sprintf("command %s left the queue before it was seen done", st.CommandID)
		if backups, err := r.Ctl.Backups(ctx, &c, pod); err == nil {
			for _, bk := range backups {
				at := time.Now().Add(-time.Duration(bk.AgeSeconds * float64(time.Second)))
				if !at.Before(b.CreationTimestamp.Time) {
					st.Phase, st.BackupName, st.Size, st.Revision, st.Message = v1alpha1.BackupSucceeded, bk.Name, bk.Size, bk.Revision, ""
					st.CompletionTime = &metav1.Time{Time: at.Truncate(time.Second)}
					break
				}
			}
		}
	case row.State == spec.CommandDone && row.Backup != "":
		st.Phase, st.BackupName, st.Message = v1alpha1.BackupSucceeded, row.Backup, ""
		now := metav1.Now()
		st.CompletionTime = &now
		if backups, err := r.Ctl.Backups(ctx, &c, pod); err == nil {
			for _, bk := range backups {
				if bk.Name == row.Backup {
					st.Size, st.Revision = bk.Size, bk.Revision
					st.CompletionTime = &metav1.Time{Time: time.Now().Add(-time.Duration(bk.AgeSeconds * float64(time.Second))).Truncate(time.Second)}
				}
			}
		}
		r.Events.Eventf(&b, &c, corev1.EventTypeNormal, reasonBackupTaken, "Backup", "backup %s taken (revision %d, %d bytes)", st.BackupName, st.Revision, st.Size)
		r.Events.Eventf(&c, nil, corev1.EventTypeNormal, reasonBackupTaken, "Backup", "backup %s taken for EtcdBackup %s", st.BackupName, b.Name)
	case row.State == spec.CommandFailed:
		st.Phase, st.Message = v1alpha1.BackupFailed, row.Detail
		r.Events.Eventf(&b, &c, corev1.EventTypeWarning, reasonBackupFailed, "Backup", "backup failed: %s", row.Detail)
	default:
		st.Phase, st.Message = v1alpha1.BackupRunning, "command "+st.CommandID+" is "+row.State
	}
	return r.update(ctx, &b, st, pollProgress)
}

func (r *BackupReconciler) update(ctx context.Context, b *v1alpha1.EtcdBackup, st *v1alpha1.EtcdBackupStatus, poll time.Duration) (ctrl.Result, error) {
	b.Status = *st
	if err := r.Client.Status().Update(ctx, b); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if st.Phase == v1alpha1.BackupSucceeded || st.Phase == v1alpha1.BackupFailed {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: poll}, nil
}

// queuedSince is the ID of a command of kind for backup, queued at or
// after since and not finished, or "".
func queuedSince(rows []cli.CommandRow, kind, backup string, since time.Time) string {
	for _, r := range rows {
		if r.Kind != kind || r.Backup != backup || r.State == spec.CommandDone || r.State == spec.CommandFailed {
			continue
		}
		if at, err := time.Parse(time.RFC3339, r.Queued); err == nil && !at.Before(since.Truncate(time.Second)) {
			return r.ID
		}
	}
	return ""
}

func findCommand(rows []cli.CommandRow, id string) (cli.CommandRow, bool) {
	for _, r := range rows {
		if r.ID == id {
			return r, true
		}
	}
	return cli.CommandRow{}, false
}

// RestoreReconciler restores a backup into an existing cluster, in place,
// through the engine's quarantined, verified restore.
type RestoreReconciler struct {
	Client client.Client
	Ctl    StoreCtl
	Events events.EventRecorder
}

// SetupWithManager registers the reconciler.
func (r *RestoreReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1alpha1.EtcdRestore{}).Named("etcdrestore").Complete(r)
}

// Reconcile queues the restore once, then follows its phases.
func (r *RestoreReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var rs v1alpha1.EtcdRestore
	if err := r.Client.Get(ctx, req.NamespacedName, &rs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if rs.Status.Phase == v1alpha1.RestoreSucceeded || rs.Status.Phase == v1alpha1.RestoreFailed {
		return ctrl.Result{}, nil
	}
	st := rs.Status.DeepCopy()
	if st.Phase == "" {
		st.Phase = v1alpha1.RestorePending
	}
	if rs.Spec.ClusterTemplate != nil {
		st.Phase, st.Message = v1alpha1.RestoreFailed, "restoring into a new cluster from a template is not supported yet; restore in place with clusterName"
		return r.update(ctx, &rs, st, 0)
	}
	var c v1alpha1.EtcdCluster
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: rs.Namespace, Name: rs.Spec.ClusterName}, &c); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		st.Message = fmt.Sprintf("no EtcdCluster %s in this namespace", rs.Spec.ClusterName)
		return r.update(ctx, &rs, st, pollSteady)
	}
	pod, err := RunningPod(ctx, r.Client, &c)
	if err != nil {
		st.Message = "waiting for a running member pod: " + err.Error()
		return r.update(ctx, &rs, st, pollProgress)
	}
	if st.CommandID == "" {
		// A restore queued before its ID reached the status (a failed
		// status write) is adopted, never queued again: each run would
		// erase the writes made since the one before.
		rows, err := r.Ctl.Commands(ctx, &c, pod)
		if err != nil {
			st.Message = "cannot read the command queue: " + err.Error()
			return r.update(ctx, &rs, st, pollProgress)
		}
		if id := queuedSince(rows, "restore-backup", rs.Spec.BackupName, rs.CreationTimestamp.Time); id != "" {
			st.Phase, st.CommandID, st.Message = v1alpha1.RestoreRunning, id, "adopted queued command "+id
			return r.update(ctx, &rs, st, pollProgress)
		}
		id, err := r.Ctl.RestoreBackup(ctx, &c, pod, rs.Spec.BackupName)
		if err != nil {
			st.Message = "cannot queue the restore: " + err.Error()
			return r.update(ctx, &rs, st, pollProgress)
		}
		st.Phase, st.CommandID, st.Message = v1alpha1.RestoreRunning, id, "queued as command "+id
		r.Events.Eventf(&c, &rs, corev1.EventTypeNormal, reasonRestoreStarted, "Restore", "restore of backup %s queued as command %s", rs.Spec.BackupName, id)
		return r.update(ctx, &rs, st, pollProgress)
	}
	rows, err := r.Ctl.Commands(ctx, &c, pod)
	if err != nil {
		st.Message = "cannot read the command queue: " + err.Error()
		return r.update(ctx, &rs, st, pollProgress)
	}
	row, found := findCommand(rows, st.CommandID)
	switch {
	case !found:
		// The engine removes a restore command once it is complete.
		st.Phase, st.Step, st.Message = v1alpha1.RestoreSucceeded, "", "restored backup "+rs.Spec.BackupName
		now := metav1.Now()
		st.CompletionTime = &now
		r.Events.Eventf(&c, &rs, corev1.EventTypeNormal, reasonRestoreDone, "Restore", "restored backup %s", rs.Spec.BackupName)
	case row.State == spec.CommandFailed:
		st.Phase, st.Message = v1alpha1.RestoreFailed, row.Detail
		r.Events.Eventf(&c, &rs, corev1.EventTypeWarning, reasonRestoreFailed, "Restore", "restore of %s failed: %s", rs.Spec.BackupName, row.Detail)
	default:
		st.Step, st.Message = row.Phase, "command "+st.CommandID+" is "+row.State
	}
	return r.update(ctx, &rs, st, pollProgress)
}

func (r *RestoreReconciler) update(ctx context.Context, rs *v1alpha1.EtcdRestore, st *v1alpha1.EtcdRestoreStatus, poll time.Duration) (ctrl.Result, error) {
	rs.Status = *st
	if err := r.Client.Status().Update(ctx, rs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if poll == 0 || st.Phase == v1alpha1.RestoreSucceeded || st.Phase == v1alpha1.RestoreFailed {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: poll}, nil
}
