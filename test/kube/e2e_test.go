//go:build e2ekube

// Package kube runs the operator end to end on a real single-node Kubernetes
// v1.37.0 (hack/kube.sh), with the shipped CRDs, RBAC and image: make
// e2e-kube. Pods live on a bridge of this machine with no route out; the test
// reaches etcd at their addresses on it.
package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/crypt/crypttest"
	"github.com/etcd-manager/etcd-manager/internal/image"
	"github.com/etcd-manager/etcd-manager/internal/operator"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

const (
	ns          = "e2e"
	clusterName = "e2e"
	fromVersion = "3.5.35"
	toVersion   = "3.6.16"
)

var (
	root       string
	kubeDir    string
	kubeconfig string
	k8s        client.Client
	figures    = map[string]string{}
	figuresMu  sync.Mutex
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func fatal(err error) int {
	fmt.Fprintln(os.Stderr, "e2e-kube:", err)
	return 1
}

func run(m *testing.M) int {
	var err error
	if root, err = harness.RepoRoot(); err != nil {
		return fatal(err)
	}
	img := filepath.Join(root, "bin", "etcd-manager-image.tar")
	if _, err := os.Stat(img); err != nil {
		return fatal(fmt.Errorf("%w: run make image (make e2e-kube does)", err))
	}
	kubeDir = envOr("KUBE_DIR", "/tmp/etcd-manager-kube")
	tmp, err := os.MkdirTemp("", "e2e-kube")
	if err != nil {
		return fatal(err)
	}
	defer os.RemoveAll(tmp)
	pause, err := buildPause(tmp)
	if err != nil {
		return fatal(err)
	}
	start := time.Now()
	if err := kubeScript("up", pause, img); err != nil {
		kubeScript("down")
		return fatal(err)
	}
	defer kubeScript("down")
	record("cluster up", time.Since(start).Round(time.Second).String())
	kubeconfig = filepath.Join(kubeDir, "pki", "admin.kubeconfig")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fatal(err)
	}
	scheme, err := operator.Scheme()
	if err != nil {
		return fatal(err)
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return fatal(err)
	}
	stop, err := startOperator()
	if err != nil {
		return fatal(err)
	}
	code := m.Run()
	stop()
	figuresMu.Lock()
	for _, k := range slices.Sorted(maps.Keys(figures)) {
		fmt.Printf("e2e-kube figure: %s: %s\n", k, figures[k])
	}
	figuresMu.Unlock()
	return code
}

func record(name, value string) {
	figuresMu.Lock()
	defer figuresMu.Unlock()
	figures[name] = value
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func kubeScript(args ...string) error {
	cmd := exec.Command(filepath.Join(root, "hack", "kube.sh"), args...)
	cmd.Env = append(os.Environ(), "KUBE_DIR="+kubeDir)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("hack/kube.sh %s: %w", args[0], err)
	}
	return nil
}

// buildPause builds the sandbox image: a static Go binary in one layer.
func buildPause(dir string) (string, error) {
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./test/kube/pause")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build pause: %w: %s", err, out)
	}
	img, err := image.Build(image.Image{Files: []image.File{{Path: "/pause", Source: bin, Mode: 0o755}}, Entrypoint: []string{"/pause"}}, dir)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "pause.tar")
	return out, image.Write(out, "localhost/pause:e2e", img)
}

func kubectl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(root, "bin", "kubernetes", "kubectl"), append([]string{"--kubeconfig=" + kubeconfig}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// startOperator installs the shipped kustomization through the test overlay
// (test/kube/operator: host network, the API server on loopback) and waits
// for the operator's pod: the image's own binary, as its ServiceAccount,
// with the shipped RBAC, picking the member image from its own pod.
func startOperator() (stop func(), err error) {
	if err := tagImage("etcd-manager:e2e-operator"); err != nil {
		return nil, err
	}
	if out, err := kubectl("apply", "--server-side", "-k", filepath.Join(root, "test", "kube", "operator")); err != nil {
		return nil, fmt.Errorf("%w: %s", err, out)
	}
	stop = saveOperatorLog
	if out, err := kubectl("-n", operatorNS, "rollout", "status", "deployment/etcd-manager-operator", "--timeout=3m"); err != nil {
		saveOperatorLog()
		return nil, fmt.Errorf("the operator's Deployment: %w: %s", err, out)
	}
	return stop, nil
}

const operatorNS = "etcd-manager-system"

// tagImage gives the imported etcd-manager:dev another tag in the test
// cluster's containerd.
func tagImage(tag string) error {
	ctr := exec.Command("ctr", "-a", filepath.Join(kubeDir, "containerd", "containerd.sock"), "-n", "k8s.io", "images", "tag", "--force",
		"docker.io/library/etcd-manager:dev", "docker.io/library/"+tag)
	if out, err := ctr.CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images tag %s: %w: %s", tag, err, out)
	}
	return nil
}

