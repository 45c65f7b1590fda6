// Package envtest runs the operator against a real kube-apiserver (and its
// etcd), both built by make tools: the CRDs install, their CEL rules refuse
// bad specs, and the reconciles write the objects, status and Events. No
// kubelet runs here, so member pods are stand-ins whose status the test
// sets. In namespaces named real-*, the stand-ins' addresses are those of
// real agents on loopback, with real etcd and a real store, and the
// operator reaches them as it does in production (agents_test.go): the
// path that writes the spec is tested there, and only there. Elsewhere the
// engine is a recording fake, for the reconciles' handling of the
// Kubernetes objects.
package envtest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/operator"
	"github.com/etcd-manager/etcd-manager/internal/operatorapi"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

var (
	k8s     client.Client
	restCfg *rest.Config
	root    string
	fakeCtl = &fakeEngine{
		spec: map[string]*spec.ClusterSpec{}, members: map[string][]string{}, unreachable: map[string][]string{},
		commands: map[string][]cli.CommandRow{}, clusterID: map[string]string{}, failBackups: map[string]bool{"bad": true},
	}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	root, err = harness.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// envtest wants kube-apiserver and etcd side by side.
	assets, err := os.MkdirTemp("", "envtest-assets")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(assets)
	for name, src := range map[string]string{
		"kube-apiserver": filepath.Join(root, "bin", "kubernetes", "kube-apiserver"),
		"etcd":           filepath.Join(root, "bin", "etcd-v3.6.16", "etcd"),
	} {
		if _, err := os.Stat(src); err != nil {
			fmt.Fprintf(os.Stderr, "envtest: %s is missing (%v): run make tools\n", src, err)
			return 1
		}
		if err := os.Symlink(src, filepath.Join(assets, name)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(root, "deploy", "crds")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest: start the API server:", err)
		return 1
	}
	restCfg = cfg
	defer env.Stop()
	scheme, err := operator.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Client: operator.ClientOptions(), Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rec := mgr.GetEventRecorder("etcd-manager-operator")
	engine := routing{real: &operator.Agents{Client: mgr.GetClient()}, fake: fakeCtl}
	for _, r := range []interface{ SetupWithManager(ctrl.Manager) error }{
		&operator.ClusterReconciler{Client: mgr.GetClient(), Engine: engine, Events: rec, Image: "etcd-manager:test", ImageVersions: imageVersions},
		&operator.BackupReconciler{Client: mgr.GetClient(), Engine: engine, Events: rec},
		&operator.RestoreReconciler{Client: mgr.GetClient(), Engine: engine, Events: rec},
		&operator.ScheduleReconciler{Client: mgr.GetClient()},
	} {
		if err := r.SetupWithManager(mgr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		code = 1
	}
	return code
}

// imageVersions are the etcd versions the test's member image carries.
var imageVersions = []string{"3.5.35", "3.6.16", "3.7.3"}

// routing sends the calls for clusters in namespaces named real-* to the
// real engine, which reaches real agents, and the others to the fake.
type routing struct {
	real operator.Engine
	fake operator.Engine
}

func (r routing) for_(c *v1alpha1.EtcdCluster) operator.Engine {
	if strings.HasPrefix(c.Namespace, "real-") {
		return r.real
	}
	return r.fake
}

func (r routing) Status(ctx context.Context, c *v1alpha1.EtcdCluster) (cli.ClusterStatus, error) {
	return r.for_(c).Status(ctx, c)
}
func (r routing) Spec(ctx context.Context, c *v1alpha1.EtcdCluster) (operatorapi.SpecReply, error) {
	return r.for_(c).Spec(ctx, c)
}
func (r routing) WriteSpec(ctx context.Context, c *v1alpha1.EtcdCluster, req operatorapi.WriteSpecRequest) error {
	return r.for_(c).WriteSpec(ctx, c, req)
}
func (r routing) Backups(ctx context.Context, c *v1alpha1.EtcdCluster) ([]cli.BackupRow, error) {
	return r.for_(c).Backups(ctx, c)
}
func (r routing) Commands(ctx context.Context, c *v1alpha1.EtcdCluster) ([]cli.CommandRow, error) {
	return r.for_(c).Commands(ctx, c)
}
func (r routing) BackupNow(ctx context.Context, c *v1alpha1.EtcdCluster) (string, error) {
	return r.for_(c).BackupNow(ctx, c)
}
func (r routing) RestoreBackup(ctx context.Context, c *v1alpha1.EtcdCluster, backup string) (string, error) {
	return r.for_(c).RestoreBackup(ctx, c, backup)
}
func (r routing) MoveLeader(ctx context.Context, c *v1alpha1.EtcdCluster, pod string, to uint64) error {
	return r.for_(c).MoveLeader(ctx, c, pod, to)
}

// fakeEngine stands in for the agents of the clusters outside real-*
// namespaces: it keeps a store spec, reports the members the test sets,
// and records every call. It tests the reconciles' handling of the
// Kubernetes objects, such as the order of a scale's steps; what reaches a
// store and etcd is tested with real agents (agents_test.go).
type fakeEngine struct {
	mu    sync.Mutex
	calls []string
	spec  map[string]*spec.ClusterSpec
	owner map[string]*spec.ClusterOwner
	// members are the members the agents report, per cluster, and
	// version the etcd version they run when it is not the spec's.
	members map[string][]string
	version map[string]string
	// unreachable are agents that did not answer, per cluster.
	unreachable map[string][]string
	// clusterID is the etcd cluster ID the members report, per cluster.
	clusterID map[string]string
	// failBackups are the clusters whose backups fail.
	failBackups map[string]bool
	commands    map[string][]cli.CommandRow
}

func (f *fakeEngine) record(c *v1alpha1.EtcdCluster, call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c.Name+": "+call)
}

func (f *fakeEngine) Calls(cluster string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if strings.HasPrefix(c, cluster+": ") {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeEngine) setMembers(cluster string, names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.members[cluster] = names
}

func (f *fakeEngine) setVersion(cluster, v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.version == nil {
		f.version = map[string]string{}
	}
	f.version[cluster] = v
}

func (f *fakeEngine) setUnreachable(cluster string, addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unreachable[cluster] = addrs
}

func (f *fakeEngine) storeSpec(cluster string) *spec.ClusterSpec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.spec[cluster]
}

// running says whether a member pod of c runs: as the real engine, the
// fake reaches the agents through their pods.
func running(ctx context.Context, c *v1alpha1.EtcdCluster) error {
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(c.Namespace), client.MatchingLabels{operator.LabelCluster: c.Name}); err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning {
			return nil
		}
	}
	return fmt.Errorf("%w: no member pod is running", operator.ErrNoAgent)
}

