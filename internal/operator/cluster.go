package operator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/operatorapi"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Event reasons.
const (
	reasonSpecWritten     = "SpecWritten"
	reasonInvalidEtcdSpec = "InvalidEtcdSpec"
	reasonMemberAdded     = "MemberAdded"
	reasonMemberRemoved   = "MemberRemoved"
	reasonScaled          = "Scaled"
	reasonCAGenerated     = "CAGenerated"
	reasonStoreError      = "StoreError"
	reasonBackupTaken     = "BackupTaken"
	reasonBackupFailed    = "BackupFailed"
	reasonRestoreStarted  = "RestoreStarted"
	reasonRestoreDone     = "RestoreSucceeded"
	reasonRestoreFailed   = "RestoreFailed"
	reasonClusterCreated  = "ClusterCreated"
	reasonRollStep        = "RollStep"
	reasonStoreInUse      = "StoreInUse"
	reasonImageLacks      = "ImageLacksVersion"
	reasonCAMissing       = "CAMissing"
	reasonClientCert      = "ClientCertIssued"
)

// Annotations a user sets on an EtcdCluster.
const (
	// AnnotationTakeOverStore lets an EtcdCluster own a store whose owner
	// record names an EtcdCluster this Kubernetes cluster does not hold
	// (deleted, say), or that holds a spec with no owner record (one of
	// etcd-manager-ctl's). The store's cluster becomes this one's.
	AnnotationTakeOverStore = "etcd-manager.dev/take-over-store"
)

// Requeue intervals: status is polled, since the engine does not call back.
const (
	pollSteady   = 15 * time.Second
	pollProgress = 3 * time.Second
)

// ClusterReconciler reconciles EtcdCluster objects.
type ClusterReconciler struct {
	Client client.Client
	Engine Engine
	Events events.EventRecorder
	// Image is the image member pods run unless spec.image says otherwise.
	Image string
	// ImageVersions are the etcd versions Image carries, nil when they are
	// not known: a cluster on Image whose versions it lacks is held.
	ImageVersions []string
	// ClusterDomain is the Kubernetes cluster's DNS domain, for the
	// names in the members' certificates (DefaultClusterDomain when
	// empty).
	ClusterDomain string
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// RBAC of the operator, rendered by controller-gen into deploy/.
//
// +kubebuilder:rbac:groups=etcd-manager.dev,resources=etcdclusters;etcdbackups;etcdbackupschedules;etcdrestores,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=etcd-manager.dev,resources=etcdclusters/status;etcdbackups/status;etcdbackupschedules/status;etcdrestores/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the reconciler.
func (r *ClusterReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.EtcdCluster{}).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Named("etcdcluster").
		Complete(r)
}