// saveOperatorLog writes the operator pod's log to logs/operator.log.
func saveOperatorLog() {
	out, err := kubectl("-n", operatorNS, "logs", "deployment/etcd-manager-operator", "--tail=-1")
	if err != nil {
		out += "\n" + err.Error()
	}
	_ = os.WriteFile(filepath.Join(kubeDir, "logs", "operator.log"), []byte(out), 0o644)
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	last := ""
	for time.Since(start) < timeout {
		ok, detail := cond()
		if ok {
			return time.Since(start)
		}
		if detail != last {
			t.Logf("waiting for %s: %s", what, detail)
			last = detail
		}
		time.Sleep(time.Second)
	}
	dumpState(t)
	t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, last)
	return 0
}

func dumpState(t *testing.T) {
	out, _ := kubectl("-n", ns, "get", "etcdclusters,statefulsets,pods,pvc", "-o", "wide")
	t.Log(out)
	out, _ = kubectl("-n", ns, "get", "etcdcluster", clusterName, "-o", "jsonpath={.status}")
	t.Log(out)
	saveOperatorLog()
	if b, err := os.ReadFile(filepath.Join(kubeDir, "logs", "operator.log")); err == nil {
		if len(b) > 8000 {
			b = b[len(b)-8000:]
		}
		t.Logf("operator log (end):\n%s", b)
	}
	for i := range 5 {
		out, _ := kubectl("-n", ns, "logs", fmt.Sprintf("%s-%d", clusterName, i), "--tail=3000")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		// What etcd's transport and the agent's failing actions said,
		// which the last lines alone often miss.
		var peers []string
		for _, l := range lines {
			if strings.Contains(l, "peer became inactive") || strings.Contains(l, "action failed") {
				peers = append(peers, l)
			}
		}
		t.Logf("pod %d: peer and action failures (last 15):\n%s", i, strings.Join(peers[max(0, len(peers)-15):], "\n"))
		t.Logf("pod %d log (end):\n%s", i, strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
}

func getCluster(t *testing.T) *v1alpha1.EtcdCluster {
	t.Helper()
	var c v1alpha1.EtcdCluster
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: clusterName}, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// settled says whether the cluster is Available with exactly the members
// etcd-0 … etcd-(n-1), all healthy, on version.
func settled(t *testing.T, n int, version string) (bool, string) {
	return settledOf(t, clusterName, n, version)
}

// settledOf is settled for the cluster name.
func settledOf(t *testing.T, name string, n int, version string) (bool, string) {
	var c v1alpha1.EtcdCluster
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, &c); err != nil {
		return false, err.Error()
	}
	var names []string
	for _, m := range c.Status.Members {
		if m.Healthy && !m.Learner && m.Version == version {
			names = append(names, m.Name)
		}
	}
	want := make([]string, n)
	for i := range n {
		want[i] = fmt.Sprintf("%s-%d", name, i)
	}
	var sts appsv1.StatefulSet
	_ = k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, &sts)
	ok := meta.IsStatusConditionTrue(c.Status.Conditions, v1alpha1.ConditionAvailable) && slices.Equal(names, want) &&
		sts.Spec.Replicas != nil && *sts.Spec.Replicas == int32(n) && sts.Status.ReadyReplicas == int32(n)
	cond := meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionProgressing)
	msg := ""
	if cond != nil {
		msg = cond.Message
	}
	detail := fmt.Sprintf("healthy %v on %s; sts ready %d; %s", names, version, sts.Status.ReadyReplicas, msg)
	if !ok {
		return false, detail
	}
	// The status is polled; etcd itself has the last word.
	if err := etcdSettled(t, name, want, version); err != nil {
		return false, detail + "; etcd: " + err.Error()
	}
	return true, detail
}

