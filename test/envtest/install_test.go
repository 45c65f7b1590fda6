package envtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The two ways to install the operator, deploy/operator (kustomize) and
// deploy/helm/etcd-manager-operator, render the same objects, and the API
// server accepts every one of them.
func TestInstallManifests(t *testing.T) {
	const namespace = "etcd-manager-system"
	kustomized := render(t, filepath.Join(root, "bin", "kubernetes", "kubectl"), "kustomize", filepath.Join(root, "deploy", "operator"))
	chart := filepath.Join(root, "deploy", "helm", "etcd-manager-operator")
	helm := filepath.Join(root, "bin", "helm")
	charted := render(t, helm, "template", "etcd-manager-operator", chart, "--namespace="+namespace)

	// The kustomization makes its namespace; Helm is told to
	// (--create-namespace). Everything else pairs up.
	if _, ok := kustomized["Namespace//"+namespace]; !ok {
		t.Errorf("the kustomization makes no Namespace %s", namespace)
	}
	delete(kustomized, "Namespace//"+namespace)
	if k, h := slices.Sorted(maps.Keys(kustomized)), slices.Sorted(maps.Keys(charted)); !slices.Equal(k, h) {
		t.Fatalf("the kustomization renders %v\nthe chart renders %v", k, h)
	}
	for key, k := range kustomized {
		h := charted[key]
		var fields [][]string
		switch k.GetKind() {
		case "CustomResourceDefinition":
			fields = [][]string{{"spec"}}
		case "ClusterRole", "Role":
			fields = [][]string{{"rules"}}
		case "ClusterRoleBinding", "RoleBinding":
			fields = [][]string{{"roleRef"}, {"subjects"}}
		case "Deployment":
			fields = [][]string{{"spec", "replicas"}, {"spec", "template", "spec", "serviceAccountName"}, {"spec", "template", "spec", "securityContext"},
				{"spec", "template", "spec", "containers"}}
		}
		for _, f := range fields {
			kv, _, _ := unstructured.NestedFieldNoCopy(k.Object, f...)
			hv, _, _ := unstructured.NestedFieldNoCopy(h.Object, f...)
			if kv == nil || !reflect.DeepEqual(kv, hv) {
				t.Errorf("%s: .%s differs:\nkustomize: %v\nhelm:      %v", key, strings.Join(f, "."), kv, hv)
			}
		}
	}

	// The chart's values reach the operator's flags.
	dep := render(t, helm, "template", "x", chart, "--namespace="+namespace, "--set=memberImage=registry.example/em:v1", "--set=watchNamespace=prod",
		"--set=image.repository=registry.example/em", "--set=image.tag=v2")["Deployment/"+namespace+"/x-etcd-manager-operator"]
	ctrs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	ctr := ctrs[0].(map[string]any)
	if args := fmt.Sprint(ctr["args"]); ctr["image"] != "registry.example/em:v2" || !strings.Contains(args, "--image=registry.example/em:v1") || !strings.Contains(args, "--namespaces=prod") {
		t.Errorf("with values set: image %v, args %s", ctr["image"], args)
	}

	// A server-side dry run of each object against the real API server,
	// in a namespace that exists.
	ctx := t.Context()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for name, set := range map[string]map[string]*unstructured.Unstructured{"kustomize": kustomized, "helm": charted} {
		for key, obj := range set {
			obj.SetManagedFields(nil)
			if err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.DryRunAll, client.FieldOwner("install-test"), client.ForceOwnership); err != nil {
				t.Errorf("%s: the API server refuses %s: %v", name, key, err)
			}
		}
	}
}

// grants lists what the rules of RBAC objects let their subject do that
// the operator must never be able to: exec into pods, and, in
// cluster-wide rules, anything with Secrets.
func grants(objs map[string]*unstructured.Unstructured, namespaced bool) []string {
	var bad []string
	for key, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
			for _, name := range res {
				if name == "pods/exec" || name == "pods/attach" || name == "*" || (o.GetKind() == "ClusterRole" && namespaced && (name == "secrets" || name == "pods" || name == "statefulsets")) {
					bad = append(bad, key+" grants "+name)
				}
			}
		}
	}
	slices.Sort(bad)
	return bad
}

