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
	charted := render(t, helm, "template", "etcd-manager-operator", chart, "--namespace="+namespace, "--include-crds")

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
		"--set=image.repository=registry.example/em", "--set=image.tag=v2")["Deployment/"+namespace+"/etcd-manager-operator"]
	ctrs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	ctr := ctrs[0].(map[string]any)
	if args := fmt.Sprint(ctr["args"]); ctr["image"] != "registry.example/em:v2" || !strings.Contains(args, "--image=registry.example/em:v1") || !strings.Contains(args, "--namespace=prod") {
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