// etcdSettled asks etcd, at every pod's address, for its membership and
// status: exactly the members named, voters all, each serving version.
func etcdSettled(t *testing.T, cluster string, names []string, version string) error {
	cli := etcdClientOf(t, cluster)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ml, err := cli.MemberList(ctx)
	if err != nil {
		return err
	}
	var got []string
	for _, m := range ml.Members {
		if m.IsLearner || len(m.ClientURLs) == 0 {
			return fmt.Errorf("member %q is a learner or not started", m.Name)
		}
		st, err := cli.Status(ctx, m.ClientURLs[0])
		if err != nil {
			return fmt.Errorf("member %s: %w", m.Name, err)
		}
		if st.Version != version {
			return fmt.Errorf("member %s runs %s", m.Name, st.Version)
		}
		got = append(got, m.Name)
	}
	slices.Sort(got)
	if !slices.Equal(got, names) {
		return fmt.Errorf("members %v, want %v", got, names)
	}
	return nil
}

// etcdClient reaches the members at their pod addresses with a client
// certificate from the cluster's CA.
func etcdClient(t *testing.T) *clientv3.Client {
	t.Helper()
	return etcdClientOf(t, clusterName)
}

// etcdClientOf is etcdClient for the cluster name.
func etcdClientOf(t *testing.T, name string) *clientv3.Client {
	t.Helper()
	var sec corev1.Secret
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name + "-ca"}, &sec); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(sec.Data["tls.crt"], sec.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(pki.CertRequest{CommonName: "e2e", Role: pki.RoleClient, Validity: time.Hour}, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	eps := podEndpoints(t, name)
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: pki.StaticClientConfig(pair, ca.Pool()), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// podEndpoints are the client URLs of cluster name's pods, at their
// addresses.
func podEndpoints(t *testing.T, name string) []string {
	var pods corev1.PodList
	if err := k8s.List(t.Context(), &pods, client.InNamespace(ns), client.MatchingLabels{operator.LabelCluster: name}); err != nil {
		return nil
	}
	var eps []string
	for _, p := range pods.Items {
		if p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			eps = append(eps, fmt.Sprintf("https://%s:%d", p.Status.PodIP, operator.DefaultClientPort))
		}
	}
	return eps
}

// waitRestored waits up to 10 minutes for restore r to succeed, and fails
// the test at once if it fails.
func waitRestored(t *testing.T, r *v1alpha1.EtcdRestore, what string) time.Duration {
	t.Helper()
	return waitFor(t, what, 10*time.Minute, func() (bool, string) {
		var got v1alpha1.EtcdRestore
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(r), &got); err != nil {
			return false, err.Error()
		}
		if got.Status.Phase == v1alpha1.RestoreFailed {
			t.Fatalf("restore failed: %s", got.Status.Message)
		}
		return got.Status.Phase == v1alpha1.RestoreSucceeded, fmt.Sprintf("%+v", got.Status)
	})
}

func put(t *testing.T, cli *clientv3.Client, k, v string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, k, v); err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
}

func count(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("count %s: %v", prefix, err)
	}
	return resp.Count
}

// step runs one scenario; the next ones build on it, so a failure ends the
// test there.
func step(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	if !t.Run(name, f) {
		dumpState(t)
		t.FailNow()
	}
}