func (f *fakeEngine) Spec(ctx context.Context, c *v1alpha1.EtcdCluster) (operatorapi.SpecReply, error) {
	if err := running(ctx, c); err != nil {
		return operatorapi.SpecReply{}, err
	}
	f.record(c, "get")
	f.mu.Lock()
	defer f.mu.Unlock()
	var rep operatorapi.SpecReply
	if s := f.spec[c.Name]; s != nil {
		cp := *s
		rep.Spec = &cp
	}
	if o := f.owner[c.Name]; o != nil {
		cp := *o
		rep.Owner = &cp
	}
	return rep, nil
}

func (f *fakeEngine) WriteSpec(ctx context.Context, c *v1alpha1.EtcdCluster, req operatorapi.WriteSpecRequest) error {
	if err := running(ctx, c); err != nil {
		return err
	}
	f.record(c, "write-spec "+req.Spec.String())
	f.mu.Lock()
	defer f.mu.Unlock()
	f.spec[c.Name] = &req.Spec
	if f.owner == nil {
		f.owner = map[string]*spec.ClusterOwner{}
	}
	f.owner[c.Name] = &req.Owner
	return nil
}

func (f *fakeEngine) Status(ctx context.Context, c *v1alpha1.EtcdCluster) (cli.ClusterStatus, error) {
	if err := running(ctx, c); err != nil {
		return cli.ClusterStatus{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	st := cli.ClusterStatus{Spec: f.spec[c.Name], Unreachable: f.unreachable[c.Name]}
	version := c.Spec.Version
	if v := f.version[c.Name]; v != "" {
		version = v
	}
	for i, name := range f.members[c.Name] {
		// The manager leader is the first member, the etcd leader the
		// last: the operator must follow etcd's.
		role := cli.RoleMember
		if i == 0 {
			role, st.Leader = cli.RoleLeader, name
		}
		last := i == len(f.members[c.Name])-1
		if last {
			st.EtcdLeader = name
		}
		var settings spec.Settings
		if s := f.spec[c.Name]; s != nil {
			settings = s.EtcdSettings
		}
		st.Agents = append(st.Agents, cli.AgentStatus{ID: name, Role: role, Healthy: true, EtcdVersion: version, MemberID: fmt.Sprintf("%x", i+1),
			ClusterID: f.clusterID[c.Name], EtcdLeader: last, EtcdSettings: settings})
	}
	return st, nil
}

func (f *fakeEngine) Backups(ctx context.Context, c *v1alpha1.EtcdCluster) ([]cli.BackupRow, error) {
	if err := running(ctx, c); err != nil {
		return nil, err
	}
	return []cli.BackupRow{{Name: "2026-11-22T10:00:00Z-000001", EtcdVersion: c.Spec.Version, Size: 4096, Revision: 42, AgeSeconds: 30}}, nil
}

func (f *fakeEngine) Commands(ctx context.Context, c *v1alpha1.EtcdCluster) ([]cli.CommandRow, error) {
	if err := running(ctx, c); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.commands[c.Name], nil
}

func (f *fakeEngine) BackupNow(ctx context.Context, c *v1alpha1.EtcdCluster) (string, error) {
	if err := running(ctx, c); err != nil {
		return "", err
	}
	f.record(c, "backup-now")
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failBackups[c.Name] {
		id := fmt.Sprintf("cmd-backup-%d", len(f.commands[c.Name]))
		f.commands[c.Name] = append(f.commands[c.Name], cli.CommandRow{ID: id, Kind: "backup-now", State: spec.CommandFailed, Detail: "the store refused the upload"})
		return id, nil
	}
	f.commands[c.Name] = append(f.commands[c.Name], cli.CommandRow{ID: "cmd-backup", Kind: "backup-now", State: spec.CommandDone, Backup: "2026-11-22T10:00:00Z-000001"})
	return "cmd-backup", nil
}

// RestoreBackup queues a restore that the engine at once takes up: it
// stays in the queue, running, until the test finishes it.
func (f *fakeEngine) RestoreBackup(ctx context.Context, c *v1alpha1.EtcdCluster, backup string) (string, error) {
	if err := running(ctx, c); err != nil {
		return "", err
	}
	f.record(c, "restore-backup "+backup)
	f.mu.Lock()
	defer f.mu.Unlock()
	id := fmt.Sprintf("cmd-restore-%d", len(f.commands[c.Name]))
	f.commands[c.Name] = append(f.commands[c.Name], cli.CommandRow{ID: id, Kind: "restore-backup", State: spec.CommandRunning, Phase: spec.RestoreRestoring,
		Backup: backup, Queued: time.Now().UTC().Format(time.RFC3339)})
	return id, nil
}

// finishCommand takes a command out of the queue, as the engine does when
// a restore is complete, or a person by hand; clusterID, if set, is the
// etcd cluster ID the members report from then on.
func (f *fakeEngine) finishCommand(cluster, id, clusterID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commands[cluster] = slices.DeleteFunc(f.commands[cluster], func(r cli.CommandRow) bool { return r.ID == id })
	if clusterID != "" {
		f.clusterID[cluster] = clusterID
	}
}

func (f *fakeEngine) setClusterID(cluster, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clusterID[cluster] = id
}

func (f *fakeEngine) MoveLeader(_ context.Context, c *v1alpha1.EtcdCluster, pod string, to uint64) error {
	f.record(c, fmt.Sprintf("move-leader %s %x", pod, to))
	return nil
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, detail := cond()
		if ok {
			return
		}
		last = detail
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, last)
}

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func validCluster(ns, name string) *v1alpha1.EtcdCluster {
	return &v1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.EtcdClusterSpec{
			Version:     "3.6.16",
			BackupStore: v1alpha1.BackupStore{URL: "s3://bucket/" + name, CredentialsSecret: "store-creds"},
		},
	}
}

