package envtest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/operator"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// realNamespace makes a namespace whose clusters the real engine serves.
func realNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "real-"}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// standIn is a member pod that the kubelet would run, whose address is a
// real agent's on loopback: the operator reaches the agent through it.
func standIn(t *testing.T, c *v1alpha1.EtcdCluster, name, ip string) {
	t.Helper()
	ctx := t.Context()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.Namespace, Labels: map[string]string{operator.LabelCluster: c.Name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd-manager", Image: "etcd-manager:test",
			Ports: []corev1.ContainerPort{{Name: "agent", ContainerPort: operator.AgentPort}}}}},
	}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "etcd-manager", Ready: true, Image: "etcd-manager:test", ImageID: "x",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
	}}}
	if err := k8s.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
}

// realCluster runs an EtcdCluster of n members on real agents: the
// operator makes the CA, the test gives it to agents named as the pods,
// and stand-in pods carry the agents' addresses.
func realCluster(t *testing.T, ns, name string, n int) (*v1alpha1.EtcdCluster, *harness.Env, []*harness.Agent) {
	t.Helper()
	ctx := t.Context()
	env := harness.NewEnv(t)
	replicas := int32(n)
	c := &v1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.EtcdClusterSpec{Replicas: &replicas, Version: harness.DefaultEtcdVersion,
			// The volume is the pods' way to the store; the agents here
			// reach the same folder directly.
			BackupStore: v1alpha1.BackupStore{URL: env.StoreURL, Volume: &corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: env.StoreDir}}}},
	}
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	var ca corev1.Secret
	waitFor(t, "the CA Secret", 30*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-ca"}, &ca)
		return err == nil, fmt.Sprint(err)
	})
	var agents []*harness.Agent
	for i := range n {
		pod := fmt.Sprintf("%s-%d", name, i)
		pki := filepath.Join(env.Root, "pki-"+pod)
		if err := os.MkdirAll(pki, 0o700); err != nil {
			t.Fatal(err)
		}
		for file, key := range map[string]string{"ca.crt": corev1.TLSCertKey, "ca.key": corev1.TLSPrivateKeyKey} {
			if err := os.WriteFile(filepath.Join(pki, file), ca.Data[key], 0o600); err != nil {
				t.Fatal(err)
			}
		}
		a := env.StartAgent(pod, harness.AgentOptions{ExtraArgs: []string{"--cluster-name=" + name, "--node-name=" + pod, "--pki-dir=" + pki}})
		agents = append(agents, a)
		standIn(t, c, pod, strings.Split(a.PeerAPI, ":")[0])
	}
	return c, env, agents
}

func getCluster(t *testing.T, c *v1alpha1.EtcdCluster) *v1alpha1.EtcdCluster {
	t.Helper()
	var got v1alpha1.EtcdCluster
	if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(c), &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

// reconciled says whether the cluster is Available with every member
// healthy, and Progressing is back to False.
func reconciled(t *testing.T, c *v1alpha1.EtcdCluster, n int32) (bool, string) {
	got := getCluster(t, c)
	p := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgressing)
	return meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionAvailable) && got.Status.ReadyReplicas == n &&
		p != nil && p.Status == metav1.ConditionFalse, fmt.Sprintf("ready %d; %+v", got.Status.ReadyReplicas, p)
}

