package operator

import (
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
)

func cluster(mutate func(*v1alpha1.EtcdCluster)) *v1alpha1.EtcdCluster {
	c := &v1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "db"},
		Spec:       v1alpha1.EtcdClusterSpec{Version: "3.6.16", BackupStore: v1alpha1.BackupStore{URL: "s3://bucket/main"}},
	}
	if mutate != nil {
		mutate(c)
	}
	return c
}

func TestRenderStatefulSet(t *testing.T) {
	off := false
	tests := []struct {
		name      string
		c         *v1alpha1.EtcdCluster
		argsHave  []string
		argsLack  []string
		mounts    []string
		image     string
		claims    int
		whenGone  string
		wantError string
	}{
		{name: "defaults: TLS from the CA Secret, data in an emptyDir",
			c: cluster(nil),
			argsHave: []string{"--cluster-name=main", "--node-name=$(POD_NAME)", "--address=$(POD_IP)", "--pki-dir=/etc/etcd-manager/pki", "--listen-client-urls=https://0.0.0.0:2379",
				"--client-urls=https://$(POD_IP):2379", "--etcd-bin-dir=/opt", "--readiness=voter",
				"--cert-names=main-client,main-client.db,main-client.db.svc,main-client.db.svc.cluster.local,$(POD_NAME).main.db.svc,$(POD_NAME).main.db.svc.cluster.local"},
			argsLack: []string{"--insecure", "--backup-interval"},
			mounts:   []string{"/var/lib/etcd-manager", "/tmp", "/etc/etcd-manager/pki"},
			image:    "etcd-manager:dev", whenGone: "Retain"},
		{name: "no TLS for etcd: the peer API, which the operator calls, keeps mutual TLS",
			c:        cluster(func(c *v1alpha1.EtcdCluster) { c.Spec.TLS = &v1alpha1.TLSSpec{Enabled: &off} }),
			argsHave: []string{"--etcd-insecure", "--listen-client-urls=http://0.0.0.0:2379", "--pki-dir=/etc/etcd-manager/pki"},
			argsLack: []string{"--insecure"},
			mounts:   []string{"/var/lib/etcd-manager", "/tmp", "/etc/etcd-manager/pki"},
			image:    "etcd-manager:dev", whenGone: "Retain"},
		{name: "a file store's volume at its path, storage, backups, image, Delete",
			c: cluster(func(c *v1alpha1.EtcdCluster) {
				c.Spec.BackupStore = v1alpha1.BackupStore{URL: "file:///srv/backups/main", Volume: &corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv"}}}
				c.Spec.Storage = &corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}}
				c.Spec.Backup = &v1alpha1.BackupPolicy{Interval: &metav1.Duration{Duration: 5 * time.Minute}, Retention: "count:10"}
				c.Spec.MemberFailureGrace = &metav1.Duration{Duration: 2 * time.Minute}
				c.Spec.Image = "registry.example/etcd-manager:v1"
				c.Spec.DeletionPolicy = v1alpha1.DeletionDelete
			}),
			argsHave: []string{"--backup-store=file:///srv/backups/main", "--backup-interval=5m0s", "--backup-retention=count:10", "--member-failure-grace=2m0s"},
			mounts:   []string{"/var/lib/etcd-manager", "/tmp", "/etc/etcd-manager/pki", "/srv/backups/main"},
			image:    "registry.example/etcd-manager:v1", claims: 1, whenGone: "Delete"},
		{name: "backup encryption: the writing key and an older one, each a private Secret volume",
			c: cluster(func(c *v1alpha1.EtcdCluster) {
				c.Spec.Backup = &v1alpha1.BackupPolicy{Encryption: &v1alpha1.BackupEncryption{KeySecret: "backup-key-2", DecryptionKeySecrets: []string{"backup-key-1"}}}
			}),
			argsHave: []string{"--backup-encryption-key-file=/etc/etcd-manager/backup-keys/backup-key/key", "--backup-decryption-key-file=/etc/etcd-manager/backup-keys/backup-old-key-0/key"},
			mounts:   []string{"/var/lib/etcd-manager", "/tmp", "/etc/etcd-manager/pki", "/etc/etcd-manager/backup-keys/backup-key", "/etc/etcd-manager/backup-keys/backup-old-key-0"},
			image:    "etcd-manager:dev", whenGone: "Retain"},
		{name: "a file store at the root is refused",
			c: cluster(func(c *v1alpha1.EtcdCluster) {
				c.Spec.BackupStore = v1alpha1.BackupStore{URL: "file:///", Volume: &corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
			}),
			wantError: "want file:///some/path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sts, err := RenderStatefulSet(tc.c, RenderOptions{Image: "etcd-manager:dev", Replicas: 3, ClientPort: 2379})
			if tc.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantError) {
					t.Fatalf("error %v, want %q", err, tc.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ctr := sts.Spec.Template.Spec.Containers[0]
			args := strings.Join(ctr.Args, " ")
			for _, a := range tc.argsHave {
				if !strings.Contains(args, a) {
					t.Errorf("args %q lack %q", args, a)
				}
			}
			for _, a := range tc.argsLack {
				if slices.ContainsFunc(ctr.Args, func(x string) bool { return x == a || strings.HasPrefix(x, a+"=") }) {
					t.Errorf("args %q have %q", args, a)
				}
			}
			var mounts []string
			for _, m := range ctr.VolumeMounts {
				mounts = append(mounts, m.MountPath)
			}
			if !slices.Equal(mounts, tc.mounts) {
				t.Errorf("mounts %v, want %v", mounts, tc.mounts)
			}
			if ctr.Image != tc.image || len(sts.Spec.VolumeClaimTemplates) != tc.claims ||
				string(sts.Spec.PersistentVolumeClaimRetentionPolicy.WhenDeleted) != tc.whenGone {
				t.Errorf("image %q, claims %d, PVCs when deleted %s", ctr.Image, len(sts.Spec.VolumeClaimTemplates), sts.Spec.PersistentVolumeClaimRetentionPolicy.WhenDeleted)
			}
			if sts.Spec.Template.Spec.HostNetwork {
				t.Error("member pods must use the pod network")
			}
			for _, v := range sts.Spec.Template.Spec.Volumes {
				if sec := v.Secret; sec != nil {
					if sec.DefaultMode == nil || *sec.DefaultMode != 0o440 {
						t.Errorf("Secret volume %s: mode %v, want 0440, for the pods' group on a read-only mount", v.Name, sec.DefaultMode)
					}
					if strings.HasPrefix(v.Name, "backup-") && (len(sec.Items) != 1 || sec.Items[0].Key != "key" || sec.Items[0].Path != "key") {
						t.Errorf("key volume %s: %+v, want the Secret's key as key", v.Name, sec)
					}
				}
			}
			for _, m := range ctr.VolumeMounts {
				if !m.ReadOnly && m.MountPath != "/var/lib/etcd-manager" && m.MountPath != "/tmp" && !strings.HasPrefix(tc.c.Spec.BackupStore.URL, "file://"+m.MountPath) {
					t.Errorf("mount %s is writable", m.MountPath)
				}
			}
			if p := ctr.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
				t.Errorf("readiness probe %+v, want the agent's /readyz", p)
			}
		})
	}
}

