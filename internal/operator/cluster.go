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
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// StoreCtl is what the reconciles need of the store and the agents.
type StoreCtl interface {
	Spec(ctx context.Context, c *v1alpha1.EtcdCluster, pod string) (*spec.ClusterSpec, error)
	WriteSpec(ctx context.Context, c *v1alpha1.EtcdCluster, pod string, cs spec.ClusterSpec) error
	Status(ctx context.Context, c *v1alpha1.EtcdCluster, pod string) (cli.ClusterStatus, error)
	Backups(ctx context.Context, c *v1alpha1.EtcdCluster, pod string) ([]cli.BackupRow, error)
	Commands(ctx context.Context, c *v1alpha1.EtcdCluster, pod string) ([]cli.CommandRow, error)
	BackupNow(ctx context.Context, c *v1alpha1.EtcdCluster, pod string) (string, error)
	RestoreBackup(ctx context.Context, c *v1alpha1.EtcdCluster, pod, backup string) (string, error)
	MoveLeader(ctx context.Context, c *v1alpha1.EtcdCluster, pod, version, to string) error
}

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
)

// Requeue intervals: status is polled, since the engine does not call back.
const (
	pollSteady   = 15 * time.Second
	pollProgress = 3 * time.Second
)

// ClusterReconciler reconciles EtcdCluster objects.
type ClusterReconciler struct {
	Client client.Client
	Ctl    StoreCtl
	Events events.EventRecorder
	// Image is the image member pods run unless spec.image says otherwise.
	Image string
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
// +kubebuilder:rbac:groups="",resources=pods/exec,verbs=get;create
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

	if err := r.ensureCA(ctx, &c); err != nil {
		setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, "CAUnavailable", err.Error())
		return r.finish(ctx, &c, st, pollSteady, err)
	}
	for _, obj := range []client.Object{RenderPeerService(&c), RenderClientService(&c), RenderPDB(&c)} {
		if err := r.apply(ctx, &c, obj); err != nil {
			return r.finish(ctx, &c, st, pollSteady, err)
		}
	}

	var sts appsv1.StatefulSet
	o := Observed{Desired: Replicas(&c), Version: c.Spec.Version, RestorePending: c.Annotations[AnnotationRestorePending]}
	owned, etcdErr := OwnedFields(&c)
	if etcdErr == nil {
		o.Owned = owned
	} else {
		r.Events.Eventf(&c, nil, corev1.EventTypeWarning, reasonInvalidEtcdSpec, "Validate", "spec.etcd is refused, and the store keeps its settings: %v", etcdErr)
	}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, &sts); {
	case err == nil:
		if sts.Spec.Replicas != nil {
			o.StatefulSet = *sts.Spec.Replicas
		}
	case !apierrors.IsNotFound(err):
		return r.finish(ctx, &c, st, pollSteady, err)
	}

	// The store and the agents are read through a running member pod.
	pod, podErr := RunningPod(ctx, r.Client, &c)
	var status *cli.ClusterStatus
	if podErr == nil {
		if s, err := r.Ctl.Status(ctx, &c, pod); err == nil {
			status = &s
			o.Members = memberNames(s)
			if len(s.Unreachable) > 0 || slices.ContainsFunc(s.Agents, func(a cli.AgentStatus) bool { return a.Role == cli.RolePending }) {
				// An agent that did not answer may be a member still: the
				// StatefulSet must not shrink on a partial view.
				o.Members = nil
			}
		} else {
			lg.Info("no live status from the agents", "pod", pod, "error", err)
		}
		// The status carries the store's spec when it is readable; only
		// without it is the store asked on its own, to tell "none yet"
		// from an error.
		if status != nil && status.Spec != nil {
			o.Store, o.StoreKnown = status.Spec, true
		} else {
			cs, err := r.Ctl.Spec(ctx, &c, pod)
			switch {
			case err == nil:
				o.Store, o.StoreKnown = cs, true
			case errors.Is(err, ErrNoSpec):
				o.StoreKnown = true
			default:
				// An invalid spec too: its fields the EtcdCluster does not
				// own (etcd settings set with the ctl, say) would be lost
				// if it were written afresh, so a person decides.
				podErr = err
			}
		}
	}

	steps := PlanSteps(o)
	if err := r.applyStatefulSet(ctx, &c, steps.StatefulSet); err != nil {
		return r.finish(ctx, &c, st, pollSteady, err)
	}
	if o.StatefulSet != 0 && steps.StatefulSet != o.StatefulSet {
		r.Events.Eventf(&c, nil, corev1.EventTypeNormal, reasonScaled, "Scale", "StatefulSet scaled from %d to %d pods", o.StatefulSet, steps.StatefulSet)
	}
	if steps.WriteSpec != nil && podErr == nil {
		if err := r.Ctl.WriteSpec(ctx, &c, pod, *steps.WriteSpec); err != nil {
			r.Events.Eventf(&c, nil, corev1.EventTypeWarning, reasonStoreError, "WriteSpec", "cannot write the cluster spec: %v", err)
			podErr = err
		} else {
			r.Events.Eventf(&c, nil, corev1.EventTypeNormal, reasonSpecWritten, "WriteSpec", "cluster spec written to the store: %s", steps.WriteSpec)
		}
	}

	r.observeStatus(ctx, &c, st, status, pod, podErr)
	if etcdErr != nil {
		setCondition(st, c.Generation, v1alpha1.ConditionDegraded, metav1.ConditionTrue, reasonInvalidEtcdSpec,
			"spec.etcd is refused, and the store keeps its settings: "+etcdErr.Error())
	}
	rolling := ""
	if status != nil && podErr == nil && steps.Waiting == "" && steps.WriteSpec == nil && steps.StatefulSet == o.Desired {
		var err error
		if rolling, err = r.roll(ctx, &c, st, status); err != nil {
			lg.Info("image roll step failed", "error", err)
			rolling = "the image roll: " + err.Error()
		}
	}
	progressing := steps.Waiting != "" || steps.WriteSpec != nil || st.ReadyReplicas != o.Desired || st.CurrentVersion != c.Spec.Version || rolling != ""
	msg := "the cluster matches its spec"
	switch {
	case steps.Waiting != "":
		msg = "waiting for " + steps.Waiting
	case rolling != "":
		msg = "rolling the pods to a new template: " + rolling
	case podErr != nil:
		msg = "waiting for a running member pod to reach the store: " + podErr.Error()
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

// observeStatus fills in the members, the conditions and the last backup.
func (r *ClusterReconciler) observeStatus(ctx context.Context, c *v1alpha1.EtcdCluster, st *v1alpha1.EtcdClusterStatus, status *cli.ClusterStatus, pod string, podErr error) {
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
		r.observeBackups(ctx, c, st, pod)
	}
}