func (r *ClusterReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile moves one EtcdCluster a step toward its spec.
func (r *ClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lg := log.FromContext(ctx)
	var c v1alpha1.EtcdCluster
	if err := r.Client.Get(ctx, req.NamespacedName, &c); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !c.DeletionTimestamp.IsZero() {
		// Owner references take the StatefulSet, Services and PDB; the
		// StatefulSet's retention policy keeps or deletes the PVCs. The
		// store is never touched.
		return ctrl.Result{}, nil
	}
	st := c.Status.DeepCopy()
	st.ObservedGeneration = c.Generation
	st.Selector = Selector(&c)

	// Another EtcdCluster that names the same store keeps it: nothing is
	// made for this one.
	if other, err := r.olderSharer(ctx, &c); err != nil {
		return r.finish(ctx, &c, st, pollSteady, err)
	} else if other != "" {
		msg := fmt.Sprintf("the backup store %s is the store of EtcdCluster %s: one store holds one cluster; give this cluster a store of its own", c.Spec.BackupStore.URL, other)
		return r.hold(ctx, &c, st, reasonStoreInUse, msg)
	}
	if err := r.ensureCA(ctx, &c); errors.Is(err, errCAMissing) {
		return r.hold(ctx, &c, st, reasonCAMissing, err.Error())
	} else if err != nil {
		setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, "CAUnavailable", err.Error())
		return r.finish(ctx, &c, st, pollSteady, err)
	}

	// The agents' reports and the store, through the agents.
	var status *cli.ClusterStatus
	s, statusErr := r.Engine.Status(ctx, &c)
	if statusErr == nil {
		status = &s
	} else {
		lg.Info("no live status from the agents", "error", statusErr)
	}
	if msg := r.imageLacks(&c, status); msg != "" {
		return r.hold(ctx, &c, st, reasonImageLacks, msg)
	}
	var sts appsv1.StatefulSet
	o := Observed{Desired: Replicas(&c), Version: c.Spec.Version, RestorePending: c.Annotations[AnnotationRestorePending]}
	var existing *appsv1.StatefulSet
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, &sts); {
	case err == nil:
		existing = &sts
		if sts.Spec.Replicas != nil {
			o.StatefulSet = *sts.Spec.Replicas
		}
	case !apierrors.IsNotFound(err):
		return r.finish(ctx, &c, st, pollSteady, err)
	}
	port := ClientPortOf(&c, existing)
	for _, obj := range []client.Object{RenderPeerService(&c, port), RenderClientService(&c, port), RenderPDB(&c)} {
		if err := r.apply(ctx, &c, obj); err != nil {
			return r.finish(ctx, &c, st, pollSteady, err)
		}
	}
	if err := r.ensureClientSecret(ctx, &c); err != nil {
		setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, "ClientCertUnavailable", err.Error())
		return r.finish(ctx, &c, st, pollSteady, err)
	}
	owned, etcdErr := OwnedFields(&c)
	if etcdErr == nil {
		o.Owned = owned
	} else {
		r.Events.Eventf(&c, nil, corev1.EventTypeWarning, reasonInvalidEtcdSpec, "Validate", "spec.etcd is refused, and the store keeps its settings: %v", etcdErr)
	}
	if status != nil {
		o.Members = memberNames(*status)
		if len(status.Unreachable) > 0 || slices.ContainsFunc(status.Agents, func(a cli.AgentStatus) bool { return a.Role == cli.RolePending }) {
			// An agent that did not answer may be a member still: the
			// StatefulSet must not shrink on a partial view.
			o.Members = nil
		}
	}
	storeErr := statusErr
	var use StoreUse
	if statusErr == nil {
		rep, err := r.Engine.Spec(ctx, &c)
		switch {
		case err != nil:
			storeErr = err
		case rep.Invalid != "":
			// Its fields the EtcdCluster does not own (etcd settings set
			// with the ctl, say) would be lost if it were written
			// afresh, so a person decides.
			storeErr = fmt.Errorf("%w: %s", ErrInvalidSpec, rep.Invalid)
		default:
			o.Store, o.StoreKnown = rep.Spec, true
		}
		if err == nil {
			if use, err = r.storeUse(ctx, &c, rep, status); err != nil {
				return r.finish(ctx, &c, st, pollSteady, err)
			}
		}
	}
	inUse, takeOver, unowned := PlanStoreUse(ownerOf(&c), use)
	if inUse != "" {
		return r.hold(ctx, &c, st, reasonStoreInUse, inUse)
	}

	steps := PlanSteps(o)
	if err := r.applyStatefulSet(ctx, &c, RenderOptions{Image: r.Image, Replicas: steps.StatefulSet, ClientPort: port, ClusterDomain: r.ClusterDomain}); err != nil {
		return r.finish(ctx, &c, st, pollSteady, err)
	}
	if o.StatefulSet != 0 && steps.StatefulSet != o.StatefulSet {
		r.Events.Eventf(&c, nil, corev1.EventTypeNormal, reasonScaled, "Scale", "StatefulSet scaled from %d to %d pods", o.StatefulSet, steps.StatefulSet)
	}
	if steps.WriteSpec != nil && storeErr == nil {
		req := operatorapi.WriteSpecRequest{Spec: *steps.WriteSpec, Owner: ownerOf(&c), TakeOver: takeOver, Unowned: unowned}
		switch err := r.Engine.WriteSpec(ctx, &c, req); {
		case errors.Is(err, operatorapi.ErrStoreInUse):
			return r.hold(ctx, &c, st, reasonStoreInUse, err.Error())
		case err != nil:
			r.Events.Eventf(&c, nil, corev1.EventTypeWarning, reasonStoreError, "WriteSpec", "cannot write the cluster spec: %v", err)
			storeErr = err
		default:
			r.Events.Eventf(&c, nil, corev1.EventTypeNormal, reasonSpecWritten, "WriteSpec", "cluster spec written to the store: %s", steps.WriteSpec)
		}
	}

	r.observeStatus(ctx, &c, st, status, storeErr)
	if etcdErr != nil {
		setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, reasonInvalidEtcdSpec,
			"spec.etcd is refused, and the store keeps its settings: "+etcdErr.Error())
	}
	rolling := ""
	if status != nil && storeErr == nil && steps.Waiting == "" && steps.WriteSpec == nil && steps.StatefulSet == o.Desired {
		var err error
		if rolling, err = r.roll(ctx, &c, st, status); err != nil {
			lg.Info("image roll step failed", "error", err)
			rolling = "the image roll: " + err.Error()
		}
	}
	settling := ""
	if status != nil && o.Store != nil && steps.WriteSpec == nil {
		settling = settingsRolling(*status, o.Store.EtcdSettings)
	}
	progressing := steps.Waiting != "" || steps.WriteSpec != nil || st.ReadyReplicas != o.Desired || st.CurrentVersion != c.Spec.Version ||
		rolling != "" || settling != ""
	msg := "the cluster matches its spec"
	switch {
	case steps.Waiting != "":
		msg = "waiting for " + steps.Waiting
	case rolling != "":
		msg = "rolling the pods to a new template: " + rolling
	case storeErr != nil:
		msg = "waiting for a member pod's agent to reach the store: " + storeErr.Error()
	case settling != "":
		msg = "waiting for the agents to roll the etcd settings: " + settling
	case progressing:
		msg = fmt.Sprintf("%d of %d members ready on etcd %s", st.ReadyReplicas, o.Desired, orDash(st.CurrentVersion))
	}
	if progressing {
		setCondition(st, c.Generation, v1alpha1.ConditionProgressing, metav1.ConditionTrue, "Reconciling", msg)
	} else {
		setCondition(st, c.Generation, v1alpha1.ConditionProgressing, metav1.ConditionFalse, "Reconciled", msg)
	}
	poll := pollSteady
	if progressing {
		poll = pollProgress
	}
	return r.finish(ctx, &c, st, poll, nil)
}

