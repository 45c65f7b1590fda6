package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	"github.com/etcd-manager/etcd-manager/internal/operatorapi"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// BackupReconciler turns an EtcdBackup into a backup-now command in the
// cluster's store, and follows it.
type BackupReconciler struct {
	Client client.Client
	Engine Engine
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
	if st.CommandID == "" {
		// A backup queued before its ID reached the status (a call that
		// timed out, a failed status write) is adopted, not queued again.
		rows, err := r.Engine.Commands(ctx, &c)
		if err != nil {
			st.Message = "cannot read the command queue: " + err.Error()
			return r.update(ctx, &b, st, pollProgress)
		}
		id := queuedSince(rows, "backup-now", "", b.CreationTimestamp.Time)
		if id == "" {
			id, err = r.Engine.BackupNow(ctx, &c)
		}
		if err != nil {
			st.Message = "cannot queue the backup: " + err.Error()
			return r.update(ctx, &b, st, pollProgress)
		}
		st.Phase, st.CommandID, st.Message = v1alpha1.BackupRunning, id, "queued as command "+id
		return r.update(ctx, &b, st, pollProgress)
	}
	rows, err := r.Engine.Commands(ctx, &c)
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
		if backups, err := r.Engine.Backups(ctx, &c); err == nil {
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
		if backups, err := r.Engine.Backups(ctx, &c); err == nil {
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

// RestoreReconciler restores a backup through the engine's quarantined,
// verified restore: into an existing cluster, in place, or into a new
// EtcdCluster it makes from a template.
type RestoreReconciler struct {
	Client client.Client
	Engine Engine
	Events events.EventRecorder
}

// SetupWithManager registers the reconciler.
func (r *RestoreReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1alpha1.EtcdRestore{}).Named("etcdrestore").Complete(r)
}

// Reconcile makes the target cluster if a template asks for one, queues
// the restore once, then follows its phases to the end.
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
	c, err := r.target(ctx, &rs, st)
	if err != nil {
		return ctrl.Result{}, err
	}
	if c == nil {
		return r.update(ctx, &rs, st, pollProgress)
	}
	if st.CommandID == "" {
		if err := r.queue(ctx, &rs, c, st); err != nil {
			st.Message = err.Error()
		}
		if st.Phase == v1alpha1.RestoreFailed && st.CommandID == "" && rs.Spec.ClusterTemplate != nil && c.Annotations[AnnotationRestoredBy] == rs.Name {
			// Refused before anything was queued: the cluster this restore
			// made holds nothing, and would wait for it forever.
			if err := r.Client.Delete(ctx, c); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, fmt.Errorf("operator: delete EtcdCluster %s, made for a refused restore: %w", c.Name, err)
			}
			st.Message += fmt.Sprintf("; deleted EtcdCluster %s, which this restore made (its PVCs and generated CA Secret follow its deletionPolicy)", c.Name)
		}
		return r.update(ctx, &rs, st, pollProgress)
	}
	if c.Annotations[AnnotationRestorePending] != "" {
		// The restore is queued: the cluster's spec may go to the store.
		patch := client.MergeFrom(c.DeepCopy())
		delete(c.Annotations, AnnotationRestorePending)
		if err := r.Client.Patch(ctx, c, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("operator: release EtcdCluster %s for its restore: %w", c.Name, err)
		}
	}
	rows, err := r.Engine.Commands(ctx, c)
	if err != nil {
		st.Message = "cannot read the command queue: " + err.Error()
		return r.update(ctx, &rs, st, pollProgress)
	}
	row, found := findCommand(rows, st.CommandID)
	switch {
	case found && row.State == spec.CommandFailed:
		st.Phase, st.Message = v1alpha1.RestoreFailed, row.Detail
		r.Events.Eventf(c, &rs, corev1.EventTypeWarning, reasonRestoreFailed, "Restore", "restore of %s failed: %s", rs.Spec.BackupName, row.Detail)
	case found:
		if row.Phase != "" {
			st.Step = row.Phase
		}
		st.Message = "command " + st.CommandID + " is " + row.State
	default:
		// The engine removes a restore command once it is complete; so
		// does a person, by hand. The restored members have a new etcd
		// cluster ID.
		now := metav1.Now()
		if st.CommandEndTime == nil {
			st.CommandEndTime = &now
		}
		status, err := r.Engine.Status(ctx, c)
		if err != nil {
			st.Message = "the restore command is gone; cannot read the members: " + err.Error()
			break
		}
		ended, failed, msg := restoreOutcome(*st, rs.Spec.BackupName, status, now.Time)
		st.Message = msg
		if !ended {
			break
		}
		st.Step, st.CompletionTime = "", &now
		if failed {
			st.Phase = v1alpha1.RestoreFailed
			r.Events.Eventf(c, &rs, corev1.EventTypeWarning, reasonRestoreFailed, "Restore", "restore of %s: %s", rs.Spec.BackupName, msg)
			break
		}
		st.Phase = v1alpha1.RestoreSucceeded
		r.Events.Eventf(c, &rs, corev1.EventTypeNormal, reasonRestoreDone, "Restore", "restored backup %s", rs.Spec.BackupName)
	}
	return r.update(ctx, &rs, st, pollProgress)
}

