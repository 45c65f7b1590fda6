package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// backup-agent backs up a hand-started etcd that requires client
// certificates: periodically and on demand, in the store format that
// list-backups reads. Of two backup agents on one store, only the lock
// holder backs up, and the other takes over when it dies.
func TestBackupAgent(t *testing.T) {
	env := harness.NewEnv(t)
	ip := harness.AllocIP(t)
	files := harness.NewTLSFiles(t, filepath.Join(env.Root, "pki"), ip)
	etcd := env.StartBareTLS(files, ip)

	info := transport.TLSInfo{TrustedCAFile: files.CA, CertFile: files.ClientCert, KeyFile: files.ClientKey}
	tlsCfg, err := info.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	c := tlsClient(t, etcd.ClientURL, tlsCfg)
	harness.WaitFor(t, 30*time.Second, "TLS etcd serving", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Put(ctx, "/ready", "yes")
		return err == nil
	})
	for i := range 30 {
		put(t, c, fmt.Sprintf("/unmanaged/%02d", i), "v")
	}

	args := []string{"--endpoints=" + etcd.ClientURL, "--cacert=" + files.CA, "--cert=" + files.ClientCert, "--key=" + files.ClientKey,
		"--loop-interval=300ms", "--lock-lease=2s", "--backup-interval=1h"}
	// Each on its own machine, so to speak: its own temp dir and spool.
	first := env.StartBackupAgent("backup-1", append(args, "--temp-dir="+filepath.Join(env.Root, "tmp1"))...)
	second := env.StartBackupAgent("backup-2", append(args, "--temp-dir="+filepath.Join(env.Root, "tmp2"))...)

	// The first backup is due at once. Both agents want it; one takes it.
	harness.WaitFor(t, 30*time.Second, "the first periodic backup", func() bool {
		out, _, err := env.Ctl("list-backups")
		return err == nil && len(strings.Fields(out)) == 1
	})
	time.Sleep(3 * time.Second) // several cycles of both agents
	if out := env.MustCtl("list-backups"); len(strings.Fields(out)) != 1 {
		t.Fatalf("two backup agents took %d periodic backups, want 1:\n%s", len(strings.Fields(out)), out)
	}
	holder, other := first, second
	if !strings.Contains(first.Log(), `msg="backup taken"`) {
		holder, other = second, first
	}
	if strings.Contains(other.Log(), `msg="backup taken"`) {
		t.Fatal("both backup agents took backups")
	}

	name := strings.TrimSpace(env.MustCtl("backup-now"))
	if !backupNameRE.MatchString(name) {
		t.Fatalf("backup-now printed %q", name)
	}
	meta := checkRestorable(t, openStore(t, env.StoreURL), name)
	if meta.Revision < 31 || meta.EtcdVersion != harness.DefaultEtcdVersion || meta.ClusterSpec == nil ||
		meta.ClusterSpec.MemberCount != 1 || meta.ClusterSpec.EtcdVersion != harness.DefaultEtcdVersion {
		t.Errorf("meta %+v: want revision >= 31 and a 1-member %s spec", meta, harness.DefaultEtcdVersion)
	}

	// The event history holds the backups, by the agent that took them.
	harness.WaitFor(t, 30*time.Second, "backup-now in the event history", func() bool {
		out, _, err := env.Ctl("events", "--since=1h")
		return err == nil && regexp.MustCompile(regexp.QuoteMeta(holder.Name)+`\s+take-backup \(backup-now .*\bok\b`).MatchString(out)
	})

	// The lock holder dies; the other takes over within the lease.
	holder.Kill()
	start := time.Now()
	name2 := strings.TrimSpace(env.MustCtl("backup-now", "--timeout=30s"))
	if name2 == name || !backupNameRE.MatchString(name2) {
		t.Fatalf("backup-now after failover printed %q", name2)
	}
	t.Logf("failover backup-now took %s", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(other.Log(), name2) {
		t.Errorf("the surviving agent did not take %s", name2)
	}

	// The lock holder captures every change too, under the etcd cluster's
	// ID, and a restore to the newest point holds the last write.
	for i := range 20 {
		put(t, c, fmt.Sprintf("/unmanaged/late/%02d", i), "v")
	}
	head := viewAt(t, c, 0)
	s := openStore(t, env.StoreURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	harness.WaitFor(t, 30*time.Second, "capture to reach the last write", func() bool { return harness.CapturedTo(ctx, s) >= head.rev })
	tls, err := changelog.Timelines(ctx, s)
	if err != nil || len(tls) != 1 {
		t.Fatalf("timelines %v, %v: want the etcd cluster's ID", tls, err)
	}
	meta2, err := backup.ReadMeta(ctx, s, name2)
	if err != nil {
		t.Fatal(err)
	}
	if tls[0] != meta2.ClusterToken {
		t.Errorf("captured under timeline %s, the backups under %s", tls[0], meta2.ClusterToken)
	}
	got, _ := restoreOffline(t, env, s, name2, tls[0], head.rev, harness.DefaultEtcdVersion, "restore-latest", nil)
	if d := head.diff(got); d != "" {
		t.Errorf("restored the newest captured point: %s", d)
	}
}

// Bad configuration is refused before anything runs.
func TestBackupAgentFlags(t *testing.T) {
	env := harness.NewEnv(t)
	tests := []struct {
		args []string
		want string
	}{
		{nil, "--backup-store is required"},
		{[]string{"--backup-store=" + env.StoreURL}, "--endpoints is required"},
		{[]string{"--backup-store=" + env.StoreURL, "--endpoints=127.0.0.1:2379"}, "is not an http(s)://host:port URL"},
		{[]string{"--backup-store=" + env.StoreURL, "--endpoints=https://127.0.0.1:2379", "--cert=/x"}, "--cert and --key go together"},
		{[]string{"--backup-store=" + env.StoreURL, "--endpoints=https://127.0.0.1:2379", "--cacert=/no/such/ca.crt"}, "no such file"},
		{[]string{"--backup-store=" + env.StoreURL, "--endpoints=http://127.0.0.1:2379", "--backup-retention=forever"}, "--backup-retention"},
		// TLS flags with a plain http endpoint: refused, not downgraded.
		{[]string{"--backup-store=" + env.StoreURL, "--endpoints=http://127.0.0.1:2379", "--cacert=" + env.AgentBin}, "plain http, but --cacert, --cert or --key are given"},
	}
	for _, tt := range tests {
		out, err := runAgent(env, append([]string{"backup-agent"}, tt.args...)...)
		if err == nil || !strings.Contains(out, tt.want) {
			t.Errorf("backup-agent %q: err %v, output %q; want an error containing %q", tt.args, err, out, tt.want)
		}
	}
}

func tlsClient(t *testing.T, endpoint string, cfg *tls.Config) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// runAgent runs the etcd-manager binary to completion and returns its
// combined output.
func runAgent(env *harness.Env, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, env.AgentBin, args...).CombinedOutput()
	return string(out), err
}