// settingsRolling names the members whose etcd runs with other settings
// than the store's spec, which the agents roll one member at a time; ""
// when none does.
func settingsRolling(s cli.ClusterStatus, want spec.Settings) string {
	var behind []string
	for _, a := range s.Agents {
		if isMember(a.Role) && a.Role != cli.RolePending && !a.EtcdSettings.Equal(want) {
			behind = append(behind, a.ID)
		}
	}
	if len(behind) == 0 {
		return ""
	}
	return strings.Join(behind, ", ") + " still run with the settings before"
}

// hold reports a reason to change nothing: Degraded with reason and msg,
// Progressing for as long as it lasts, and an Event when it starts.
func (r *ClusterReconciler) hold(ctx context.Context, c *v1alpha1.EtcdCluster, st *v1alpha1.EtcdClusterStatus, reason, msg string) (ctrl.Result, error) {
	if cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDegraded); cond == nil || cond.Reason != reason {
		r.Events.Eventf(c, nil, corev1.EventTypeWarning, reason, "Hold", "%s; nothing is changed until it is resolved", msg)
	}
	setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, reason, msg)
	setCondition(st, c.Generation, v1alpha1.ConditionProgressing, metav1.ConditionTrue, reason, "held: "+msg)
	return r.finish(ctx, c, st, pollSteady, nil)
}

// ownerOf is the owner record an EtcdCluster writes to its store.
func ownerOf(c *v1alpha1.EtcdCluster) spec.ClusterOwner {
	return spec.ClusterOwner{Kind: spec.OwnerKindEtcdCluster, Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)}
}

// olderSharer names the EtcdCluster, made before c (or, made at once,
// first by name), that names c's store too; "" when none does. The older
// keeps the store unless the store's owner record says otherwise, which
// PlanStoreUse reads.
func (r *ClusterReconciler) olderSharer(ctx context.Context, c *v1alpha1.EtcdCluster) (string, error) {
	var all v1alpha1.EtcdClusterList
	if err := r.Client.List(ctx, &all); err != nil {
		return "", fmt.Errorf("operator: list EtcdClusters: %w", err)
	}
	for _, o := range all.Items {
		if o.UID == c.UID || !o.DeletionTimestamp.IsZero() || !sameStore(o.Spec.BackupStore.URL, c.Spec.BackupStore.URL) {
			continue
		}
		older := o.CreationTimestamp.Before(&c.CreationTimestamp) ||
			(o.CreationTimestamp.Equal(&c.CreationTimestamp) && o.Namespace+"/"+o.Name < c.Namespace+"/"+c.Name)
		if older && !heldForStore(&o) {
			return o.Namespace + "/" + o.Name, nil
		}
	}
	return "", nil
}