func TestCELRulesRejectBadSpecs(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	i32 := func(v int32) *int32 { return &v }
	hostPath := &corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/backups"}}
	tests := []struct {
		name   string
		mutate func(c *v1alpha1.EtcdCluster)
		want   string // in the API server's refusal
	}{
		{"no replicas below 1", func(c *v1alpha1.EtcdCluster) { c.Spec.Replicas = i32(0) }, "spec.replicas"},
		{"a version that is not 3.x.y", func(c *v1alpha1.EtcdCluster) { c.Spec.Version = "v3.6" }, "spec.version"},
		{"an unknown store scheme", func(c *v1alpha1.EtcdCluster) { c.Spec.BackupStore.URL = "ftp://x/y" }, "url must start with file:///, s3://, gs:// or azblob://"},
		{"a file store without a volume", func(c *v1alpha1.EtcdCluster) { c.Spec.BackupStore.URL = "file:///srv/backups" }, "a file:// store needs a volume"},
		{"a volume on a cloud store", func(c *v1alpha1.EtcdCluster) { c.Spec.BackupStore.Volume = hostPath }, "a file:// store needs a volume"},
		{"a bad retention", func(c *v1alpha1.EtcdCluster) { c.Spec.Backup = &v1alpha1.BackupPolicy{Retention: "forever"} }, "spec.backup.retention"},
		{"a bad deletion policy", func(c *v1alpha1.EtcdCluster) { c.Spec.DeletionPolicy = "Shred" }, "spec.deletionPolicy"},
		{"a name too long for its pods", func(c *v1alpha1.EtcdCluster) { c.Name = strings.Repeat("a", 53) }, "the name must be 1 to 52"},
		{"a name a Service cannot take", func(c *v1alpha1.EtcdCluster) { c.Name = "1etcd" }, "starting with a letter"},
		{"a backup interval the agents refuse", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Backup = &v1alpha1.BackupPolicy{Interval: &metav1.Duration{Duration: 30 * time.Second}}
		}, "backup.interval must be at least 1m"},
		{"an encryption key Secret that cannot be a name", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Backup = &v1alpha1.BackupPolicy{Encryption: &v1alpha1.BackupEncryption{KeySecret: "../key"}}
		}, "spec.backup.encryption.keySecret"},
		{"an older key Secret that cannot be a name", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Backup = &v1alpha1.BackupPolicy{Encryption: &v1alpha1.BackupEncryption{KeySecret: "k", DecryptionKeySecrets: []string{"Old Key"}}}
		}, "spec.backup.encryption.decryptionKeySecrets"},
		{"a negative grace", func(c *v1alpha1.EtcdCluster) { c.Spec.MemberFailureGrace = &metav1.Duration{Duration: -time.Second} }, "memberFailureGrace must not be negative"},
		{"an etcd setting with the dashes", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Etcd = &v1alpha1.EtcdSpec{Settings: map[string]string{"--snapshot-count": "5"}}
		}, "settings are etcd flag names without the dashes"},
		{"a compaction mode etcd lacks", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Etcd = &v1alpha1.EtcdSpec{Compaction: &v1alpha1.CompactionPolicy{Mode: "hourly", Retention: "1"}}
		}, "spec.etcd.compaction.mode"},
		{"a defrag window in a time zone", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Etcd = &v1alpha1.EtcdSpec{Defrag: &v1alpha1.DefragPolicy{Window: "TZ=Europe/Paris 0 3 * * *"}}
		}, "the defrag window is in UTC"},
		{"a defrag window of a second", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Etcd = &v1alpha1.EtcdSpec{Defrag: &v1alpha1.DefragPolicy{WindowDuration: &metav1.Duration{Duration: time.Second}}}
		}, "defrag.windowDuration must be from 1m to 168h"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := validCluster(ns, "bad")
			tc.mutate(c)
			err := k8s.Create(ctx, c)
			if err == nil {
				_ = k8s.Delete(ctx, c)
				t.Fatal("the API server accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("refused with %q, want it to mention %q", err, tc.want)
			}
		})
	}
	// A good file store, and the fields that cannot change on a live cluster.
	good := validCluster(ns, "fixed")
	good.Spec.BackupStore = v1alpha1.BackupStore{URL: "file:///srv/backups/fixed", Volume: hostPath}
	if err := k8s.Create(ctx, good); err != nil {
		t.Fatalf("a valid file store was refused: %v", err)
	}
	changes := []struct {
		name   string
		mutate func(c *v1alpha1.EtcdCluster)
		want   string
	}{
		{"the store", func(c *v1alpha1.EtcdCluster) { c.Spec.BackupStore.URL = "file:///srv/backups/other" }, "backupStore.url cannot change"},
		{"TLS", func(c *v1alpha1.EtcdCluster) { c.Spec.TLS = &v1alpha1.TLSSpec{Enabled: new(bool)} }, "tls.enabled cannot change"},
		{"the CA", func(c *v1alpha1.EtcdCluster) { c.Spec.TLS = &v1alpha1.TLSSpec{CASecret: "other-ca"} }, "tls.caSecret cannot change"},
		{"the storage", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Storage = &corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}}
		}, "storage cannot change"},
	}
	for _, tc := range changes {
		t.Run("change "+tc.name, func(t *testing.T) {
			var c v1alpha1.EtcdCluster
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(good), &c); err != nil {
				t.Fatal(err)
			}
			orig := c.DeepCopy()
			tc.mutate(&c)
			if err := k8s.Patch(ctx, &c, client.MergeFrom(orig)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("update: %v, want a refusal mentioning %q", err, tc.want)
			}
		})
	}
	// Backups and restores are requests: their specs are fixed, and a
	// restore names exactly one target.
	b := &v1alpha1.EtcdBackup{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: ns}, Spec: v1alpha1.EtcdBackupSpec{ClusterName: "nonexistent"}}
	if err := k8s.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	// A merge patch, so that the reconcile's status writes cannot race it.
	orig := b.DeepCopy()
	b.Spec.ClusterName = "other"
	if err := k8s.Patch(ctx, b, client.MergeFrom(orig)); err == nil || !strings.Contains(err.Error(), "spec cannot change") {
		t.Errorf("changing a backup's cluster: %v", err)
	}
	for _, rs := range []v1alpha1.EtcdRestoreSpec{
		{BackupName: "x"},
		{BackupName: "x", ClusterName: "a", ClusterTemplate: &v1alpha1.ClusterTemplate{Name: "n", Spec: validCluster(ns, "n").Spec}},
	} {
		r := &v1alpha1.EtcdRestore{ObjectMeta: metav1.ObjectMeta{GenerateName: "r-", Namespace: ns}, Spec: rs}
		if err := k8s.Create(ctx, r); err == nil || !strings.Contains(err.Error(), "set exactly one of clusterName") {
			t.Errorf("restore %+v: %v", rs, err)
		}
	}
}