// The scenarios run in order on one cluster, as a user would.
func TestOperator(t *testing.T) {
	ctx := t.Context()
	if _, err := kubectl("create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	// Backups are encrypted at rest with a key from a Secret, which the
	// operator mounts into every member pod.
	keyData, keyID := crypttest.KeyFileContents(t)
	keySecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "backup-key", Namespace: ns}, Data: map[string][]byte{"key": keyData}}
	if err := k8s.Create(ctx, keySecret); err != nil {
		t.Fatal(err)
	}
	// The operator runs as shipped, with no pods/exec anywhere: the API
	// server's authorizer says so.
	for _, where := range []string{ns, "kube-system"} {
		out, _ := kubectl("auth", "can-i", "create", "pods", "--subresource=exec", "-n", where,
			"--as=system:serviceaccount:"+operatorNS+":etcd-manager-operator")
		if strings.TrimSpace(out) != "no" {
			t.Fatalf("the operator may exec into pods of %s: kubectl auth can-i says %q", where, out)
		}
	}
	replicas := int32(3)
	storeDir := filepath.Join(kubeDir, "store")
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	// The pods run as 65532, and a hostPath volume is not given to their
	// fsGroup: the store's folder is made theirs here, as a user of a
	// hostPath store would.
	if err := os.MkdirAll(filepath.Join(storeDir, clusterName), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(storeDir, clusterName), 65532, 65532); err != nil {
		t.Fatal(err)
	}
	storageClass := "local"
	c := &v1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Name: clusterName, Namespace: ns},
		Spec: v1alpha1.EtcdClusterSpec{
			Replicas: &replicas,
			Version:  fromVersion,
			BackupStore: v1alpha1.BackupStore{
				URL:    "file:///var/lib/etcd-manager-store/" + clusterName,
				Volume: &corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(storeDir, clusterName), Type: &dirOrCreate}},
			},
			Storage: &corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &storageClass,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("256Mi")}},
			},
			MemberFailureGrace: &metav1.Duration{Duration: 20 * time.Second},
			Backup:             &v1alpha1.BackupPolicy{Encryption: &v1alpha1.BackupEncryption{KeySecret: keySecret.Name}},
		},
	}

	// The baseline, by hand on the same Kubernetes: a StatefulSet of three
	// single-member etcds of the same image, on the same storage. It is the
	// floor under the operator's figures: pods scheduled, volumes bound,
	// containers started and etcd serving, with no cluster to form.
	var backupName string // taken in scenario 6, restored again in 8

	step(t, "0 by hand: a plain StatefulSet of etcd", func(t *testing.T) {
		manifest := fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: plain, namespace: %s}
spec:
  serviceName: plain
  replicas: 3
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: plain}}
  template:
    metadata: {labels: {app: plain}}
    spec:
      securityContext: {fsGroup: 65532}
      containers:
      - name: etcd
        image: etcd-manager:dev
        command: [/opt/etcd-v%s/etcd, --data-dir=/data/etcd, --listen-client-urls=http://0.0.0.0:2379, --advertise-client-urls=http://127.0.0.1:2379]
        readinessProbe: {httpGet: {path: /health, port: 2379}, periodSeconds: 2}
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], storageClassName: local, resources: {requests: {storage: 256Mi}}}
`, ns, fromVersion)
		path := filepath.Join(t.TempDir(), "plain.yaml")
		if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		ready := func(n int32) func() (bool, string) {
			return func() (bool, string) {
				var sts appsv1.StatefulSet
				if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "plain"}, &sts); err != nil {
					return false, err.Error()
				}
				return sts.Status.ReadyReplicas == n && sts.Status.Replicas == n, fmt.Sprintf("%d ready", sts.Status.ReadyReplicas)
			}
		}
		start := time.Now()
		if _, err := kubectl("apply", "-f", path); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "3 plain etcd pods ready", 3*time.Minute, ready(3))
		record("by hand: apply to 3 plain etcd pods ready", time.Since(start).Round(time.Second).String())
		start = time.Now()
		if _, err := kubectl("-n", ns, "delete", "pvc", "data-plain-2", "--wait=false"); err != nil {
			t.Fatal(err)
		}
		if _, err := kubectl("-n", ns, "delete", "pod", "plain-2", "--wait=true"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the plain pod back with a new PVC", 3*time.Minute, ready(3))
		record("by hand: a plain etcd pod and its PVC back", time.Since(start).Round(time.Second).String())
		if _, err := kubectl("-n", ns, "delete", "statefulset", "plain", "--wait=true"); err != nil {
			t.Fatal(err)
		}
		if _, err := kubectl("-n", ns, "delete", "pvc", "-l", "app=plain", "--wait=true"); err != nil {
			t.Fatal(err)
		}
	})

	step(t, "1 create a 3-member cluster and write to it", func(t *testing.T) {
		if err := k8s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, "3 healthy members", 5*time.Minute, func() (bool, string) { return settled(t, 3, fromVersion) })
		record("apply to Available (3 members)", took.Round(time.Second).String())
		// The member pods run the operator's own image, read from its pod:
		// the overlay's tag, not the default one.
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{operator.LabelCluster: clusterName}); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if img := p.Spec.Containers[0].Image; img != "etcd-manager:e2e-operator" {
				t.Errorf("pod %s runs %s, want the operator's etcd-manager:e2e-operator", p.Name, img)
			}
		}
		cli := etcdClient(t)
		for i := range 100 {
			put(t, cli, fmt.Sprintf("/e2e/create/%03d", i), "v")
		}
		if n := count(t, cli, "/e2e/create/"); n != 100 {
			t.Fatalf("read back %d keys, want 100", n)
		}
		// etcd serves the pod's loopback too, for kubectl exec.
		out, err := kubectl("-n", ns, "exec", clusterName+"-0", "--", "/opt/etcd-v"+fromVersion+"/etcdctl", "--endpoints=https://127.0.0.1:2379",
			"--cacert=/var/lib/etcd-manager/pki/ca.crt", "--cert=/var/lib/etcd-manager/pki/node.crt", "--key=/var/lib/etcd-manager/pki/node.key",
			"get", "--prefix", "--count-only", "--write-out=fields", "/e2e/create/")
		if err != nil || !strings.Contains(out, `"Count" : 100`) {
			t.Errorf("etcdctl in the pod over its loopback: %v: %s", err, out)
		}
	})

	step(t, "2 kubectl scale to 5 and back to 3", func(t *testing.T) {
		if _, err := kubectl("-n", ns, "scale", "etcdcluster/"+clusterName, "--replicas=5"); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, "5 healthy members", 5*time.Minute, func() (bool, string) { return settled(t, 5, fromVersion) })
		record("scale 3 to 5", took.Round(time.Second).String())
		if _, err := kubectl("-n", ns, "scale", "etcdcluster/"+clusterName, "--replicas=3"); err != nil {
			t.Fatal(err)
		}
		took = waitFor(t, "back to 3 members, the lowest ordinals", 5*time.Minute, func() (bool, string) { return settled(t, 3, fromVersion) })
		record("scale 5 to 3", took.Round(time.Second).String())
		if n := count(t, etcdClient(t), "/e2e/create/"); n != 100 {
			t.Fatalf("after scaling, %d keys, want 100", n)
		}
	})

	step(t, "3 delete a pod", func(t *testing.T) {
		if _, err := kubectl("-n", ns, "delete", "pod", clusterName+"-1", "--wait=true"); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, "the pod back as a healthy member", 5*time.Minute, func() (bool, string) { return settled(t, 3, fromVersion) })
		record("deleted pod back", took.Round(time.Second).String())
		if n := count(t, etcdClient(t), "/e2e/create/"); n != 100 {
			t.Fatalf("%d keys, want 100", n)
		}
	})

	step(t, "4 delete a pod with its PVC", func(t *testing.T) {
		oldID := ""
		for _, m := range getCluster(t).Status.Members {
			if m.Name == clusterName+"-2" {
				oldID = m.ID
			}
		}
		if oldID == "" {
			t.Fatal("no member ID for e2e-2 in the status")
		}
		start := time.Now()
		if _, err := kubectl("-n", ns, "delete", "pvc", "data-"+clusterName+"-2", "--wait=false"); err != nil {
			t.Fatal(err)
		}
		if _, err := kubectl("-n", ns, "delete", "pod", clusterName+"-2", "--wait=true"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a wiped member replaced", 8*time.Minute, func() (bool, string) {
			var pvc corev1.PersistentVolumeClaim
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "data-" + clusterName + "-2"}, &pvc); err != nil {
				return false, err.Error()
			}
			if pvc.CreationTimestamp.Time.Before(start) {
				return false, "the old PVC is still there"
			}
			for _, m := range getCluster(t).Status.Members {
				if m.Name == clusterName+"-2" && m.ID == oldID {
					return false, "e2e-2 is still the old member " + oldID
				}
			}
			return settled(t, 3, fromVersion)
		})
		record("replace a pod and its PVC", time.Since(start).Round(time.Second).String())
		if n := count(t, etcdClient(t), "/e2e/create/"); n != 100 {
			t.Fatalf("%d keys, want 100", n)
		}
	})

	step(t, "5 roll 3.5 to 3.6 under a writer", func(t *testing.T) {
		w := startWriter(t, etcdClient(t), "/e2e/roll/")
		time.Sleep(3 * time.Second)
		if _, err := kubectl("-n", ns, "patch", "etcdcluster", clusterName, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"version":%q}}`, toVersion)); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, "every member on "+toVersion, 10*time.Minute, func() (bool, string) { return settled(t, 3, toVersion) })
		time.Sleep(3 * time.Second)
		n, longest := w.stop(t)
		record("roll 3.5 to 3.6", took.Round(time.Second).String())
		record("longest write stall during the roll", longest.Round(time.Millisecond).String())
		record("acknowledged writes during the roll", fmt.Sprint(n))
		// No pod was restarted: the agents rolled etcd inside them.
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{operator.LabelCluster: clusterName}); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].RestartCount != 0 {
				t.Errorf("pod %s: container statuses %+v, want one that never restarted", p.Name, p.Status.ContainerStatuses)
			}
		}
	})

	step(t, "5a an etcd setting reaches every member's etcd", func(t *testing.T) {
		if _, err := kubectl("-n", ns, "patch", "etcdcluster", clusterName, "--type=merge", "-p", `{"spec":{"etcd":{"settings":{"snapshot-count":"5000"}}}}`); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, "snapshot-count in every member's etcd, Progressing False", 10*time.Minute, func() (bool, string) {
			for i := range 3 {
				args, err := etcdArgs(fmt.Sprintf("%s-%d", clusterName, i))
				if err != nil {
					return false, err.Error()
				}
				if !slices.Contains(args, "--snapshot-count=5000") {
					return false, fmt.Sprintf("%s-%d's etcd runs %v", clusterName, i, args)
				}
			}
			if ok, detail := settled(t, 3, toVersion); !ok {
				return false, detail
			}
			p := meta.FindStatusCondition(getCluster(t).Status.Conditions, v1alpha1.ConditionProgressing)
			return p != nil && p.Status == metav1.ConditionFalse, fmt.Sprintf("Progressing %+v", p)
		})
		record("settings roll of 3 members", took.Round(time.Second).String())
	})

	step(t, "5b a new image rolls the pods one at a time", func(t *testing.T) {
		// The same image under another tag: a new pod template all the same.
		if err := tagImage("etcd-manager:e2e-roll"); err != nil {
			t.Fatal(err)
		}
		if _, err := kubectl("-n", ns, "patch", "etcdcluster", clusterName, "--type=merge", "-p", `{"spec":{"image":"etcd-manager:e2e-roll"}}`); err != nil {
			t.Fatal(err)
		}
		// One pod at a time: never two away at once.
		mostAway := 0
		took := waitFor(t, "every pod on the new image", 10*time.Minute, func() (bool, string) {
			var pods corev1.PodList
			if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{operator.LabelCluster: clusterName}); err != nil {
				return false, err.Error()
			}
			var old []string
			away := 3 - len(pods.Items)
			for _, p := range pods.Items {
				if p.Spec.Containers[0].Image != "etcd-manager:e2e-roll" {
					old = append(old, p.Name)
				}
				ready := false
				for _, c := range p.Status.Conditions {
					ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
				}
				if !ready || p.DeletionTimestamp != nil {
					away++
				}
			}
			mostAway = max(mostAway, away)
			if len(old) > 0 {
				return false, fmt.Sprintf("pods on the old image: %v", old)
			}
			return settled(t, 3, toVersion)
		})
		record("image roll of 3 pods", took.Round(time.Second).String())
		if mostAway > 1 {
			t.Errorf("%d pods were away at once during the roll, want one at a time", mostAway)
		}
		if n := count(t, etcdClient(t), "/e2e/create/"); n != 100 {
			t.Fatalf("%d keys, want 100", n)
		}
	})

	step(t, "5c a pod template change rolls the pods under a writer", func(t *testing.T) {
		w := startWriter(t, etcdClient(t), "/e2e/template/")
		time.Sleep(2 * time.Second)
		before := map[string]types.UID{}
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{operator.LabelCluster: clusterName}); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			before[p.Name] = p.UID
		}
		if _, err := kubectl("-n", ns, "patch", "etcdcluster", clusterName, "--type=merge", "-p", `{"spec":{"podTemplate":{"annotations":{"e2e.etcd-manager.dev/rolled":"yes"}}}}`); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, "every pod replaced with the annotation", 10*time.Minute, func() (bool, string) {
			var pods corev1.PodList
			if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{operator.LabelCluster: clusterName}); err != nil {
				return false, err.Error()
			}
			var old []string
			for _, p := range pods.Items {
				if p.UID == before[p.Name] || p.Annotations["e2e.etcd-manager.dev/rolled"] != "yes" {
					old = append(old, p.Name)
				}
			}
			if len(old) > 0 || len(pods.Items) != 3 {
				return false, fmt.Sprintf("pods not yet replaced: %v", old)
			}
			return settled(t, 3, toVersion)
		})
		time.Sleep(2 * time.Second)
		n, longest := w.stop(t)
		record("pod template roll of 3 pods", took.Round(time.Second).String())
		record("longest write stall during the pod template roll", longest.Round(time.Millisecond).String())
		record("acknowledged writes during the pod template roll", fmt.Sprint(n))
	})

	step(t, "6 EtcdBackup then an in-place EtcdRestore", func(t *testing.T) {
		cli := etcdClient(t)
		put(t, cli, "/e2e/before-backup", "kept")
		b := &v1alpha1.EtcdBackup{ObjectMeta: metav1.ObjectMeta{Name: "before-restore", Namespace: ns}, Spec: v1alpha1.EtcdBackupSpec{ClusterName: clusterName}}
		if err := k8s.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the backup", 5*time.Minute, func() (bool, string) {
			var got v1alpha1.EtcdBackup
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(b), &got); err != nil {
				return false, err.Error()
			}
			backupName = got.Status.BackupName
			return got.Status.Phase == v1alpha1.BackupSucceeded && got.Status.Revision > 0, fmt.Sprintf("%+v", got.Status)
		})
		// Encrypted with the Secret's key, as its meta says; the restores
		// below decrypt it in the member pods.
		meta, err := os.ReadFile(filepath.Join(storeDir, clusterName, backupName, "_etcd_backup.meta"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(meta), keyID) {
			t.Errorf("the backup's meta does not name the Secret's key %s: %s", keyID, meta)
		}
		put(t, cli, "/e2e/after-backup", "lost by the restore")
		r := &v1alpha1.EtcdRestore{ObjectMeta: metav1.ObjectMeta{Name: "back", Namespace: ns}, Spec: v1alpha1.EtcdRestoreSpec{ClusterName: clusterName, BackupName: backupName}}
		if err := k8s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		took := waitRestored(t, r, "the restore")
		record("in-place restore", took.Round(time.Second).String())
		waitFor(t, "3 healthy members after the restore", 5*time.Minute, func() (bool, string) { return settled(t, 3, toVersion) })
		cli = etcdClient(t)
		if n := count(t, cli, "/e2e/before-backup"); n != 1 {
			t.Errorf("the key written before the backup: %d, want 1", n)
		}
		if n := count(t, cli, "/e2e/after-backup"); n != 0 {
			t.Errorf("the key written after the backup survived the restore")
		}
		if n := count(t, cli, "/e2e/create/"); n != 100 {
			t.Errorf("%d keys of the first scenario, want 100", n)
		}
		// Written after the restore: the restore of the same backup into a
		// new cluster (8) must not have it.
		put(t, cli, "/e2e/after-restore", "not in the backup")
	})

	step(t, "7 delete the cluster: the PVCs are kept", func(t *testing.T) {
		if err := k8s.Delete(ctx, getCluster(t)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the pods to go", 3*time.Minute, func() (bool, string) {
			var pods corev1.PodList
			if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{operator.LabelCluster: clusterName}); err != nil {
				return false, err.Error()
			}
			return len(pods.Items) == 0, fmt.Sprintf("%d pods", len(pods.Items))
		})
		var pvcs corev1.PersistentVolumeClaimList
		if err := k8s.List(ctx, &pvcs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range pvcs.Items {
			names = append(names, p.Name)
		}
		slices.Sort(names)
		if want := []string{"data-e2e-0", "data-e2e-1", "data-e2e-2"}; !slices.Equal(names, want) {
			t.Errorf("PVCs left: %v, want %v", names, want)
		}
		if entries, err := os.ReadDir(filepath.Join(storeDir, clusterName)); err != nil || len(entries) == 0 {
			t.Errorf("the store was touched: %v, %d entries", err, len(entries))
		}
	})
	step(t, "8 EtcdRestore into a new cluster from the kept store", func(t *testing.T) {
		const restored = "e2e-restored"
		spec := c.Spec.DeepCopy()
		spec.Version = toVersion
		r := &v1alpha1.EtcdRestore{ObjectMeta: metav1.ObjectMeta{Name: "into-new", Namespace: ns},
			Spec: v1alpha1.EtcdRestoreSpec{BackupName: backupName, ClusterTemplate: &v1alpha1.ClusterTemplate{Name: restored, Spec: *spec}}}
		if err := k8s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		took := waitRestored(t, r, "the restore into a new cluster")
		record("restore into a new cluster", took.Round(time.Second).String())
		waitFor(t, "3 healthy members of the new cluster", 5*time.Minute, func() (bool, string) { return settledOf(t, restored, 3, toVersion) })
		cli := etcdClientOf(t, restored)
		if n := count(t, cli, "/e2e/before-backup"); n != 1 {
			t.Errorf("the key written before the backup: %d, want 1", n)
		}
		if n := count(t, cli, "/e2e/after-backup"); n != 0 {
			t.Errorf("the key written after the backup is in the new cluster")
		}
		if n := count(t, cli, "/e2e/after-restore"); n != 0 {
			t.Errorf("the key written after the in-place restore is in the new cluster: a newer backup was restored")
		}
		if n := count(t, cli, "/e2e/create/"); n != 100 {
			t.Errorf("%d keys of the first scenario, want 100", n)
		}
	})

	out, _ := json.Marshal(figures)
	t.Logf("figures: %s", out)
}