// heldForStore says whether c is held because its store is in use: such
// a sharer keeps nothing from the others. (A cluster made again after a
// copy of it was made is younger than the copy, and the store's owner
// record, which names it, holds the copy instead.)
func heldForStore(c *v1alpha1.EtcdCluster) bool {
	cond := meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionDegraded)
	return cond != nil && cond.Status == metav1.ConditionTrue && cond.Reason == reasonStoreInUse
}

// storeUse gathers what PlanStoreUse decides on.
func (r *ClusterReconciler) storeUse(ctx context.Context, c *v1alpha1.EtcdCluster, rep operatorapi.SpecReply, status *cli.ClusterStatus) (StoreUse, error) {
	u := StoreUse{Owner: rep.Owner, HasSpec: rep.Spec != nil || rep.Invalid != "",
		TakeOver: c.Annotations[AnnotationRestoredBy] != "" || c.Annotations[AnnotationTakeOverStore] == "true"}
	if status != nil {
		u.OwnMembers = slices.ContainsFunc(status.Agents, func(a cli.AgentStatus) bool { return isMember(a.Role) && ownPod(c, a.ID) })
	}
	if o := rep.Owner; o != nil && !o.Same(ownerOf(c)) && o.Kind == spec.OwnerKindEtcdCluster {
		var other v1alpha1.EtcdCluster
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, &other)
		switch {
		case err == nil:
			u.OwnerExists = other.DeletionTimestamp.IsZero()
		case apierrors.IsNotFound(err):
		case apierrors.IsForbidden(err):
			u.OwnerExists = true // out of the operator's sight: it may well exist
		default:
			return u, fmt.Errorf("operator: the store's owner %s: %w", o, err)
		}
	}
	return u, nil
}

// imageLacks says which etcd versions the default member image lacks that
// c needs (the one it asks for, and those its members run), when c runs
// on that image and its versions are known; "" otherwise.
func (r *ClusterReconciler) imageLacks(c *v1alpha1.EtcdCluster, status *cli.ClusterStatus) string {
	if c.Spec.Image != "" || r.ImageVersions == nil {
		return ""
	}
	need := []string{c.Spec.Version}
	if status != nil {
		for _, a := range status.Agents {
			if isMember(a.Role) && a.EtcdVersion != "" && !slices.Contains(need, a.EtcdVersion) {
				need = append(need, a.EtcdVersion)
			}
		}
	}
	var lacks []string
	for _, v := range need {
		if !slices.Contains(r.ImageVersions, v) {
			lacks = append(lacks, v)
		}
	}
	if len(lacks) == 0 {
		return ""
	}
	return fmt.Sprintf("the member image %s carries etcd %s, not %s, which the cluster needs (spec.version, or a version its members run): set spec.image to an image that carries it, or move spec.version to one this image carries one minor at a time",
		r.Image, strings.Join(r.ImageVersions, ", "), strings.Join(lacks, ", "))
}