// memberPod stands in for a pod the StatefulSet controller and the kubelet
// would make: created, then marked running.
func memberPod(t *testing.T, c *v1alpha1.EtcdCluster, ordinal int) {
	t.Helper()
	ctx := t.Context()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", c.Name, ordinal), Namespace: c.Namespace, Labels: map[string]string{operator.LabelCluster: c.Name}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd-manager", Image: "etcd-manager:test"}}},
	}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "etcd-manager", Ready: true, Image: "etcd-manager:test", ImageID: "x",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
	}}}
	if err := k8s.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
}

func TestClusterReconcile(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	c := validCluster(ns, "etcd")
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(c)

	// The objects: a StatefulSet of agents, two Services, a PDB, a CA.
	var sts appsv1.StatefulSet
	waitFor(t, "the StatefulSet", 30*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, key, &sts)
		return err == nil, fmt.Sprint(err)
	})
	if r := *sts.Spec.Replicas; r != 3 {
		t.Errorf("replicas %d, want the default 3", r)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement || sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Errorf("pod management %s, update strategy %s", sts.Spec.PodManagementPolicy, sts.Spec.UpdateStrategy.Type)
	}
	ctr := sts.Spec.Template.Spec.Containers[0]
	args := strings.Join(ctr.Args, " ")
	for _, want := range []string{"--node-name=$(POD_NAME)", "--cluster-name=etcd", "--backup-store=s3://bucket/etcd", "--pki-dir=", "--listen-client-urls=https://0.0.0.0:2379", "--readiness=voter"} {
		if !strings.Contains(args, want) {
			t.Errorf("agent args %q lack %q", args, want)
		}
	}
	if ctr.Image != "etcd-manager:test" || ctr.EnvFrom[0].SecretRef.Name != "store-creds" || sts.Spec.Template.Spec.HostNetwork {
		t.Errorf("container image %q, envFrom %+v, host network %v", ctr.Image, ctr.EnvFrom, sts.Spec.Template.Spec.HostNetwork)
	}
	if len(sts.OwnerReferences) != 1 || sts.OwnerReferences[0].Name != "etcd" {
		t.Errorf("owner references %+v", sts.OwnerReferences)
	}
	var peers, clients corev1.Service
	if err := k8s.Get(ctx, key, &peers); err != nil || peers.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("headless service: %v %q", err, peers.Spec.ClusterIP)
	}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "etcd-client"}, &clients); err != nil || clients.Spec.Ports[0].Port != 2379 {
		t.Errorf("client service: %v %+v", err, clients.Spec.Ports)
	}
	var pdb policyv1.PodDisruptionBudget
	if err := k8s.Get(ctx, key, &pdb); err != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("PDB: %v, maxUnavailable %v, minAvailable %v, want one pod away at a time", err, pdb.Spec.MaxUnavailable, pdb.Spec.MinAvailable)
	}
	var ca corev1.Secret
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "etcd-ca"}, &ca); err != nil || len(ca.Data["tls.key"]) == 0 {
		t.Errorf("generated CA: %v", err)
	}

	// With no pod running, the status says what it waits for.
	waitFor(t, "a status that waits for a pod", 30*time.Second, func() (bool, string) {
		var got v1alpha1.EtcdCluster
		if err := k8s.Get(ctx, key, &got); err != nil {
			return false, err.Error()
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgressing)
		return cond != nil && cond.Status == metav1.ConditionTrue && strings.Contains(cond.Message, "no member pod is running") &&
			got.Status.Selector == "etcd-manager.dev/cluster=etcd", fmt.Sprintf("%+v", got.Status)
	})

	// Pods run: the spec goes to the store, and the members to the status.
	for i := range 3 {
		memberPod(t, c, i)
	}
	waitFor(t, "the spec in the store", 30*time.Second, func() (bool, string) {
		s := fakeCtl.storeSpec("etcd")
		return s != nil && reflect.DeepEqual(*s, spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16", OrdinalMembers: true}), fmt.Sprint(s)
	})
	fakeCtl.setMembers("etcd", "etcd-0", "etcd-1", "etcd-2")
	waitFor(t, "Available", 30*time.Second, func() (bool, string) {
		var got v1alpha1.EtcdCluster
		if err := k8s.Get(ctx, key, &got); err != nil {
			return false, err.Error()
		}
		return meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionAvailable) && got.Status.ReadyReplicas == 3 &&
			got.Status.Leader == "etcd-2" && len(got.Status.Members) == 3 && got.Status.Members[2].Role == "leader" && got.Status.Members[0].Role == "follower" &&
			got.Status.CurrentVersion == "3.6.16" && got.Status.LastBackup != nil &&
			meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionBackupReady), fmt.Sprintf("%+v", got.Status)
	})

	// kubectl scale --replicas=5: the StatefulSet grows, then the store.
	scale(t, c, 5)
	waitFor(t, "5 pods and a spec of 5", 30*time.Second, func() (bool, string) {
		s := fakeCtl.storeSpec("etcd")
		_ = k8s.Get(ctx, key, &sts)
		return *sts.Spec.Replicas == 5 && s.MemberCount == 5, fmt.Sprintf("sts %d, store %v", *sts.Spec.Replicas, s)
	})
	fakeCtl.setMembers("etcd", "etcd-0", "etcd-1", "etcd-2", "etcd-3", "etcd-4")

	// Back to 3: the store first; the StatefulSet waits for the engine.
	scale(t, c, 3)
	waitFor(t, "a spec of 3", 30*time.Second, func() (bool, string) {
		s := fakeCtl.storeSpec("etcd")
		return s.MemberCount == 3, fmt.Sprint(s)
	})
	time.Sleep(4 * time.Second) // a reconcile or more
	if err := k8s.Get(ctx, key, &sts); err != nil || *sts.Spec.Replicas != 5 {
		t.Fatalf("the StatefulSet shrank to %d before the members of ordinals 3 and 4 were removed (%v)", *sts.Spec.Replicas, err)
	}
	fakeCtl.setMembers("etcd", "etcd-0", "etcd-1", "etcd-2", "etcd-3")
	time.Sleep(4 * time.Second)
	if err := k8s.Get(ctx, key, &sts); err != nil || *sts.Spec.Replicas != 5 {
		t.Fatalf("the StatefulSet shrank to %d while etcd-3 was a member (%v)", *sts.Spec.Replicas, err)
	}
	// An agent that does not answer may be etcd-4's, a member still: the
	// answers of the others are not enough.
	fakeCtl.setUnreachable("etcd", "10.0.0.4:8000")
	fakeCtl.setMembers("etcd", "etcd-0", "etcd-1", "etcd-2")
	time.Sleep(4 * time.Second)
	if err := k8s.Get(ctx, key, &sts); err != nil || *sts.Spec.Replicas != 5 {
		t.Fatalf("the StatefulSet shrank to %d while an agent did not answer (%v)", *sts.Spec.Replicas, err)
	}
	fakeCtl.setUnreachable("etcd")
	waitFor(t, "the StatefulSet back to 3", 30*time.Second, func() (bool, string) {
		_ = k8s.Get(ctx, key, &sts)
		return *sts.Spec.Replicas == 3, fmt.Sprint(*sts.Spec.Replicas)
	})

	// Events were recorded for what was done.
	waitFor(t, "events", 30*time.Second, func() (bool, string) {
		var evs eventsv1.EventList
		if err := k8s.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var reasons []string
		for _, e := range evs.Items {
			reasons = append(reasons, e.Reason)
		}
		return slices.Contains(reasons, "CAGenerated") && slices.Contains(reasons, "Scaled") &&
			slices.Contains(reasons, "MemberAdded") && slices.Contains(reasons, "MemberRemoved"), strings.Join(reasons, ",")
	})
}