// etcdArgs is the command line the agent's etcd runs with, from /proc:
// what etcd itself was given.
func etcdArgs(t *testing.T, a *harness.Agent) string {
	t.Helper()
	pid := a.EtcdPID()
	if pid == 0 {
		return ""
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
}

func readStore(t *testing.T, url string) (spec.ClusterSpec, spec.ClusterOwner) {
	t.Helper()
	s, err := store.Open(t.Context(), url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cs, err := s.ReadSpec(t.Context())
	if err != nil {
		t.Fatalf("the store's spec: %v", err)
	}
	o, err := s.ReadOwner(t.Context())
	if err != nil {
		t.Fatalf("the store's owner: %v", err)
	}
	return cs, o
}

func countEvents(t *testing.T, ns, object, reason string) int {
	t.Helper()
	var evs eventsv1.EventList
	if err := k8s.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.Regarding.Name == object && e.Reason == reason {
			n += max(1, int(e.DeprecatedCount))
			if e.Series != nil {
				n += int(e.Series.Count) - 1
			}
		}
	}
	return n
}

// The operator writes the whole spec through the agents' peer API, with no
// pods/exec: every field of spec.etcd reaches the store and each member's
// etcd, once, and the cluster settles; a second EtcdCluster on the same
// store is refused and changes nothing.
func TestSpecReachesTheAgents(t *testing.T) {
	ns := realNamespace(t)
	ctx := t.Context()
	c, env, agents := realCluster(t, ns, "etcd", 3)

	waitFor(t, "a 3-member cluster, reconciled", 2*time.Minute, func() (bool, string) { return reconciled(t, c, 3) })
	cs, owner := readStore(t, env.StoreURL)
	if cs.MemberCount != 3 || cs.EtcdVersion != harness.DefaultEtcdVersion || !cs.OrdinalMembers {
		t.Errorf("the store's spec %v", cs)
	}
	if owner.Namespace != ns || owner.Name != "etcd" || owner.Kind != "EtcdCluster" || owner.UID != string(getCluster(t, c).UID) {
		t.Errorf("the store's owner %+v", owner)
	}

	// spec.etcd: settings, compaction, defrag policy, all of them.
	patchSpec(t, c, `{"spec":{"etcd":{"settings":{"snapshot-count":"5000"},"compaction":{"mode":"revision","retention":"1000"},"defrag":{"window":"0 3 * * *"}}}}`)
	waitFor(t, "snapshot-count in every member's etcd, and the cluster settled", 3*time.Minute, func() (bool, string) {
		for _, a := range agents {
			if args := etcdArgs(t, a); !strings.Contains(args, "--snapshot-count=5000") {
				return false, a.Name + "'s etcd runs " + args
			}
		}
		return reconciled(t, c, 3)
	})
	cs, _ = readStore(t, env.StoreURL)
	if cs.EtcdSettings["snapshot-count"] != "5000" || cs.AutoCompactionMode != "revision" || cs.AutoCompactionRetention != "1000" ||
		cs.Defrag == nil || cs.Defrag.Window != "0 3 * * *" || cs.MemberCount != 3 {
		t.Errorf("the store's spec after spec.etcd: %v", cs)
	}
	// Once written, the spec is not written again: no Event every cycle.
	written := countEvents(t, ns, "etcd", "SpecWritten")
	time.Sleep(10 * time.Second) // three reconciles or more
	if again := countEvents(t, ns, "etcd", "SpecWritten"); again != written {
		t.Errorf("the spec was written %d more times after it matched", again-written)
	}
	if p := meta.FindStatusCondition(getCluster(t, c).Status.Conditions, v1alpha1.ConditionProgressing); p == nil || p.Status != metav1.ConditionFalse {
		t.Errorf("Progressing %+v, want False", p)
	}

	// A flag outside the allow-list passes the API server's rules but not
	// the operator's: Degraded says why, and the store keeps its settings.
	patchSpec(t, c, `{"spec":{"etcd":{"settings":{"data-dir":"/tmp"}}}}`)
	waitFor(t, "Degraded for the refused spec.etcd", 30*time.Second, func() (bool, string) {
		cond := meta.FindStatusCondition(getCluster(t, c).Status.Conditions, v1alpha1.ConditionDegraded)
		return cond != nil && cond.Status == metav1.ConditionTrue && cond.Reason == "InvalidEtcdSpec" && strings.Contains(cond.Message, "data-dir"), fmt.Sprintf("%+v", cond)
	})
	if cs, _ := readStore(t, env.StoreURL); cs.EtcdSettings["snapshot-count"] != "5000" || cs.EtcdSettings["data-dir"] != "" {
		t.Fatalf("the store's settings after a refused spec.etcd: %v", cs.EtcdSettings)
	}

	// A copy under another name, on the same store: held, nothing made,
	// nothing written.
	cp := &v1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: "copy", Namespace: ns}, Spec: *c.Spec.DeepCopy()}
	one := int32(1)
	cp.Spec.Replicas = &one
	cp.Spec.Etcd = nil
	if err := k8s.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the copy held with StoreInUse", 30*time.Second, func() (bool, string) {
		cond := meta.FindStatusCondition(getCluster(t, cp).Status.Conditions, v1alpha1.ConditionDegraded)
		return cond != nil && cond.Status == metav1.ConditionTrue && cond.Reason == "StoreInUse" && strings.Contains(cond.Message, ns+"/etcd"), fmt.Sprintf("%+v", cond)
	})
	time.Sleep(4 * time.Second)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(cp), &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("a StatefulSet was made for the copy: %v", err)
	}
	if cs, owner := readStore(t, env.StoreURL); cs.MemberCount != 3 || owner.Name != "etcd" {
		t.Errorf("the store after the copy: %v, owner %+v", cs, owner)
	}
	if ok, detail := reconciled(t, c, 3); !ok && !strings.Contains(detail, "ready 3") {
		t.Errorf("the first cluster after the copy: %s", detail)
	}
}

// A cluster on the operator's image whose etcd version the image does not
// carry is held, and nothing is made or changed for it.
func TestImageLacksVersion(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	c := validCluster(ns, "old")
	c.Spec.Version = "3.6.15"
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ImageLacksVersion", 30*time.Second, func() (bool, string) {
		cond := meta.FindStatusCondition(getCluster(t, c).Status.Conditions, v1alpha1.ConditionDegraded)
		return cond != nil && cond.Reason == "ImageLacksVersion" && strings.Contains(cond.Message, "not 3.6.15"), fmt.Sprintf("%+v", cond)
	})
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("a StatefulSet was made on an image that lacks the version: %v", err)
	}

	// A running cluster whose members run a version the operator's new
	// image lacks: its pods are not rolled to that image.
	run := validCluster(ns, "running")
	if err := k8s.Create(ctx, run); err != nil {
		t.Fatal(err)
	}
	var sts appsv1.StatefulSet
	waitFor(t, "the StatefulSet", 30*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(run), &sts)
		return err == nil, fmt.Sprint(err)
	})
	memberPod(t, run, 0)
	fakeCtl.setMembers("running", "running-0")
	fakeCtl.setVersion("running", "3.6.14")
	waitFor(t, "ImageLacksVersion for the members' version", 30*time.Second, func() (bool, string) {
		cond := meta.FindStatusCondition(getCluster(t, run).Status.Conditions, v1alpha1.ConditionDegraded)
		return cond != nil && cond.Reason == "ImageLacksVersion" && strings.Contains(cond.Message, "not 3.6.14"), fmt.Sprintf("%+v", cond)
	})
	patchSpec(t, run, `{"spec":{"podTemplate":{"annotations":{"x":"y"}}}}`)
	time.Sleep(4 * time.Second)
	var after appsv1.StatefulSet
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(run), &after); err != nil || after.Spec.Template.Annotations["x"] != "" {
		t.Errorf("the pod template changed while held: %v %v", err, after.Spec.Template.Annotations)
	}
}