// observeStatus fills in the members, the conditions and the last backup.
func (r *ClusterReconciler) observeStatus(ctx context.Context, c *v1alpha1.EtcdCluster, st *v1alpha1.EtcdClusterStatus, status *cli.ClusterStatus, podErr error) {
	want := Replicas(c)
	if status != nil {
		before := map[string]bool{}
		for _, m := range st.Members {
			before[m.Name] = true
		}
		st.Members = membersOf(*status)
		st.Leader = status.EtcdLeader
		st.Replicas = int32(len(st.Members))
		st.ReadyReplicas = 0
		versions := map[string]bool{}
		now := map[string]bool{}
		for _, m := range st.Members {
			now[m.Name] = true
			if m.Healthy && !m.Learner {
				st.ReadyReplicas++
			}
			if m.Version != "" {
				versions[m.Version] = true
			}
			if !before[m.Name] && len(before) > 0 {
				r.Events.Eventf(c, nil, corev1.EventTypeNormal, reasonMemberAdded, "AddMember", "member %s joined the cluster", m.Name)
			}
		}
		for name := range before {
			if !now[name] {
				r.Events.Eventf(c, nil, corev1.EventTypeNormal, reasonMemberRemoved, "RemoveMember", "member %s left the cluster", name)
			}
		}
		st.CurrentVersion = ""
		if len(versions) == 1 {
			for v := range versions {
				st.CurrentVersion = v
			}
		}
	}
	st.ReadyMembers = fmt.Sprintf("%d/%d", st.ReadyReplicas, want)
	switch {
	case status == nil:
		setCondition(st, c.Generation, v1alpha1.ConditionAvailable, metav1.ConditionFalse, "NoStatus", "no agent reported the cluster's status yet")
	case st.ReadyReplicas >= want && st.Replicas == want:
		setCondition(st, c.Generation, v1alpha1.ConditionAvailable, metav1.ConditionTrue, "AllMembersReady", fmt.Sprintf("%d of %d members healthy", st.ReadyReplicas, want))
	case st.ReadyReplicas > max(st.Replicas, want)/2:
		setCondition(st, c.Generation, v1alpha1.ConditionAvailable, metav1.ConditionTrue, "QuorumReady", fmt.Sprintf("%d of %d members healthy: etcd serves", st.ReadyReplicas, want))
	default:
		setCondition(st, c.Generation, v1alpha1.ConditionAvailable, metav1.ConditionFalse, "NoQuorum", fmt.Sprintf("%d of %d members healthy", st.ReadyReplicas, want))
	}
	switch {
	case errors.Is(podErr, ErrInvalidSpec):
		setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, "StoreSpecInvalid", podErr.Error())
	case podErr != nil:
		setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, "StoreUnreachable", podErr.Error())
	case status != nil && (st.ReadyReplicas < want || len(status.Unreachable) > 0):
		setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, "MemberUnhealthy",
			fmt.Sprintf("%d of %d members healthy; agents not answering: %d", st.ReadyReplicas, want, len(status.Unreachable)))
	case status != nil && len(status.Failing) > 0:
		setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, "ChangeFailing", strings.Join(status.Failing, "; "))
	default:
		setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionFalse, "Healthy", "no member is unhealthy")
	}
	if podErr == nil {
		r.observeBackups(ctx, c, st)
	}
}

func (r *ClusterReconciler) observeBackups(ctx context.Context, c *v1alpha1.EtcdCluster, st *v1alpha1.EtcdClusterStatus) {
	rows, err := r.Engine.Backups(ctx, c)
	if err != nil {
		setCondition(st, c.Generation, v1alpha1.ConditionBackupReady, metav1.ConditionUnknown, "ListFailed", err.Error())
		return
	}
	if len(rows) == 0 {
		setCondition(st, c.Generation, v1alpha1.ConditionBackupReady, metav1.ConditionFalse, "NoBackup", "the store holds no backup yet")
		return
	}
	last := rows[len(rows)-1]
	at := r.now().Add(-time.Duration(last.AgeSeconds * float64(time.Second))).Truncate(time.Second)
	if st.LastBackup == nil || st.LastBackup.Name != last.Name {
		st.LastBackup = &v1alpha1.BackupRef{Name: last.Name, Time: metav1.NewTime(at)}
	}
	interval := 15 * time.Minute
	if b := c.Spec.Backup; b != nil && b.Interval != nil {
		interval = b.Interval.Duration
	}
	if age := time.Duration(last.AgeSeconds * float64(time.Second)); age > 2*interval {
		setCondition(st, c.Generation, v1alpha1.ConditionBackupReady, metav1.ConditionFalse, "BackupStale",
			fmt.Sprintf("the newest backup, %s, is %s old, over twice the interval of %s", last.Name, age.Round(time.Second), interval))
		return
	}
	setCondition(st, c.Generation, v1alpha1.ConditionBackupReady, metav1.ConditionTrue, "BackupRecent", "newest backup: "+last.Name)
}

func (r *ClusterReconciler) finish(ctx context.Context, c *v1alpha1.EtcdCluster, st *v1alpha1.EtcdClusterStatus, poll time.Duration, err error) (ctrl.Result, error) {
	if st.ReadyMembers == "" {
		st.ReadyMembers = fmt.Sprintf("%d/%d", st.ReadyReplicas, Replicas(c))
	}
	c.Status = *st
	if uerr := r.Client.Status().Update(ctx, c); uerr != nil && !apierrors.IsConflict(uerr) {
		return ctrl.Result{}, errors.Join(err, fmt.Errorf("operator: status of %s/%s: %w", c.Namespace, c.Name, uerr))
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: poll}, nil
}

