package integration

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// fill writes n values of 1 MiB of random (incompressible) bytes.
func fill(t *testing.T, c *clientv3.Client, n int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for i := range n {
		if _, err := rand.Read(buf); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.Put(ctx, fmt.Sprintf("/fill/%04d", i), string(buf))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func scrape(t *testing.T, url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

var failuresRE = regexp.MustCompile(`(?m)^etcd_manager_backup_failures_total (\d+)`)

// commandLine returns list-commands' line for id.
func commandLine(env *harness.Env, id string) string {
	out, _, _ := env.Ctl("list-commands")
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, id+" ") {
			return l
		}
	}
	return ""
}

// The store dies in the middle of a backup's upload: the backup fails
// with a clear error and a metric, etcd is untouched, and once the store
// is back the queued backup-now is retried and completes. The partial
// upload is never listed.
func TestBackupStoreFailsMidUpload(t *testing.T) {
	minio := harness.StartMinIO(t)
	minio.CreateBucket(t, "faults")
	env := harness.NewEnv(t)
	env.UseStore(minio.StoreURL("faults", "etcd/main"), minio.Env())
	setEnv(t, minio.Env())
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	// No merges of captured segments: their uploads go in parts too, and
	// the upload cut below must be the backup's.
	agents := env.StartAgents(1, harness.AgentOptions{Metrics: true, ExtraArgs: []string{"--backup-retry-delay=2s", "--capture-merge-interval=0"}})
	harness.WaitSettled(t, agents, 1, settleTimeout)
	// The first periodic backup, due at once, must be done before the
	// fill: the upload cut below must be backup-now's.
	agents[0].WaitLog(`msg="backup taken"`, 1, time.Minute)
	c := clusterClient(t, agents)
	fill(t, c, 64)
	etcdPID := agents[0].EtcdPID()
	before := strings.Fields(env.MustCtl("list-backups")) // the first periodic backup
	// Continuous capture uploads the fill's segments in parts too: they
	// must be in the store before the wait for the backup's first part.
	head, err := c.Get(context.Background(), "/fill/0000")
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t, env.StoreURL)
	harness.WaitFor(t, time.Minute, "capture to put the fill in the store", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return harness.CapturedTo(ctx, s) >= head.Header.Revision
	})

	id := strings.TrimSpace(env.MustCtl("backup-now", "--wait=false"))
	agents[0].WaitLog(`action="take-backup (backup-now `+id, 1, time.Minute)
	multipart := filepath.Join(minio.DataDir, ".minio.sys", "multipart")
	harness.WaitFor(t, time.Minute, "the backup's multipart upload to start", func() bool {
		found := false
		_ = filepath.WalkDir(multipart, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), "part.") {
				found = true
				return filepath.SkipAll
			}
			return nil
		})
		return found
	})
	minio.Stop()

	harness.WaitFor(t, time.Minute, "the failed backup in the metrics", func() bool {
		m := failuresRE.FindStringSubmatch(scrape(t, agents[0].MetricsURL))
		return m != nil && m[1] != "0"
	})
	// The action's error is logged once the failure is recorded in the
	// store and in the command's status, each of which first exhausts the
	// S3 client's retries (up to about 6s each) against the dead store.
	harness.WaitFor(t, time.Minute, "the agent to log why the backup failed", func() bool {
		log := agents[0].Log()
		return strings.Contains(log, "backup (backup-now "+id+")") && strings.Contains(log, "backup store unreachable")
	})
	harness.WaitFor(t, 30*time.Second, "the failed action in the metrics", func() bool {
		return regexp.MustCompile(`(?m)^etcd_manager_actions_total\{action="take-backup",result="error"\} [1-9]`).MatchString(scrape(t, agents[0].MetricsURL))
	})
	// etcd is untouched while the store is down.
	put(t, c, "/during-outage", "ok")
	if got := get(t, c, "/during-outage"); got != "ok" {
		t.Fatalf("etcd during the store outage: %q", got)
	}
	if pid := agents[0].EtcdPID(); pid != etcdPID {
		t.Fatalf("etcd was restarted (pid %d -> %d) because of the store outage", etcdPID, pid)
	}

	minio.Start()
	var line string
	harness.WaitFor(t, 2*time.Minute, "backup-now to complete after the store came back", func() bool {
		line = commandLine(env, id)
		return strings.Contains(line, " done ")
	})
	fields := strings.Fields(line)
	name := fields[len(fields)-1]
	listed := strings.Fields(env.MustCtl("list-backups"))
	if want := append(before, name); strings.Join(listed, " ") != strings.Join(want, " ") {
		t.Fatalf("list-backups %q, want %q: the earlier ones and the completed %s, nothing partial", listed, want, name)
	}
	meta := checkRestorable(t, openStore(t, env.StoreURL), name)
	if meta.Size < 64<<20 {
		t.Errorf("backup of %d bytes, want the 64 MiB written", meta.Size)
	}
	if pid := agents[0].EtcdPID(); pid != etcdPID {
		t.Fatalf("etcd was restarted (pid %d -> %d)", etcdPID, pid)
	}
}

