package operator

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
			c:        cluster(nil),
			argsHave: []string{"--cluster-name=main", "--node-name=$(POD_NAME)", "--address=$(POD_IP)", "--pki-dir=/etc/etcd-manager/pki", "--listen-client-urls=https://0.0.0.0:4001", "--etcd-bin-dir=/opt"},
			argsLack: []string{"--insecure", "--backup-interval"},
			mounts:   []string{"/var/lib/etcd-manager", "/etc/etcd-manager/pki"},
			image:    "etcd-manager:dev", whenGone: "Retain"},
		{name: "no TLS for etcd: the peer API, which the operator calls, keeps mutual TLS",
			c:        cluster(func(c *v1alpha1.EtcdCluster) { c.Spec.TLS = &v1alpha1.TLSSpec{Enabled: &off} }),
			argsHave: []string{"--etcd-insecure", "--listen-client-urls=http://0.0.0.0:4001", "--pki-dir=/etc/etcd-manager/pki"},
			argsLack: []string{"--insecure"},
			mounts:   []string{"/var/lib/etcd-manager", "/etc/etcd-manager/pki"},
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
			mounts:   []string{"/var/lib/etcd-manager", "/etc/etcd-manager/pki", "/srv/backups/main"},
			image:    "registry.example/etcd-manager:v1", claims: 1, whenGone: "Delete"},
		{name: "backup encryption: the writing key and an older one, each a private Secret volume",
			c: cluster(func(c *v1alpha1.EtcdCluster) {
				c.Spec.Backup = &v1alpha1.BackupPolicy{Encryption: &v1alpha1.BackupEncryption{KeySecret: "backup-key-2", DecryptionKeySecrets: []string{"backup-key-1"}}}
			}),
			argsHave: []string{"--backup-encryption-key-file=/etc/etcd-manager/backup-keys/backup-key/key", "--backup-decryption-key-file=/etc/etcd-manager/backup-keys/backup-old-key-0/key"},
			mounts:   []string{"/var/lib/etcd-manager", "/etc/etcd-manager/pki", "/etc/etcd-manager/backup-keys/backup-key", "/etc/etcd-manager/backup-keys/backup-old-key-0"},
			image:    "etcd-manager:dev", whenGone: "Retain"},
		{name: "a file store at the root is refused",
			c: cluster(func(c *v1alpha1.EtcdCluster) {
				c.Spec.BackupStore = v1alpha1.BackupStore{URL: "file:///", Volume: &corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
			}),
			wantError: "want file:///some/path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sts, err := RenderStatefulSet(tc.c, "etcd-manager:dev", 3)
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
				if sec := v.Secret; sec != nil && strings.HasPrefix(v.Name, "backup-") {
					if sec.DefaultMode == nil || *sec.DefaultMode != 0o400 || len(sec.Items) != 1 || sec.Items[0].Key != "key" || sec.Items[0].Path != "key" {
						t.Errorf("key volume %s: %+v, want mode 0400 and the Secret's key as key", v.Name, sec)
					}
				}
			}
			if p := ctr.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
				t.Errorf("readiness probe %+v, want the agent's /readyz", p)
			}
		})
	}
}

func TestRenderPDBKeepsQuorum(t *testing.T) {
	for replicas, want := range map[int32]int{1: 1, 3: 2, 4: 3, 5: 3, 7: 4} {
		c := cluster(func(c *v1alpha1.EtcdCluster) { c.Spec.Replicas = &replicas })
		if got := RenderPDB(c).Spec.MinAvailable.IntValue(); got != want {
			t.Errorf("%d replicas: minAvailable %d, want %d", replicas, got, want)
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
