//go:build e2ekube

package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/operator"
)

const restrictedNS = "restricted"

// A cluster in a namespace that enforces the restricted Pod Security
// Standard: its pods are admitted, serve clients on 2379 with the client
// Secret's credential under the client Service's name, and count as ready
// only as serving voters.
func TestRestricted(t *testing.T) {
	ctx := t.Context()
	if _, err := kubectl("create", "namespace", restrictedNS); err != nil {
		t.Fatal(err)
	}
	if _, err := kubectl("label", "namespace", restrictedNS, "pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest"); err != nil {
		t.Fatal(err)
	}
	// A root pod is refused there: the namespace does enforce.
	if out, err := kubectl("-n", restrictedNS, "run", "root", "--image=etcd-manager:dev", "--restart=Never", "--command", "--", "/opt/etcd-v"+toVersion+"/etcd", "--version"); err == nil {
		t.Fatalf("a pod with no security context was admitted: %s", out)
	}
	storageClass := "local"
	claim := func(size string) corev1.PersistentVolumeClaimSpec {
		return corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &storageClass,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}
	}

	step(t, "by hand: a restricted StatefulSet of plain etcd", func(t *testing.T) {
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
      securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, fsGroup: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: etcd
        image: etcd-manager:dev
        command: [/opt/etcd-v%s/etcd, --data-dir=/data/etcd, --listen-client-urls=http://0.0.0.0:2379, --advertise-client-urls=http://127.0.0.1:2379]
        readinessProbe: {httpGet: {path: /health, port: 2379}, periodSeconds: 2}
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], storageClassName: local, resources: {requests: {storage: 256Mi}}}
`, restrictedNS, toVersion)
		path := filepath.Join(t.TempDir(), "plain.yaml")
		if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := kubectl("apply", "-f", path); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "3 plain etcd pods ready", 3*time.Minute, func() (bool, string) {
			var sts appsv1.StatefulSet
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: restrictedNS, Name: "plain"}, &sts); err != nil {
				return false, err.Error()
			}
			return sts.Status.ReadyReplicas == 3, fmt.Sprintf("%d ready", sts.Status.ReadyReplicas)
		})
		record("restricted, by hand: apply to 3 plain etcd pods ready", time.Since(start).Round(time.Millisecond).String())
		if _, err := kubectl("-n", restrictedNS, "delete", "statefulset", "plain", "--wait=true"); err != nil {
			t.Fatal(err)
		}
		if _, err := kubectl("-n", restrictedNS, "delete", "pvc", "-l", "app=plain", "--wait=true"); err != nil {
			t.Fatal(err)
		}
	})

	// The store: a file:// store on a volume every pod of this one node
	// mounts (hostPath is refused under restricted).
	store := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "store", Namespace: restrictedNS}, Spec: claim("512Mi")}
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	replicas := int32(3)
	c := &v1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: restrictedNS},
		Spec: v1alpha1.EtcdClusterSpec{
			Replicas: &replicas, Version: toVersion,
			BackupStore: v1alpha1.BackupStore{URL: "file:///var/lib/etcd-manager-store/r",
				Volume: &corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "store"}}},
			Storage: func() *corev1.PersistentVolumeClaimSpec { s := claim("256Mi"); return &s }(),
		},
	}

	step(t, "create a 3-member cluster under restricted", func(t *testing.T) {
		start := time.Now()
		if err := k8s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "Available with 3 healthy members", 5*time.Minute, func() (bool, string) { return restrictedSettled(t, c, 3) })
		record("restricted: apply to Available (3 members)", time.Since(start).Round(time.Millisecond).String())
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(restrictedNS), client.MatchingLabels{operator.LabelCluster: "r"}); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			sc := p.Spec.SecurityContext
			if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0 || p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
				t.Errorf("pod %s: security context %+v, token mounted %v", p.Name, sc, p.Spec.AutomountServiceAccountToken)
			}
		}
	})

	step(t, "a client on the host reaches a member on 2379 with the client Secret", func(t *testing.T) {
		cli := clientSecretClient(t, c)
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := cli.Put(pctx, "/restricted/k", "v"); err != nil {
			t.Fatalf("put over TLS, verifying the server as r-client.restricted.svc: %v", err)
		}
		resp, err := cli.Get(pctx, "/restricted/k")
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
			t.Fatalf("get: %v %v", resp, err)
		}
	})

	step(t, "the PDB keeps one pod away at a time", func(t *testing.T) {
		var pdb policyv1.PodDisruptionBudget
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: restrictedNS, Name: "r"}, &pdb); err != nil {
			t.Fatal(err)
		}
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
			t.Errorf("PDB %+v, want maxUnavailable 1", pdb.Spec)
		}
		waitFor(t, "the PDB to allow one disruption", time.Minute, func() (bool, string) {
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: restrictedNS, Name: "r"}, &pdb); err != nil {
				return false, err.Error()
			}
			return pdb.Status.DisruptionsAllowed == 1 && pdb.Status.CurrentHealthy == 3, fmt.Sprintf("%+v", pdb.Status)
		})
	})

	step(t, "new pods of a scale-up are Ready only as voters", func(t *testing.T) {
		cli := clientSecretClient(t, c)
		if _, err := kubectl("-n", restrictedNS, "scale", "etcdcluster/r", "--replicas=5"); err != nil {
			t.Fatal(err)
		}
		sawNotReady := map[string]bool{}
		deadline := time.Now().Add(5 * time.Minute)
		for {
			if time.Now().After(deadline) {
				t.Fatalf("the new pods did not become ready voters; saw not ready: %v", sawNotReady)
			}
			var pods corev1.PodList
			if err := k8s.List(ctx, &pods, client.InNamespace(restrictedNS), client.MatchingLabels{operator.LabelCluster: "r"}); err != nil {
				t.Fatal(err)
			}
			mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ml, err := cli.MemberList(mctx)
			cancel()
			if err != nil {
				time.Sleep(250 * time.Millisecond)
				continue
			}
			voters := map[string]bool{}
			for _, m := range ml.Members {
				if !m.IsLearner && len(m.ClientURLs) > 0 {
					voters[m.Name] = true
				}
			}
			ready := 0
			for _, p := range pods.Items {
				if p.Name != "r-3" && p.Name != "r-4" {
					continue
				}
				if !podReady(&p) {
					if p.Status.Phase == corev1.PodRunning {
						sawNotReady[p.Name] = true
					}
					continue
				}
				// etcd's own member list, read after the pod's status: a
				// pod Ready then must be a voter now.
				if !voters[p.Name] {
					t.Fatalf("pod %s is Ready but etcd does not list it as a voter: %v", p.Name, ml.Members)
				}
				ready++
			}
			if ready == 2 {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if !sawNotReady["r-3"] && !sawNotReady["r-4"] {
			t.Errorf("no new pod was seen running and not ready: the standby phase went unobserved")
		}
		waitFor(t, "5 members", 5*time.Minute, func() (bool, string) { return restrictedSettled(t, c, 5) })
		if _, err := kubectl("-n", restrictedNS, "scale", "etcdcluster/r", "--replicas=3"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "back to 3 members", 5*time.Minute, func() (bool, string) { return restrictedSettled(t, c, 3) })
	})

	step(t, "delete the restricted cluster", func(t *testing.T) {
		if err := k8s.Delete(ctx, c); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the pods to go", 3*time.Minute, func() (bool, string) {
			var pods corev1.PodList
			if err := k8s.List(ctx, &pods, client.InNamespace(restrictedNS), client.MatchingLabels{operator.LabelCluster: "r"}); err != nil {
				return false, err.Error()
			}
			return len(pods.Items) == 0, fmt.Sprintf("%d pods", len(pods.Items))
		})
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil
		}
	}
	return false
}

// restrictedSettled says whether c is Available with n healthy voters.
func restrictedSettled(t *testing.T, c *v1alpha1.EtcdCluster, n int32) (bool, string) {
	var got v1alpha1.EtcdCluster
	if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(c), &got); err != nil {
		return false, err.Error()
	}
	var sts appsv1.StatefulSet
	_ = k8s.Get(t.Context(), client.ObjectKeyFromObject(c), &sts)
	ok := meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionAvailable) && got.Status.ReadyReplicas == n &&
		sts.Status.ReadyReplicas == n && sts.Spec.Replicas != nil && *sts.Spec.Replicas == n
	p := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgressing)
	msg := ""
	if p != nil {
		msg = p.Message
	}
	return ok, fmt.Sprintf("ready %d, sts ready %d; %s", got.Status.ReadyReplicas, sts.Status.ReadyReplicas, msg)
}

// clientSecretClient is a client of c's members at their pod addresses
// on 2379, with the credential of <name>-client-tls, verifying each
// server as the client Service's name: what an in-cluster client does.
func clientSecretClient(t *testing.T, c *v1alpha1.EtcdCluster) *clientv3.Client {
	t.Helper()
	var sec corev1.Secret
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: c.Namespace, Name: c.Name + "-client-tls"}, &sec); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(sec.Data["tls.crt"], sec.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(sec.Data["ca.crt"]) {
		t.Fatal("the client Secret's ca.crt holds no certificate")
	}
	var pods corev1.PodList
	if err := k8s.List(t.Context(), &pods, client.InNamespace(c.Namespace), client.MatchingLabels{operator.LabelCluster: c.Name}); err != nil {
		t.Fatal(err)
	}
	var eps []string
	for _, p := range pods.Items {
		if p.Status.PodIP != "" {
			eps = append(eps, fmt.Sprintf("https://%s:2379", p.Status.PodIP))
		}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair},
		ServerName: c.Name + "-client." + c.Namespace + ".svc"}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