// restoreReportGrace bounds the wait, once a restore's command has left
// the queue, for a healthy member to report.
const restoreReportGrace = 10 * time.Minute

// restoreOutcome tells, once the restore's command has left the queue,
// whether the restore ended, and how: the members must report an etcd
// cluster ID other than the one the restore replaced. Where there was
// none, the engine must have been seen working on the command, or a
// command deleted before it started would read as a success. A false
// failure, which says to check, is the lesser harm.
func restoreOutcome(st v1alpha1.EtcdRestoreStatus, backup string, status cli.ClusterStatus, now time.Time) (ended, failed bool, msg string) {
	var ids []string
	for _, a := range status.Agents {
		if isMember(a.Role) && a.Healthy && a.ClusterID != "" && !slices.Contains(ids, a.ClusterID) {
			ids = append(ids, a.ClusterID)
		}
	}
	switch {
	case len(ids) == 0 && st.CommandEndTime != nil && now.Sub(st.CommandEndTime.Time) > restoreReportGrace:
		return true, true, fmt.Sprintf("the restore command left the queue %s ago, and no healthy member has reported since: check the cluster with etcd-manager-ctl status", restoreReportGrace)
	case len(ids) == 0:
		return false, false, "the restore command is gone; waiting for the restored members to report"
	case st.ReplacedClusterID != "" && !slices.ContainsFunc(ids, func(id string) bool { return id != st.ReplacedClusterID }):
		return true, true, fmt.Sprintf("the restore command left the queue, but the members still report the etcd cluster %s it was to replace: was the command deleted by hand?", st.ReplacedClusterID)
	case st.ReplacedClusterID == "" && st.Step == "":
		return true, true, "the restore command left the queue before the engine was seen to take it up (deleted by hand, or finished while the operator was away): check the cluster's data before you trust it"
	}
	return true, false, fmt.Sprintf("restored backup %s into etcd cluster %s", backup, strings.Join(ids, ","))
}

// target is the cluster to restore into: the named one, or the one the
// template describes, made here on the first pass. It is nil, with st
// saying why, while there is none to act on.
func (r *RestoreReconciler) target(ctx context.Context, rs *v1alpha1.EtcdRestore, st *v1alpha1.EtcdRestoreStatus) (*v1alpha1.EtcdCluster, error) {
	tmpl := rs.Spec.ClusterTemplate
	name := rs.Spec.ClusterName
	if tmpl != nil {
		name = tmpl.Name
	}
	st.ClusterName = name
	var c v1alpha1.EtcdCluster
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: rs.Namespace, Name: name}, &c)
	switch {
	case err == nil && tmpl != nil && c.Annotations[AnnotationRestoredBy] != rs.Name:
		st.Phase, st.Message = v1alpha1.RestoreFailed, fmt.Sprintf("EtcdCluster %s already exists and this restore did not make it; to restore into it, set clusterName instead of clusterTemplate", name)
		return nil, nil
	case err == nil:
		return &c, nil
	case !apierrors.IsNotFound(err):
		return nil, err
	case tmpl == nil:
		st.Message = fmt.Sprintf("no EtcdCluster %s in this namespace", name)
		return nil, nil
	case st.CommandID != "":
		st.Phase, st.Message = v1alpha1.RestoreFailed, fmt.Sprintf("EtcdCluster %s, which this restore made, was deleted before the restore ended", name)
		return nil, nil
	}
	// Two clusters on one store would fight over it: the restore would
	// replace the other's data.
	var all v1alpha1.EtcdClusterList
	if err := r.Client.List(ctx, &all); err != nil {
		return nil, fmt.Errorf("operator: list EtcdClusters: %w", err)
	}
	for _, o := range all.Items {
		if o.Namespace == rs.Namespace && o.Name == name {
			continue // made by this restore a moment ago, and not yet in the cache's Get
		}
		if sameStore(o.Spec.BackupStore.URL, tmpl.Spec.BackupStore.URL) {
			st.Phase, st.Message = v1alpha1.RestoreFailed, fmt.Sprintf("EtcdCluster %s/%s uses the backup store %s: restore into it in place with clusterName, or delete it first",
				o.Namespace, o.Name, o.Spec.BackupStore.URL)
			return nil, nil
		}
	}
	c = v1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: rs.Namespace,
			Annotations: map[string]string{AnnotationRestoredBy: rs.Name, AnnotationRestorePending: rs.Name}},
		Spec: *tmpl.Spec.DeepCopy(),
	}
	if err := r.Client.Create(ctx, &c); err != nil {
		if apierrors.IsAlreadyExists(err) {
			st.Message = "EtcdCluster " + name + " exists; waiting to see it"
			return nil, nil
		}
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
			st.Phase, st.Message = v1alpha1.RestoreFailed, "cannot make the EtcdCluster of the template: "+err.Error()
			return nil, nil
		}
		return nil, fmt.Errorf("operator: create EtcdCluster %s: %w", name, err)
	}
	r.Events.Eventf(rs, &c, corev1.EventTypeNormal, reasonClusterCreated, "Restore", "created EtcdCluster %s from the template; its store gets no spec until the restore is queued", name)
	st.Message = "created EtcdCluster " + name + "; waiting for its pods"
	return nil, nil
}