// Watching some namespaces, the install makes a Role and a RoleBinding in
// each and no ClusterRole; no install mode grants pods/exec; two Helm
// releases share no object's name.
func TestInstallRBACModes(t *testing.T) {
	const namespace = "etcd-manager-system"
	chart := filepath.Join(root, "deploy", "helm", "etcd-manager-operator")
	helm := filepath.Join(root, "bin", "helm")
	kubectl := filepath.Join(root, "bin", "kubernetes", "kubectl")
	modes := map[string]map[string]*unstructured.Unstructured{
		"kustomize, all namespaces": render(t, kubectl, "kustomize", filepath.Join(root, "deploy", "operator")),
		"kustomize, its namespace":  render(t, kubectl, "kustomize", filepath.Join(root, "deploy", "operator-namespaced")),
		"helm, all namespaces":      render(t, helm, "template", "etcd-manager-operator", chart, "--namespace="+namespace),
		"helm, its namespace":       render(t, helm, "template", "etcd-manager-operator", chart, "--namespace="+namespace, "--set=watchNamespaces={"+namespace+"}"),
		"helm, two namespaces":      render(t, helm, "template", "etcd-manager-operator", chart, "--namespace="+namespace, "--set=watchNamespaces={prod,staging}"),
	}
	for mode, objs := range modes {
		namespaced := !strings.Contains(mode, "all namespaces")
		if bad := grants(objs, namespaced); len(bad) > 0 {
			t.Errorf("%s: %v", mode, bad)
		}
		var clusterRoles, roles []string
		for key, o := range objs {
			switch o.GetKind() {
			case "ClusterRole", "ClusterRoleBinding":
				clusterRoles = append(clusterRoles, key)
			case "Role":
				if !strings.HasSuffix(o.GetName(), "-leader-election") {
					roles = append(roles, o.GetNamespace())
				}
			}
		}
		slices.Sort(roles)
		want := []string{}
		switch mode {
		case "kustomize, its namespace", "helm, its namespace":
			want = []string{namespace}
		case "helm, two namespaces":
			want = []string{"prod", "staging"}
		}
		if namespaced && len(clusterRoles) > 0 {
			t.Errorf("%s: cluster-wide RBAC %v", mode, clusterRoles)
		}
		if !namespaced && len(clusterRoles) != 2 {
			t.Errorf("%s: cluster-wide RBAC %v, want a ClusterRole and its binding", mode, clusterRoles)
		}
		if !slices.Equal(append([]string{}, roles...), want) {
			t.Errorf("%s: Roles in %v, want %v", mode, roles, want)
		}
	}
	// The two namespaced forms name the same objects with the same rules.
	k, h := modes["kustomize, its namespace"], modes["helm, its namespace"]
	delete(k, "Namespace//"+namespace)
	if kk, hk := slices.Sorted(maps.Keys(k)), slices.Sorted(maps.Keys(h)); !slices.Equal(kk, hk) {
		t.Errorf("namespaced: the kustomization renders %v\nthe chart renders %v", kk, hk)
	}
	for key, o := range k {
		if o.GetKind() == "Role" && !reflect.DeepEqual(o.Object["rules"], h[key].Object["rules"]) {
			t.Errorf("%s: rules differ between the kustomization and the chart", key)
		}
	}

	// Two releases in one namespace: the second leaves the CRDs to the
	// first; no other object is named twice, and each elects its own leader.
	a := render(t, helm, "template", "blue", chart, "--namespace="+namespace)
	b := render(t, helm, "template", "green", chart, "--namespace="+namespace, "--set=crds.install=false")
	for key := range b {
		if _, dup := a[key]; dup {
			t.Errorf("two releases both make %s", key)
		}
	}
	ids := map[string]bool{}
	for _, set := range []map[string]*unstructured.Unstructured{a, b} {
		for _, o := range set {
			if o.GetKind() != "Deployment" {
				continue
			}
			ctrs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, arg := range ctrs[0].(map[string]any)["args"].([]any) {
				if id, ok := strings.CutPrefix(arg.(string), "--leader-election-id="); ok {
					ids[id] = true
				}
			}
		}
	}
	if len(ids) != 2 {
		t.Errorf("leader election IDs %v, want one per release", ids)
	}
	if crds := slices.DeleteFunc(slices.Collect(maps.Keys(a)), func(k string) bool { return !strings.HasPrefix(k, "CustomResourceDefinition/") }); len(crds) != 4 {
		t.Errorf("the chart renders CRDs %v, want 4, as templates (so that an upgrade upgrades them)", crds)
	}
	for key, o := range a {
		if o.GetKind() == "CustomResourceDefinition" && o.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("%s is not kept when the release is uninstalled", key)
		}
	}
}