// The agent's temp disk is full: the backup fails with an error that says
// so, etcd keeps serving, and the backup succeeds once there is room.
func TestBackupTempDiskFull(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	// The agent's temp dir is <data-dir>/tmp; make it a 4 MiB file system.
	name := "tmpfull"
	tmp := filepath.Join(env.Root, "data", name, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", tmp).CombinedOutput(); err != nil {
		t.Fatalf("this test needs to mount a small tmpfs (run as root): %v: %s", err, out)
	}
	mounted := true
	unmount := func() {
		if mounted {
			if out, err := exec.Command("umount", "-l", tmp).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v: %s", tmp, err, out)
			}
			mounted = false
		}
	}
	t.Cleanup(unmount)

	agent := env.StartAgent(name, harness.AgentOptions{ExtraArgs: []string{"--backup-retry-delay=2s"}})
	agents := []*harness.Agent{agent}
	harness.WaitSettled(t, agents, 1, settleTimeout)
	c := clusterClient(t, agents)
	fill(t, c, 8)
	before := env.MustCtl("list-backups") // the first periodic backup, taken while the DB was tiny

	id := strings.TrimSpace(env.MustCtl("backup-now", "--wait=false"))
	var line string
	harness.WaitFor(t, time.Minute, "the backup to fail for lack of room", func() bool {
		line = commandLine(env, id)
		return strings.Contains(line, "temp disk full")
	})
	t.Logf("list-commands: %s", line)
	for _, want := range []string{"running", "attempt", tmp, "no space left on device"} {
		if !strings.Contains(line, want) {
			t.Errorf("list-commands line %q lacks %q", line, want)
		}
	}
	put(t, c, "/disk-full", "still serving")
	if get(t, c, "/disk-full") != "still serving" {
		t.Fatal("etcd stopped serving")
	}
	if out := env.MustCtl("list-backups"); out != before {
		t.Fatalf("a failed backup is listed: %q, before %q", out, before)
	}

	unmount()
	harness.WaitFor(t, time.Minute, "the backup to succeed once there is room", func() bool {
		return strings.Contains(commandLine(env, id), " done ")
	})
	if n, was := len(strings.Fields(env.MustCtl("list-backups"))), len(strings.Fields(before)); n != was+1 {
		t.Fatalf("%d backups listed, want %d", n, was+1)
	}
}