// queue queues the restore once it has checked that the backup is in the
// store and, for a new cluster, that no other cluster lives on that store.
func (r *RestoreReconciler) queue(ctx context.Context, rs *v1alpha1.EtcdRestore, c *v1alpha1.EtcdCluster, st *v1alpha1.EtcdRestoreStatus) error {
	// A restore queued before its ID reached the status (a failed status
	// write) is adopted, never queued again: each run would erase the
	// writes made since the one before.
	rows, err := r.Engine.Commands(ctx, c)
	if err != nil {
		return fmt.Errorf("cannot read the command queue: %w", err)
	}
	if id := queuedSince(rows, "restore-backup", rs.Spec.BackupName, rs.CreationTimestamp.Time); id != "" {
		st.Phase, st.CommandID, st.Message = v1alpha1.RestoreRunning, id, "adopted queued command "+id
		if row, _ := findCommand(rows, id); row.Phase == "" {
			// Not taken up yet: the cluster it replaces is still there.
			if status, err := r.Engine.Status(ctx, c); err == nil {
				st.ReplacedClusterID = healthyClusterID(status)
			}
		}
		return nil
	}
	backups, err := r.Engine.Backups(ctx, c)
	if err != nil {
		return fmt.Errorf("cannot list the store's backups: %w", err)
	}
	if !slices.ContainsFunc(backups, func(b cli.BackupRow) bool { return b.Name == rs.Spec.BackupName }) {
		newest := "none"
		if len(backups) > 0 {
			newest = backups[len(backups)-1].Name
		}
		st.Phase, st.Message = v1alpha1.RestoreFailed, fmt.Sprintf("the store %s holds no backup %s (%d backups, the newest %s)",
			c.Spec.BackupStore.URL, rs.Spec.BackupName, len(backups), newest)
		r.Events.Eventf(c, rs, corev1.EventTypeWarning, reasonRestoreFailed, "Restore", "%s", st.Message)
		return nil
	}
	status, err := r.Engine.Status(ctx, c)
	if err != nil {
		return fmt.Errorf("cannot read the members before the restore: %w", err)
	}
	for _, a := range status.Agents {
		if rs.Spec.ClusterTemplate != nil && isMember(a.Role) && !ownPod(c, a.ID) {
			st.Phase, st.Message = v1alpha1.RestoreFailed, fmt.Sprintf("the store %s is in use: member %s, not a pod of EtcdCluster %s, reports from it; restore into that cluster instead",
				c.Spec.BackupStore.URL, a.ID, c.Name)
			return nil
		}
	}
	st.ReplacedClusterID = healthyClusterID(status)
	id, err := r.Engine.RestoreBackup(ctx, c, rs.Spec.BackupName)
	if errors.Is(err, operatorapi.ErrRefused) {
		st.Phase, st.Message = v1alpha1.RestoreFailed, err.Error()
		r.Events.Eventf(c, rs, corev1.EventTypeWarning, reasonRestoreFailed, "Restore", "%s", st.Message)
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot queue the restore: %w", err)
	}
	st.Phase, st.CommandID, st.Message = v1alpha1.RestoreRunning, id, "queued as command "+id
	r.Events.Eventf(c, rs, corev1.EventTypeNormal, reasonRestoreStarted, "Restore", "restore of backup %s queued as command %s", rs.Spec.BackupName, id)
	return nil
}

// healthyClusterID is the etcd cluster ID a healthy member reports, or "".
func healthyClusterID(status cli.ClusterStatus) string {
	for _, a := range status.Agents {
		if isMember(a.Role) && a.Healthy && a.ClusterID != "" {
			return a.ClusterID
		}
	}
	return ""
}

// ownPod says whether an agent's node ID is one of c's pods.
func ownPod(c *v1alpha1.EtcdCluster, id string) bool {
	n, ok := spec.Ordinal(id)
	return ok && id == fmt.Sprintf("%s-%d", c.Name, n)
}

// sameStore compares two backup store URLs, ignoring a trailing slash.
func sameStore(a, b string) bool {
	return strings.TrimRight(a, "/") == strings.TrimRight(b, "/")
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