// writer puts keys under a prefix, one after another, and records which
// were acknowledged.
type writer struct {
	cli     *clientv3.Client
	prefix  string
	acked   atomic.Int64
	longest atomic.Int64
	stopW   chan struct{}
	done    chan error
}

// startWriter writes prefix000000, prefix000001, ... every 10 ms, trying a
// key again until it is acknowledged, at most 200,000 keys.
func startWriter(t *testing.T, cli *clientv3.Client, prefix string) *writer {
	w := &writer{cli: cli, prefix: prefix, stopW: make(chan struct{}), done: make(chan error, 1)}
	// Replaced pods come back at other addresses: follow them.
	go func() {
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-w.stopW:
				return
			case <-tick.C:
			}
			if eps := podEndpoints(t, clusterName); len(eps) > 0 {
				cli.SetEndpoints(eps...)
			}
		}
	}()
	go func() {
		last := time.Now()
		for i := 0; i < 200000; i++ {
			select {
			case <-w.stopW:
				w.done <- nil
				return
			default:
			}
			wctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			_, err := cli.Put(wctx, fmt.Sprintf("%s%06d", prefix, i), "v")
			cancel()
			if err != nil {
				i-- // the same key again: an unacknowledged write may or may not be there
				time.Sleep(50 * time.Millisecond)
				continue
			}
			w.acked.Store(int64(i + 1))
			if gap := time.Since(last); gap.Nanoseconds() > w.longest.Load() {
				w.longest.Store(gap.Nanoseconds())
			}
			last = time.Now()
			time.Sleep(10 * time.Millisecond)
		}
		w.done <- errors.New("the writer ran out of keys")
	}()
	return w
}

// stop stops the writer and checks, against etcd, that every acknowledged
// write is there; it returns how many there were and the longest gap
// between two acknowledgements.
func (w *writer) stop(t *testing.T) (int64, time.Duration) {
	t.Helper()
	close(w.stopW)
	if err := <-w.done; err != nil {
		t.Fatal(err)
	}
	n := w.acked.Load()
	gctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	resp, err := w.cli.Get(gctx, w.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, kv := range resp.Kvs {
		have[string(kv.Key)] = true
	}
	for i := range n {
		if k := fmt.Sprintf("%s%06d", w.prefix, i); !have[k] {
			t.Fatalf("the acknowledged write %s was lost (%d acknowledged)", k, n)
		}
	}
	if n == 0 {
		t.Fatal("no write was acknowledged")
	}
	return n, time.Duration(w.longest.Load())
}

// etcdArgs is the command line of the etcd of member name, read from this
// machine's /proc, where the pods' processes run: what etcd was given.
func etcdArgs(name string) ([]string, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return nil, err
	}
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if strings.HasSuffix(args[0], "/etcd") && slices.Contains(args, "--name="+name) {
			return args, nil
		}
	}
	return nil, fmt.Errorf("no etcd process of member %s on this machine", name)
}