// filledBareEtcd starts a bare 1-member etcd, once it serves, with a few
// MiB of keys.
func filledBareEtcd(t *testing.T, env *harness.Env) []*harness.BareEtcd {
	t.Helper()
	ms := env.StartBareCluster(1)
	c, err := clientv3.New(clientv3.Config{Endpoints: harness.BareEndpoints(ms), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	harness.WaitFor(t, 30*time.Second, "etcd serving", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Put(ctx, "/ready", "yes")
		return err == nil
	})
	fill(t, c, 4)
	return ms
}

// Two leaders racing is prevented by design (one raft leader; the store
// lock for backup agents). Should two writers still meet, say a leader
// that has just lost leadership and its successor, their backups in the
// same second never share a name: each is whole and restorable.
func TestRacingBackupWriters(t *testing.T) {
	env := harness.NewEnv(t)
	ms := filledBareEtcd(t, env)
	s := openStore(t, env.StoreURL)
	now := time.Now()
	const writers = 4
	names := make([]string, writers)
	errs := make([]error, writers)
	done := make(chan int)
	for i := range writers {
		go func() {
			info, err := backup.Take(context.Background(), s, backup.Request{
				Client: clientv3.Config{DialTimeout: 5 * time.Second, Logger: zap.NewNop()}, Endpoint: ms[0].ClientURL,
				TempDir: filepath.Join(env.Root, fmt.Sprintf("tmp%d", i)), Now: now,
			})
			names[i], errs[i] = info.Name, err
			done <- i
		}()
	}
	for range writers {
		<-done
	}
	seen := map[string]bool{}
	for i := range writers {
		if errs[i] != nil {
			t.Fatalf("writer %d: %v", i, errs[i])
		}
		if seen[names[i]] {
			t.Fatalf("two writers wrote backup %s", names[i])
		}
		seen[names[i]] = true
		checkRestorable(t, s, names[i])
	}
	if listed := strings.Fields(env.MustCtl("list-backups")); len(listed) != writers {
		t.Fatalf("list-backups %q, want %d backups", listed, writers)
	}
}

// A backup streams into the store as the snapshot arrives, but commits
// only once its checks pass: a snapshot the checks refuse leaves no
// object, no meta and no claim, and the next backup is whole.
func TestStreamedBackupCommitsOnlyChecked(t *testing.T) {
	env := harness.NewEnv(t)
	ms := filledBareEtcd(t, env)
	s := openStore(t, env.StoreURL)
	req := backup.Request{
		Client: clientv3.Config{DialTimeout: 5 * time.Second, Logger: zap.NewNop()}, Endpoint: ms[0].ClientURL,
		TempDir: filepath.Join(env.Root, "tmp"), Now: time.Now(), Kind: spec.BackupOnDemand,
	}
	refused := req
	refused.Status = func(context.Context, string) (snapshot.Status, error) {
		return snapshot.Status{}, fmt.Errorf("%w: refused by the test", backup.ErrCorrupt)
	}
	if _, err := backup.Take(t.Context(), s, refused); !errors.Is(err, backup.ErrCorrupt) {
		t.Fatalf("a refused snapshot: %v", err)
	}
	if keys, err := s.List(t.Context(), "", ""); err != nil || len(keys) != 0 {
		t.Fatalf("after a refused backup the store holds %q (%v), want nothing", keys, err)
	}
	// The progress hook is told of every byte of the snapshot.
	var streamed atomic.Int64
	req.Progress = func(n int64) { streamed.Add(n) }
	info, err := backup.Take(t.Context(), s, req)
	if err != nil {
		t.Fatal(err)
	}
	if streamed.Load() != info.Meta.Size {
		t.Errorf("the progress hook was told of %d bytes of a %d-byte snapshot", streamed.Load(), info.Meta.Size)
	}
	if info.Meta.Kind != spec.BackupOnDemand || info.Meta.HashKV == nil || info.Meta.Revision == 0 || info.Meta.Size == 0 ||
		info.Meta.CompressedSize == 0 || info.Meta.SHA256 == "" || info.Meta.Seconds <= 0 {
		t.Errorf("the meta of a streamed backup: %+v", info.Meta)
	}
	checkRestorable(t, s, info.Name)
	if _, err := s.Read(t.Context(), info.Name+"/"+backup.ClaimObject); err == nil {
		t.Error("the claim outlived its backup")
	}
}