// patchSpec merges patch into the cluster.
func patchSpec(t *testing.T, c *v1alpha1.EtcdCluster, patch string) {
	t.Helper()
	var cur v1alpha1.EtcdCluster
	if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(c), &cur); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Patch(t.Context(), &cur, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
}

func scale(t *testing.T, c *v1alpha1.EtcdCluster, n int32) {
	t.Helper()
	var cur v1alpha1.EtcdCluster
	if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(c), &cur); err != nil {
		t.Fatal(err)
	}
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n))
	if err := k8s.SubResource("scale").Patch(t.Context(), &cur, patch); err != nil {
		t.Fatalf("scale to %d: %v", n, err)
	}
}

func TestBackupAndRestore(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	c := validCluster(ns, "bk")
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	memberPod(t, c, 0)
	b := &v1alpha1.EtcdBackup{ObjectMeta: metav1.ObjectMeta{Name: "now", Namespace: ns}, Spec: v1alpha1.EtcdBackupSpec{ClusterName: "bk"}}
	if err := k8s.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the backup to succeed", 30*time.Second, func() (bool, string) {
		var got v1alpha1.EtcdBackup
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(b), &got); err != nil {
			return false, err.Error()
		}
		s := got.Status
		return s.Phase == v1alpha1.BackupSucceeded && s.BackupName == "2026-11-22T10:00:00Z-000001" && s.Revision == 42 && s.Size == 4096 && s.CompletionTime != nil,
			fmt.Sprintf("%+v", s)
	})
	if n := len(slices.DeleteFunc(fakeCtl.Calls("bk"), func(s string) bool { return !strings.HasSuffix(s, "backup-now") })); n != 1 {
		t.Errorf("backup-now queued %d times, want once", n)
	}

	// In place: the restore is queued once, followed through its phases,
	// and done when the members report a new etcd cluster.
	fakeCtl.setMembers("bk", "bk-0")
	fakeCtl.setClusterID("bk", "c1")
	r := &v1alpha1.EtcdRestore{ObjectMeta: metav1.ObjectMeta{Name: "back", Namespace: ns}, Spec: v1alpha1.EtcdRestoreSpec{ClusterName: "bk", BackupName: "2026-11-22T10:00:00Z-000001"}}
	if err := k8s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	got := waitRestore(t, r, func(s v1alpha1.EtcdRestoreStatus) bool {
		return s.Phase == v1alpha1.RestoreRunning && s.Step == spec.RestoreRestoring
	})
	if got.ReplacedClusterID != "c1" || got.ClusterName != "bk" {
		t.Errorf("status %+v, want cluster bk replacing etcd cluster c1", got)
	}
	fakeCtl.finishCommand("bk", got.CommandID, "c2")
	got = waitRestore(t, r, func(s v1alpha1.EtcdRestoreStatus) bool { return s.Phase == v1alpha1.RestoreSucceeded })
	if got.CompletionTime == nil || !strings.Contains(got.Message, "into etcd cluster c2") {
		t.Errorf("status %+v", got)
	}
	if n := len(slices.DeleteFunc(fakeCtl.Calls("bk"), func(s string) bool { return !strings.Contains(s, "restore-backup") })); n != 1 {
		t.Errorf("restore queued %d times, want once", n)
	}

	// A command deleted by hand is no success: the cluster is the same.
	r = &v1alpha1.EtcdRestore{ObjectMeta: metav1.ObjectMeta{Name: "by-hand", Namespace: ns}, Spec: v1alpha1.EtcdRestoreSpec{ClusterName: "bk", BackupName: "2026-11-22T10:00:00Z-000001"}}
	if err := k8s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	got = waitRestore(t, r, func(s v1alpha1.EtcdRestoreStatus) bool { return s.Phase == v1alpha1.RestoreRunning && s.Step != "" })
	fakeCtl.finishCommand("bk", got.CommandID, "")
	got = waitRestore(t, r, func(s v1alpha1.EtcdRestoreStatus) bool { return s.Phase == v1alpha1.RestoreFailed })
	if !strings.Contains(got.Message, "deleted by hand") {
		t.Errorf("message %q", got.Message)
	}

	// A backup the store lacks fails at once, and queues nothing.
	r = &v1alpha1.EtcdRestore{ObjectMeta: metav1.ObjectMeta{Name: "typo", Namespace: ns}, Spec: v1alpha1.EtcdRestoreSpec{ClusterName: "bk", BackupName: "2026-11-22T10:00:00Z-999999"}}
	if err := k8s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	got = waitRestore(t, r, func(s v1alpha1.EtcdRestoreStatus) bool { return s.Phase == v1alpha1.RestoreFailed })
	if !strings.Contains(got.Message, "holds no backup 2026-11-22T10:00:00Z-999999") || got.CommandID != "" {
		t.Errorf("status %+v", got)
	}
}