func TestRenderPDBKeepsQuorum(t *testing.T) {
	for _, tc := range []struct {
		replicas                     int32
		maxUnavailable, minAvailable string
	}{
		{1, "1", ""}, // nothing to keep: a drain must not hang on it
		{2, "", "2"}, // one away is quorum lost: a drain waits
		{3, "1", ""}, {4, "1", ""}, {5, "1", ""}, {7, "1", ""},
	} {
		c := cluster(func(c *v1alpha1.EtcdCluster) { c.Spec.Replicas = &tc.replicas })
		pdb := RenderPDB(c).Spec
		str := func(v *intstr.IntOrString) string {
			if v == nil {
				return ""
			}
			return v.String()
		}
		if str(pdb.MaxUnavailable) != tc.maxUnavailable || str(pdb.MinAvailable) != tc.minAvailable {
			t.Errorf("%d replicas: maxUnavailable %q, minAvailable %q; want %q, %q", tc.replicas, str(pdb.MaxUnavailable), str(pdb.MinAvailable), tc.maxUnavailable, tc.minAvailable)
		}
	}
}

// The pods pass the restricted Pod Security Standard by default; the
// user's fields replace the defaults' one by one.
func TestRenderSecurityContext(t *testing.T) {
	sts, err := RenderStatefulSet(cluster(nil), RenderOptions{Image: "x", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	pod := sts.Spec.Template.Spec
	ps, cs := pod.SecurityContext, pod.Containers[0].SecurityContext
	if ps == nil || !*ps.RunAsNonRoot || *ps.RunAsUser != 65532 || *ps.RunAsGroup != 65532 || *ps.FSGroup != 65532 || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v", ps)
	}
	if cs == nil || *cs.AllowPrivilegeEscalation || !*cs.ReadOnlyRootFilesystem || !*cs.RunAsNonRoot || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) || cs.Privileged != nil {
		t.Errorf("container security context %+v", cs)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the service account token is mounted")
	}
	if len(pod.TopologySpreadConstraints) != 1 || pod.TopologySpreadConstraints[0].TopologyKey != corev1.LabelHostname ||
		pod.TopologySpreadConstraints[0].WhenUnsatisfiable != corev1.ScheduleAnyway {
		t.Errorf("topology spread %+v, want across nodes, never blocking", pod.TopologySpreadConstraints)
	}

	user := int64(1000)
	c := cluster(func(c *v1alpha1.EtcdCluster) {
		c.Spec.PodTemplate = &v1alpha1.PodTemplate{
			SecurityContext:          &corev1.PodSecurityContext{RunAsUser: &user},
			ContainerSecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: new(false)},
			ImagePullSecrets:         []corev1.LocalObjectReference{{Name: "pull"}},
			ServiceAccountName:       "etcd",
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone",
				WhenUnsatisfiable: corev1.DoNotSchedule}},
		}
	})
	if sts, err = RenderStatefulSet(c, RenderOptions{Image: "x", Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	pod = sts.Spec.Template.Spec
	ps, cs = pod.SecurityContext, pod.Containers[0].SecurityContext
	if *ps.RunAsUser != 1000 || *ps.FSGroup != 65532 || !*ps.RunAsNonRoot || ps.SeccompProfile == nil {
		t.Errorf("merged pod security context %+v: want the user's runAsUser, the rest the defaults'", ps)
	}
	if *cs.ReadOnlyRootFilesystem || *cs.AllowPrivilegeEscalation || cs.Capabilities == nil {
		t.Errorf("merged container security context %+v", cs)
	}
	if pod.ServiceAccountName != "etcd" || len(pod.ImagePullSecrets) != 1 || pod.TopologySpreadConstraints[0].TopologyKey != "topology.kubernetes.io/zone" {
		t.Errorf("pod template fields: %q %v %v", pod.ServiceAccountName, pod.ImagePullSecrets, pod.TopologySpreadConstraints)
	}
}

func TestClientPortOf(t *testing.T) {
	p := int32(12379)
	old := &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "etcd-manager", Ports: []corev1.ContainerPort{{Name: "client", ContainerPort: 4001}}}}}}}}
	for _, tc := range []struct {
		name     string
		c        *v1alpha1.EtcdCluster
		existing *appsv1.StatefulSet
		want     int32
	}{
		{"a new cluster", cluster(nil), nil, 2379},
		{"a cluster an older operator made", cluster(nil), old, 4001},
		{"spec.clientPort", cluster(func(c *v1alpha1.EtcdCluster) { c.Spec.ClientPort = &p }), old, 12379},
	} {
		if got := ClientPortOf(tc.c, tc.existing); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestPruneBackups(t *testing.T) {
	at := func(min int, phase v1alpha1.BackupPhase) v1alpha1.EtcdBackup {
		return v1alpha1.EtcdBackup{
			ObjectMeta: metav1.ObjectMeta{Name: phaseName(phase, min), CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 22, 10, min, 0, 0, time.UTC))},
			Status:     v1alpha1.EtcdBackupStatus{Phase: phase},
		}
	}
	items := []v1alpha1.EtcdBackup{
		at(1, v1alpha1.BackupSucceeded), at(2, v1alpha1.BackupFailed), at(3, v1alpha1.BackupSucceeded),
		at(4, v1alpha1.BackupSucceeded), at(5, v1alpha1.BackupFailed), at(6, v1alpha1.BackupRunning), at(7, v1alpha1.BackupSucceeded),
	}
	var got []string
	for _, b := range PruneBackups(items, 2, 1) {
		got = append(got, b.Name)
	}
	if want := []string{"Succeeded-3", "Failed-2", "Succeeded-1"}; !slices.Equal(got, want) {
		t.Errorf("pruned %v, want %v", got, want)
	}
}

func phaseName(p v1alpha1.BackupPhase, min int) string {
	return string(p) + "-" + string(rune('0'+min))
}

func TestNextRun(t *testing.T) {
	last := time.Date(2026, 11, 22, 10, 7, 0, 0, time.UTC)
	for _, tc := range []struct {
		schedule string
		want     time.Time
	}{
		{"*/15 * * * *", time.Date(2026, 11, 22, 10, 15, 0, 0, time.UTC)},
		{"@hourly", time.Date(2026, 11, 22, 11, 0, 0, 0, time.UTC)},
		{"0 3 * * *", time.Date(2026, 11, 23, 3, 0, 0, 0, time.UTC)},
	} {
		if got, err := NextRun(tc.schedule, last); err != nil || !got.Equal(tc.want) {
			t.Errorf("NextRun(%q) = %s, %v; want %s", tc.schedule, got, err, tc.want)
		}
	}
	if _, err := NextRun("every day", last); err == nil {
		t.Error("a bad schedule was accepted")
	}
}