func (r *ClusterReconciler) apply(ctx context.Context, c *v1alpha1.EtcdCluster, want client.Object) error {
	obj := want.DeepCopyObject().(client.Object)
	obj.SetResourceVersion("")
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error {
		switch o := obj.(type) {
		case *corev1.Service:
			w := want.(*corev1.Service)
			o.Labels = w.Labels
			o.Spec.Selector, o.Spec.Ports, o.Spec.PublishNotReadyAddresses = w.Spec.Selector, w.Spec.Ports, w.Spec.PublishNotReadyAddresses
			if o.CreationTimestamp.IsZero() {
				o.Spec = w.Spec
			}
		case *policyv1.PodDisruptionBudget:
			w := want.(*policyv1.PodDisruptionBudget)
			o.Labels, o.Spec = w.Labels, w.Spec
		}
		return controllerutil.SetControllerReference(c, obj, r.Client.Scheme())
	})
	if err != nil {
		return fmt.Errorf("operator: apply %T %s: %w", want, want.GetName(), err)
	}
	return nil
}

// annotationTemplateHash is the hash of the pod template the operator
// rendered last, so that it updates the template only when it changed (the
// API server's defaults make the stored template differ from the rendered).
const annotationTemplateHash = "etcd-manager.dev/template-hash"

func (r *ClusterReconciler) applyStatefulSet(ctx context.Context, c *v1alpha1.EtcdCluster, o RenderOptions) error {
	want, err := RenderStatefulSet(c, o)
	if err != nil {
		return err
	}
	hash, err := templateHash(want.Spec.Template)
	if err != nil {
		return err
	}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: want.Name, Namespace: want.Namespace}}
	_, err = controllerutil.CreateOrUpdate(ctx, r.Client, sts, func() error {
		switch {
		case sts.CreationTimestamp.IsZero():
			sts.Spec = want.Spec
		case sts.Annotations[annotationTemplateHash] != hash:
			// The selector and claim templates are fixed; a new template
			// reaches the pods as the operator replaces them (OnDelete).
			sts.Spec.Template = want.Spec.Template
		}
		sts.Spec.PersistentVolumeClaimRetentionPolicy = want.Spec.PersistentVolumeClaimRetentionPolicy
		sts.Spec.Replicas = want.Spec.Replicas
		sts.Labels = want.Labels
		if sts.Annotations == nil {
			sts.Annotations = map[string]string{}
		}
		sts.Annotations[annotationTemplateHash] = hash
		return controllerutil.SetControllerReference(c, sts, r.Client.Scheme())
	})
	if err != nil {
		return fmt.Errorf("operator: apply StatefulSet %s: %w", want.Name, err)
	}
	return nil
}