func waitRestore(t *testing.T, r *v1alpha1.EtcdRestore, cond func(v1alpha1.EtcdRestoreStatus) bool) v1alpha1.EtcdRestoreStatus {
	t.Helper()
	var got v1alpha1.EtcdRestore
	waitFor(t, "restore "+r.Name, 30*time.Second, func() (bool, string) {
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(r), &got); err != nil {
			return false, err.Error()
		}
		return cond(got.Status), fmt.Sprintf("%+v", got.Status)
	})
	return got.Status
}

func TestRestoreFromTemplate(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	src := validCluster(ns, "src")
	if err := k8s.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	const backup = "2026-11-22T10:00:00Z-000001"
	restore := func(name string, tmpl *v1alpha1.EtcdCluster) *v1alpha1.EtcdRestore {
		t.Helper()
		r := &v1alpha1.EtcdRestore{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1alpha1.EtcdRestoreSpec{BackupName: backup, ClusterTemplate: &v1alpha1.ClusterTemplate{Name: tmpl.Name, Spec: tmpl.Spec}}}
		if err := k8s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		return r
	}

	// Refused: a cluster of that name exists; another cluster uses the store.
	got := waitRestore(t, restore("over-src", src), func(s v1alpha1.EtcdRestoreStatus) bool { return s.Phase == v1alpha1.RestoreFailed })
	if !strings.Contains(got.Message, "already exists") {
		t.Errorf("over an existing cluster: %q", got.Message)
	}
	twin := validCluster(ns, "twin")
	twin.Spec.BackupStore = src.Spec.BackupStore
	got = waitRestore(t, restore("on-src-store", twin), func(s v1alpha1.EtcdRestoreStatus) bool { return s.Phase == v1alpha1.RestoreFailed })
	if !strings.Contains(got.Message, "uses the backup store") {
		t.Errorf("on another cluster's store: %q", got.Message)
	}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "twin"}, &v1alpha1.EtcdCluster{}); err == nil {
		t.Errorf("EtcdCluster twin was made on a store in use")
	}

	// A new cluster: made with no spec in its store until the restore is
	// queued, so that the agents cannot create an empty cluster first.
	r := restore("fresh", validCluster(ns, "new"))
	var c v1alpha1.EtcdCluster
	waitFor(t, "EtcdCluster new", 30*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "new"}, &c)
		return err == nil, fmt.Sprint(err)
	})
	if c.Annotations[operator.AnnotationRestoredBy] != "fresh" || c.Annotations[operator.AnnotationRestorePending] != "fresh" {
		t.Errorf("annotations %v", c.Annotations)
	}
	waitFor(t, "a Progressing condition that waits for the restore", 30*time.Second, func() (bool, string) {
		var got v1alpha1.EtcdCluster
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(&c), &got); err != nil {
			return false, err.Error()
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgressing)
		return cond != nil && strings.Contains(cond.Message, "waiting for EtcdRestore fresh to queue its restore"), fmt.Sprintf("%+v", cond)
	})
	for i := range 3 {
		memberPod(t, &c, i)
	}
	got = waitRestore(t, r, func(s v1alpha1.EtcdRestoreStatus) bool { return s.Phase == v1alpha1.RestoreRunning && s.Step != "" })
	waitFor(t, "the spec in the new store", 30*time.Second, func() (bool, string) {
		s := fakeCtl.storeSpec("new")
		return s != nil && s.MemberCount == 3, fmt.Sprint(s)
	})
	calls := fakeCtl.Calls("new")
	queued := slices.IndexFunc(calls, func(s string) bool { return strings.Contains(s, "restore-backup "+backup) })
	written := slices.IndexFunc(calls, func(s string) bool { return strings.Contains(s, "write-spec") })
	if queued < 0 || written < queued {
		t.Errorf("the spec was written (call %d) before the restore was queued (call %d): %q", written, queued, calls)
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(&c), &c); err != nil || c.Annotations[operator.AnnotationRestorePending] != "" {
		t.Errorf("annotations %v after the restore was queued (%v)", c.Annotations, err)
	}
	fakeCtl.setMembers("new", "new-0", "new-1", "new-2")
	fakeCtl.finishCommand("new", got.CommandID, "c9")
	got = waitRestore(t, r, func(s v1alpha1.EtcdRestoreStatus) bool { return s.Phase == v1alpha1.RestoreSucceeded })
	if got.ClusterName != "new" || got.ReplacedClusterID != "" {
		t.Errorf("status %+v", got)
	}

	// A store that live members of another cluster report from is in use.
	fakeCtl.setMembers("new2", "elsewhere-0")
	r = restore("intruder", validCluster(ns, "new2"))
	var c2 v1alpha1.EtcdCluster
	waitFor(t, "EtcdCluster new2", 30*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "new2"}, &c2)
		return err == nil, fmt.Sprint(err)
	})
	memberPod(t, &c2, 0)
	got = waitRestore(t, r, func(s v1alpha1.EtcdRestoreStatus) bool { return s.Phase == v1alpha1.RestoreFailed })
	if !strings.Contains(got.Message, "is in use: member elsewhere-0") || !strings.Contains(got.Message, "deleted EtcdCluster new2") || got.CommandID != "" {
		t.Errorf("status %+v", got)
	}
	// The cluster it made, which would wait for the restore forever, is gone.
	waitFor(t, "EtcdCluster new2 deleted", 30*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(&c2), &c2)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