func (r *ClusterReconciler) observeBackups(ctx context.Context, c *v1alpha1.EtcdCluster, st *v1alpha1.EtcdClusterStatus, pod string) {
	rows, err := r.Ctl.Backups(ctx, c, pod)
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

// RunningPod is the name of the lowest-ordinal member pod of c whose agent
// container runs.
func RunningPod(ctx context.Context, cl client.Client, c *v1alpha1.EtcdCluster) (string, error) {
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace(c.Namespace), client.MatchingLabels(selectorLabels(c))); err != nil {
		return "", err
	}
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == container && cs.State.Running != nil {
				names = append(names, p.Name)
			}
		}
	}
	if len(names) == 0 {
		return "", errors.New("no member pod is running")
	}
	sort.Slice(names, func(i, j int) bool { return ordinalLess(names[i], names[j]) })
	return names[0], nil
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

func (r *ClusterReconciler) applyStatefulSet(ctx context.Context, c *v1alpha1.EtcdCluster, replicas int32) error {
	want, err := RenderStatefulSet(c, r.Image, replicas)
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
		version := st.CurrentVersion
		if version == "" {
			version = c.Spec.Version
		}
		if err := r.Ctl.MoveLeader(ctx, c, step.MoveLeaderFrom, version, to); err != nil {
			return "", err
		}
		r.Events.Eventf(c, nil, corev1.EventTypeNormal, reasonRollStep, "MoveLeader", "moved leadership off %s before replacing its pod", step.MoveLeaderFrom)
		return "moved leadership off " + step.MoveLeaderFrom, nil
	}
	return step.Waiting, nil
}

// ensureCA makes sure the CA Secret exists: the named one must; <name>-ca
// is generated when missing.
func (r *ClusterReconciler) ensureCA(ctx context.Context, c *v1alpha1.EtcdCluster) error {
	if !TLSEnabled(c) {
		return nil
	}
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
		return fmt.Errorf("operator: the CA Secret %s named by spec.tls.caSecret does not exist", c.Spec.TLS.CASecret)
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