func templateHash(t corev1.PodTemplateSpec) (string, error) {
	b, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("operator: hash the pod template: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), nil
}

// roll replaces one outdated pod when it is safe to: see PlanRoll. It
// returns what the roll waits for or did, empty when no pod is outdated.
func (r *ClusterReconciler) roll(ctx context.Context, c *v1alpha1.EtcdCluster, st *v1alpha1.EtcdClusterStatus, status *cli.ClusterStatus) (string, error) {
	var sts appsv1.StatefulSet
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, &sts); err != nil {
		return "", err
	}
	if sts.Status.UpdateRevision == "" || sts.Status.ObservedGeneration < sts.Generation {
		return "", nil
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(c.Namespace), client.MatchingLabels(selectorLabels(c))); err != nil {
		return "", err
	}
	members := map[string]v1alpha1.MemberStatus{}
	for _, m := range st.Members {
		members[m.Name] = m
	}
	var rp []RollPod
	for _, p := range pods.Items {
		ready := p.DeletionTimestamp == nil
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady {
				ready = ready && cond.Status == corev1.ConditionTrue
			}
		}
		m := members[p.Name]
		rp = append(rp, RollPod{Name: p.Name, Current: p.Labels[appsv1.ControllerRevisionHashLabelKey] == sts.Status.UpdateRevision,
			Ready: ready, Healthy: m.Healthy && !m.Learner, Leader: st.Leader == p.Name})
	}
	step := PlanRoll(rp, Replicas(c))
	if step.Delete != "" || step.MoveLeaderFrom != "" {
		// The engine must be idle: no version change, procedure or failing
		// change under way, and a known leader.
		switch {
		case st.CurrentVersion != c.Spec.Version:
			return "the agents to finish the version change", nil
		case st.Leader == "":
			return "a known leader", nil
		case len(status.Failing) > 0:
			return "the engine's failing changes to clear: " + strings.Join(status.Failing, "; "), nil
		case c.Spec.Storage == nil && Replicas(c) == 1:
			return "nothing: a single member on an emptyDir would lose its data; give it storage or more replicas", nil
		}
		for _, a := range status.Agents {
			if a.Procedure != "" {
				return "the engine's " + a.Procedure + " to finish", nil
			}
		}
	}
	switch {
	case step.Delete != "":
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: step.Delete}}
		if err := r.Client.Delete(ctx, p); client.IgnoreNotFound(err) != nil {
			return "", err
		}
		r.Events.Eventf(c, nil, corev1.EventTypeNormal, reasonRollStep, "Roll", "replaced pod %s for the new pod template", step.Delete)
		return "replaced pod " + step.Delete, nil
	case step.MoveLeaderFrom != "":
		to := ""
		for _, p := range rp {
			if p.Name != step.MoveLeaderFrom && p.Healthy && (to == "" || p.Current) {
				to = members[p.Name].ID
			}
		}
		if to == "" {
			return "a member to hand leadership to", nil
		}
		id, err := strconv.ParseUint(to, 16, 64)
		if err != nil {
			return "", fmt.Errorf("operator: member ID %q: %w", to, err)
		}
		if err := r.Engine.MoveLeader(ctx, c, step.MoveLeaderFrom, id); err != nil {
			return "", err
		}
		r.Events.Eventf(c, nil, corev1.EventTypeNormal, reasonRollStep, "MoveLeader", "moved leadership off %s before replacing its pod", step.MoveLeaderFrom)
		return "moved leadership off " + step.MoveLeaderFrom, nil
	}
	return step.Waiting, nil
}

// errCAMissing means the CA Secret of a live cluster is gone: a new CA
// would not be trusted by the members that still run, so none is made.
var errCAMissing = errors.New("operator: the CA Secret is missing")

// ensureCA makes sure the CA Secret exists: the named one must; <name>-ca
// is generated for a new cluster. Every cluster has one: the agents' peer
// API, which the operator calls, runs mutual TLS even when etcd runs none.
// A live cluster's CA is never generated again: its members trust the one
// they have, and a pod started with another could not rejoin them.
func (r *ClusterReconciler) ensureCA(ctx context.Context, c *v1alpha1.EtcdCluster) error {
	var sec corev1.Secret
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: CASecretName(c)}, &sec)
	switch {
	case err == nil:
		if len(sec.Data[corev1.TLSCertKey]) == 0 || len(sec.Data[corev1.TLSPrivateKeyKey]) == 0 {
			return fmt.Errorf("operator: Secret %s lacks %s or %s", sec.Name, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
		}
		// A generated CA goes with the cluster only under Delete, as the
		// policy says now.
		if sec.Labels[labelManagedBy] == managerName {
			owned := metav1.IsControlledBy(&sec, c)
			if want := c.Spec.DeletionPolicy == v1alpha1.DeletionDelete; want != owned {
				if want {
					if err := controllerutil.SetControllerReference(c, &sec, r.Client.Scheme()); err != nil {
						return err
					}
				} else {
					sec.OwnerReferences = slices.DeleteFunc(sec.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == c.UID })
				}
				if err := r.Client.Update(ctx, &sec); err != nil {
					return fmt.Errorf("operator: CA Secret owner: %w", err)
				}
			}
		}
		return nil
	case !apierrors.IsNotFound(err):
		return err
	case c.Spec.TLS != nil && c.Spec.TLS.CASecret != "":
		return fmt.Errorf("%w: the Secret %s named by spec.tls.caSecret does not exist; create it with the CA as tls.crt and tls.key", errCAMissing, c.Spec.TLS.CASecret)
	}
	if live, err := r.live(ctx, c); err != nil {
		return err
	} else if live {
		return fmt.Errorf("%w: Secret %s is gone while the cluster runs; nothing is restarted until it is back: restore it (tls.crt and tls.key of the same CA) from your own copy, or from a member pod's /etc/etcd-manager/pki (ca.crt, ca.key) while one runs", errCAMissing, CASecretName(c))
	}
	ca, err := pki.GenerateCA(r.now(), pki.DefaultCAValidity)
	if err != nil {
		return err
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	certPEM := ca.CertPEM
	sec = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: CASecretName(c), Namespace: c.Namespace, Labels: commonLabels(c)},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
	}
	if c.Spec.DeletionPolicy == v1alpha1.DeletionDelete {
		if err := controllerutil.SetControllerReference(c, &sec, r.Client.Scheme()); err != nil {
			return err
		}
	}
	if err := r.Client.Create(ctx, &sec); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("operator: create the CA Secret: %w", err)
	}
	r.Events.Eventf(c, nil, corev1.EventTypeNormal, reasonCAGenerated, "GenerateCA", "generated the cluster's CA into Secret %s", sec.Name)
	return nil
}