func TestBackupSchedule(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	for _, name := range []string{"good", "bad"} {
		c := validCluster(ns, name)
		if err := k8s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		memberPod(t, c, 0)
	}
	limit := func(n int32) *int32 { return &n }
	schedule := func(name, cluster, cron string) *v1alpha1.EtcdBackupSchedule {
		t.Helper()
		s := &v1alpha1.EtcdBackupSchedule{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: v1alpha1.EtcdBackupScheduleSpec{
			Schedule: cron, BackupTemplate: v1alpha1.EtcdBackupSpec{ClusterName: cluster},
			SuccessfulBackupsHistoryLimit: limit(2), FailedBackupsHistoryLimit: limit(1)}}
		if err := k8s.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	good := schedule("good", "good", "@every 2s")
	schedule("bad", "bad", "@every 2s")
	broken := schedule("broken", "good", "61 * * * *")

	// Each schedule makes EtcdBackups; only the newest succeeded (2) and
	// failed (1) ones stay.
	seen := map[string]map[string]bool{"good": {}, "bad": {}, "broken": {}}
	phases := func() map[string]map[v1alpha1.BackupPhase]int {
		var list v1alpha1.EtcdBackupList
		if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		out := map[string]map[v1alpha1.BackupPhase]int{"good": {}, "bad": {}, "broken": {}}
		for _, b := range list.Items {
			sched := b.Labels["etcd-manager.dev/schedule"]
			if seen[sched] == nil || len(b.OwnerReferences) != 1 || b.OwnerReferences[0].Name != sched || b.Spec.ClusterName != sched {
				t.Fatalf("EtcdBackup %s: labels %v, owners %+v, spec %+v", b.Name, b.Labels, b.OwnerReferences, b.Spec)
			}
			seen[sched][b.Name] = true
			out[sched][b.Status.Phase]++
		}
		return out
	}
	waitFor(t, "5 backups of each schedule", 60*time.Second, func() (bool, string) {
		p := phases()
		return len(seen["good"]) >= 5 && len(seen["bad"]) >= 5, fmt.Sprintf("seen %d and %d, now %v", len(seen["good"]), len(seen["bad"]), p)
	})
	var got v1alpha1.EtcdBackupSchedule
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(good), &got); err != nil || got.Status.LastSuccessfulTime == nil || got.Status.LastScheduleTime == nil {
		t.Errorf("schedule status %+v (%v)", got.Status, err)
	}

	// A schedule that does not parse says so.
	waitFor(t, "the broken schedule to say why", 30*time.Second, func() (bool, string) {
		var got v1alpha1.EtcdBackupSchedule
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(broken), &got); err != nil {
			return false, err.Error()
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, "Valid")
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == "BadSchedule", fmt.Sprintf("%+v", got.Status)
	})
	if len(seen["broken"]) > 0 {
		t.Errorf("a schedule that does not parse made backups")
	}

	// Suspended: no new backups; the history settles at its limits.
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"suspend":true}}`))
	for _, name := range []string{"good", "bad"} {
		if err := k8s.Patch(ctx, &v1alpha1.EtcdBackupSchedule{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, patch); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the history at its limits", 30*time.Second, func() (bool, string) {
		p := phases()
		return p["good"][v1alpha1.BackupSucceeded] == 2 && len(p["good"]) == 1 && p["bad"][v1alpha1.BackupFailed] == 1 && len(p["bad"]) == 1, fmt.Sprint(p)
	})
	before := len(seen["good"]) + len(seen["bad"])
	time.Sleep(5 * time.Second)
	phases()
	if n := len(seen["good"]) + len(seen["bad"]); n != before {
		t.Errorf("suspended schedules made %d more backups", n-before)
	}
}

// The operator's member image defaults to its own, read from its pod.
func TestOwnImage(t *testing.T) {
	ns := newNamespace(t)
	kc, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, ctrs := range map[string][]corev1.Container{
		"one":  {{Name: "anything", Image: "registry.example/em:one"}},
		"many": {{Name: "sidecar", Image: "registry.example/proxy:1"}, {Name: "operator", Image: "registry.example/em:many"}},
		"none": {{Name: "sidecar", Image: "registry.example/proxy:1"}, {Name: "other", Image: "registry.example/em:x"}},
	} {
		if err := k8s.Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{Containers: ctrs}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ ns, pod, want, err string }{
		{ns, "one", "registry.example/em:one", ""},
		{ns, "many", "registry.example/em:many", ""},
		{ns, "none", "", `has no container "operator"`},
		{ns, "gone", "", "cannot be read"},
		{"", "one", "", "POD_NAME"},
	} {
		got, err := operator.OwnImage(t.Context(), kc, tc.ns, tc.pod)
		if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("OwnImage(%q, %q) = %q, %v; want %q, error with %q", tc.ns, tc.pod, got, err, tc.want, tc.err)
		}
	}
}