// The operator's service account, installed to watch one namespace, can
// neither exec into a pod anywhere nor read Secrets outside it; it can
// what it needs inside it. The API server's own RBAC authorizer answers.
func TestInstalledRBACForbidsExec(t *testing.T) {
	ctx := t.Context()
	const opNS, watched = "sar-ops", "sar-watched"
	for _, ns := range []string{opNS, watched} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	chart := filepath.Join(root, "deploy", "helm", "etcd-manager-operator")
	objs := render(t, filepath.Join(root, "bin", "helm"), "template", "sar", chart, "--namespace="+opNS, "--set=watchNamespaces={"+watched+"}", "--set=crds.install=false")
	for key, o := range objs {
		if k := o.GetKind(); k != "Role" && k != "RoleBinding" && k != "ClusterRole" && k != "ClusterRoleBinding" {
			continue
		}
		o.SetManagedFields(nil)
		if err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("install-test"), client.ForceOwnership); err != nil {
			t.Fatalf("apply %s: %v", key, err)
		}
	}
	user := "system:serviceaccount:" + opNS + ":sar-etcd-manager-operator"
	for _, tc := range []struct {
		ns, verb, group, resource, sub string
		allowed                        bool
	}{
		{"kube-system", "create", "", "pods", "exec", false},
		{watched, "create", "", "pods", "exec", false},
		{"kube-system", "get", "", "secrets", "", false},
		{"kube-system", "delete", "", "pods", "", false},
		{"default", "list", "apps", "statefulsets", "", false},
		{watched, "get", "", "secrets", "", true},
		{watched, "create", "apps", "statefulsets", "", true},
		{watched, "delete", "", "pods", "", true},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + opNS, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: tc.ns, Verb: tc.verb, Group: tc.group, Resource: tc.resource, Subresource: tc.sub},
		}}
		if err := k8s.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != tc.allowed {
			t.Errorf("%s %s %s/%s in %s: allowed %v (%s), want %v", user, tc.verb, tc.resource, tc.sub, tc.ns, sar.Status.Allowed, sar.Status.Reason, tc.allowed)
		}
	}
}

// render runs a renderer and indexes the objects it prints by kind,
// namespace and name.
func render(t *testing.T, bin string, args ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: run make tools", err)
	}
	cmd := exec.Command(bin, args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	objs := map[string]*unstructured.Unstructured{}
	dec := yaml.NewYAMLOrJSONDecoder(&out, 1<<20)
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s output: %v", filepath.Base(bin), err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		key := u.GetKind() + "/" + u.GetNamespace() + "/" + u.GetName()
		if _, dup := objs[key]; dup {
			t.Fatalf("%s renders %s twice", filepath.Base(bin), key)
		}
		objs[key] = u
	}
	if len(objs) == 0 {
		t.Fatalf("%s %s rendered nothing", filepath.Base(bin), strings.Join(args, " "))
	}
	return objs
}