// live says whether c has run: its StatefulSet exists, or its status has
// members. A CA made for it now would not be its members' CA.
func (r *ClusterReconciler) live(ctx context.Context, c *v1alpha1.EtcdCluster) (bool, error) {
	if len(c.Status.Members) > 0 {
		return true, nil
	}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, &appsv1.StatefulSet{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, err
}

// isMember says whether an agent's role is that of an etcd member.
func isMember(role string) bool {
	return role != cli.RoleStandby && role != cli.RolePending && role != ""
}

// memberNames are the names of etcd's members among the agents' reports.
func memberNames(s cli.ClusterStatus) []string {
	names := []string{}
	for _, a := range s.Agents {
		if isMember(a.Role) {
			names = append(names, a.ID)
		}
	}
	return names
}

func membersOf(s cli.ClusterStatus) []v1alpha1.MemberStatus {
	var out []v1alpha1.MemberStatus
	for _, a := range s.Agents {
		if !isMember(a.Role) {
			continue
		}
		role := "follower"
		switch {
		case a.Role == cli.RoleLearner:
			role = "learner"
		case a.EtcdLeader:
			role = "leader"
		}
		out = append(out, v1alpha1.MemberStatus{Name: a.ID, ID: a.MemberID, Role: role, Version: a.EtcdVersion, Healthy: a.Healthy, Learner: a.Role == cli.RoleLearner})
	}
	sort.Slice(out, func(i, j int) bool { return ordinalLess(out[i].Name, out[j].Name) })
	return out
}

// ordinalLess orders StatefulSet pod names by their ordinals, as numbers.
func ordinalLess(a, b string) bool {
	x, _ := spec.Ordinal(a)
	y, _ := spec.Ordinal(b)
	return x < y
}

func setCondition(st *v1alpha1.EtcdClusterStatus, gen int64, typ string, status metav1.ConditionStatus, reason, msg string) {
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// OwnedFields converts spec.etcd into the store spec's fields it sets,
// and checks them as configure-cluster would, against spec.version.
func OwnedFields(c *v1alpha1.EtcdCluster) (Owned, error) {
	var w Owned
	e := c.Spec.Etcd
	if e == nil {
		return w, nil
	}
	if e.Settings != nil {
		s := spec.Settings(maps.Clone(e.Settings))
		w.Settings = &s
	}
	if p := e.Compaction; p != nil {
		w.Compaction = &[2]string{p.Mode, p.Retention}
	}
	if p := e.Defrag; p != nil {
		d := spec.DefragPolicy{Window: p.Window, Off: p.Auto != nil && !*p.Auto}
		if p.MinReclaimableBytes != nil {
			d.MinReclaimableBytes = *p.MinReclaimableBytes
		}
		if p.MinReclaimablePercent != nil {
			d.MinReclaimableFraction = float64(*p.MinReclaimablePercent) / 100
		}
		if p.QuotaPercent != nil {
			d.QuotaPercent = int(*p.QuotaPercent)
		}
		if p.WindowDuration != nil {
			d.WindowDuration = p.WindowDuration.Duration.String()
		}
		w.Defrag = &d
	}
	check := spec.ClusterSpec{MemberCount: Replicas(c), EtcdVersion: c.Spec.Version}
	w.apply(&check)
	if _, err := check.Validate(); err != nil {
		return Owned{}, err
	}
	return w, nil
}
