package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// The walkthrough's disaster recovery: write a key, back up, stop every
// agent, wipe every data dir, start them again: the leader refuses to
// create an empty cluster. restore-backup brings the key back, on the
// spec's member count.
func TestDisasterRecovery(t *testing.T) {
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{})
	c := clusterClient(t, agents)
	put(t, c, "/dr/before-backup", "kept")
	name := strings.TrimSpace(env.MustCtl("backup-now"))
	put(t, c, "/dr/after-backup", "lost")

	for _, a := range agents {
		a.Stop()
	}
	for _, a := range agents {
		if err := os.RemoveAll(a.DataDir); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range agents {
		a.Start()
	}
	harness.WaitFor(t, time.Minute, "the leader to refuse an empty cluster", func() bool {
		return strings.Contains(allLogs(agents), "etcd has 0 members registered; must issue restore-backup command to proceed")
	})

	out, errOut, err := env.Ctl("restore-backup", name, "--timeout=3m")
	if err != nil {
		t.Fatalf("restore-backup: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	if !strings.Contains(out, "restored backup "+name) {
		t.Errorf("restore-backup printed %q", out)
	}
	if !strings.Contains(errOut, "queued restore of "+name) || !strings.Contains(errOut, "restore 20") {
		t.Errorf("restore-backup showed no progress:\n%s", errOut)
	}
	cs := harness.WaitSettled(t, agents, 3, settleTimeout)
	t.Logf("restored: %+v", cs)
	c2 := clusterClient(t, agents)
	if got := get(t, c2, "/dr/before-backup"); got != "kept" {
		t.Fatalf("/dr/before-backup = %q after the restore", got)
	}
	if n := count(t, c2, "/dr/after-backup"); n != 0 {
		t.Fatalf("/dr/after-backup exists after the restore: it was written after the backup")
	}
	put(t, c2, "/dr/after-restore", "writable")
	if cmds := env.MustCtl("list-commands"); strings.Contains(cmds, "restore-backup") {
		t.Errorf("the restore command is left after the restore:\n%s", cmds)
	}
	backups := strings.Fields(env.MustCtl("list-backups"))
	if len(backups) < 2 || backups[len(backups)-1] <= name {
		t.Errorf("no fresh backup after the restore: %q", backups)
	}
	// Members restarting after the quarantine is lifted are a wait, not
	// a failure of the fresh backup.
	for _, line := range strings.Split(allLogs(agents), "\n") {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, `action="backup-restored `) {
			t.Errorf("the fresh backup logged an error in a normal restore: %s", line)
		}
	}
}

// A restore over a live cluster replaces it: the data written after the
// backup is gone, the old data sits in each node's trash, and there is one
// cluster of the spec's size.
func TestRestoreOverLiveCluster(t *testing.T) {
	env, agents, before := startCluster(t, 3, 4, harness.AgentOptions{})
	c := clusterClient(t, agents)
	put(t, c, "/live/old", "v1")
	name := strings.TrimSpace(env.MustCtl("backup-now"))
	put(t, c, "/live/old", "v2")

	if out, errOut, err := env.Ctl("restore-backup", name, "--timeout=3m"); err != nil {
		t.Fatalf("restore-backup: %v\n%s\n%s", err, out, errOut)
	}
	cs := harness.WaitSettled(t, agents, 3, settleTimeout)
	for id := range cs.ClusterIDs {
		if _, old := before.ClusterIDs[id]; old {
			t.Errorf("the old cluster %x still runs after the restore: %v", id, cs.ClusterIDs)
		}
	}
	c2 := clusterClient(t, agents)
	if got := get(t, c2, "/live/old"); got != "v1" {
		t.Fatalf("/live/old = %q, want the backup's v1", got)
	}
	trashed := 0
	for _, a := range agents {
		if entries, err := os.ReadDir(a.DataDir + "/trash"); err == nil {
			trashed += len(entries)
		}
	}
	if trashed < 3 {
		t.Errorf("%d data dirs in the trash, want the 3 old members'", trashed)
	}
	assertOneCluster(t, agents)
	assertRestoredWithoutInitialCheck(t, agents)
}

// assertRestoredWithoutInitialCheck checks, from the agents' logs, that
// each restored member first started without etcd's initial corruption
// check and without probing its peers for it: all start at once from one
// snapshot, and a member that finds an earlier one's peer port open waits
// in the check for a HashKV that cannot come before there is a quorum.
// Without the restore's own decision, every start either probes and finds
// no peer (and says so) or runs the check.
func assertRestoredWithoutInitialCheck(t *testing.T, agents []*harness.Agent) {
	t.Helper()
	members := 0
	for _, a := range agents {
		lines := strings.Split(a.Log(), "\n")
		from := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, `msg="restored backup; starting etcd in quarantine"`) })
		if from < 0 {
			continue // not a member of the restored cluster
		}
		members++
		to := from + slices.IndexFunc(lines[from:], func(l string) bool { return strings.Contains(l, `msg="etcd started"`) })
		if to < from {
			t.Errorf("agent %s: the restored member's start is not logged", a.Name)
			continue
		}
		for _, l := range lines[from:to] {
			if strings.Contains(l, "no peer's etcd serves") {
				t.Errorf("agent %s: the restored member's start probed its peers for etcd's initial corruption check: %s", a.Name, l)
			}
		}
		run := slices.IndexFunc(lines[to:], func(l string) bool { return strings.Contains(l, `"Running: "`) })
		if run < 0 {
			t.Errorf("agent %s: etcd logged no command line after the restored start", a.Name)
			continue
		}
		if l := strings.ToLower(lines[to+run]); strings.Contains(l, "initialcorruptcheck=true") || strings.Contains(l, "initial-corrupt-check=true") {
			t.Errorf("agent %s: the restored member started with etcd's initial corruption check: %s", a.Name, lines[to+run])
		}
	}
	if members != 3 {
		t.Errorf("%d agents restored a member, want 3", members)
	}
}

// assertOneCluster checks that every running etcd belongs to the same
// cluster.
func assertOneCluster(t *testing.T, agents []*harness.Agent) {
	t.Helper()
	ids := map[uint64][]string{}
	for _, a := range agents {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL, a.QuarURL}, TLS: a.TLS(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			continue
		}
		for _, ep := range []string{a.ClientURL, a.QuarURL} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := cli.Status(ctx, ep)
			cancel()
			if err == nil {
				ids[st.Header.ClusterId] = append(ids[st.Header.ClusterId], a.Name)
			}
		}
		cli.Close()
	}
	if len(ids) > 1 {
		t.Fatalf("more than one etcd cluster is running: %v", fmt.Sprint(ids))
	}
}

// count returns how many keys have the prefix.
func count(t *testing.T, c *clientv3.Client, prefix string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// A restore that cannot be done is refused with an error naming the
// object, the command is kept as failed with the reason, and the cluster
// stays exactly as it was.
func TestRestoreBadInput(t *testing.T) {
	const maxSnapshot = 64 << 20
	env, agents, before := startCluster(t, 3, 3, harness.AgentOptions{ExtraArgs: []string{fmt.Sprintf("--max-snapshot-bytes=%d", maxSnapshot)}})
	c := clusterClient(t, agents)
	put(t, c, "/bad/key", "untouched")
	good := strings.TrimSpace(env.MustCtl("backup-now"))
	gz, err := os.ReadFile(filepath.Join(env.StoreDir, good, backup.DataObject))
	if err != nil {
		t.Fatal(err)
	}
	meta, err := os.ReadFile(filepath.Join(env.StoreDir, good, backup.MetaObject))
	if err != nil {
		t.Fatal(err)
	}
	// Each bad backup is a copy of the good one, damaged.
	writeBackup := func(name string, data, meta []byte) {
		dir := filepath.Join(env.StoreDir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if data != nil {
			if err := os.WriteFile(filepath.Join(dir, backup.DataObject), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, backup.MetaObject), meta, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	flipped := bytes.Clone(gz)
	flipped[len(flipped)/2] ^= 0x01
	writeBackup("2020-01-01T00:00:00Z-000001", flipped, meta)
	writeBackup("2020-01-01T00:00:00Z-000002", gz[:len(gz)/2], meta)
	writeBackup("2020-01-01T00:00:00Z-000003", nil, meta)
	// Hostile ones: a small object that unpacks to 256 MiB, with a kops
	// meta (no size) and with ours; metas that would move data outside
	// the data dir, fill the disk, or exhaust memory.
	var bomb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&bomb, gzip.BestCompression)
	zw.Write(make([]byte, 256<<20))
	zw.Close()
	kopsMeta := []byte(`{"etcdVersion":"` + harness.DefaultEtcdVersion + `","timestamp":"1"}`)
	writeBackup("2020-01-01T00:00:00Z-000004", bomb.Bytes(), kopsMeta)
	writeBackup("2020-01-01T00:00:00Z-000005", bomb.Bytes(), meta)
	victim := filepath.Clean(filepath.Join(agents[0].DataDir, "data", "../../../victim"))
	if err := os.MkdirAll(filepath.Join(victim, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(victim) })
	withField := func(field string) []byte {
		var m map[string]any
		if err := json.Unmarshal(meta, &m); err != nil {
			t.Fatal(err)
		}
		k, v, _ := strings.Cut(field, "=")
		var val any
		if err := json.Unmarshal([]byte(v), &val); err != nil {
			t.Fatal(err)
		}
		m[k] = val
		b, _ := json.Marshal(m)
		return b
	}
	writeBackup("2020-01-01T00:00:00Z-000006", gz, withField(`clusterToken="../../../victim"`))
	writeBackup("2020-01-01T00:00:00Z-000007", gz, withField(`size=1125899906842624`))
	writeBackup("2020-01-01T00:00:00Z-000008", gz, withField(`pad="`+strings.Repeat("x", 300<<10)+`"`))

	// What the ctl can tell from the store (a backup missing, or not
	// whole) it refuses itself, queueing nothing; the leader refuses the
	// same restore queued by another tool. The rest only the leader finds.
	tests := []struct {
		name, backup string
		want         []string // from the leader
		wantCtl      []string // from the ctl, when it refuses
	}{
		{"not found", "2020-01-01T00:00:00Z-000009", []string{"2020-01-01T00:00:00Z-000009", "not found"},
			[]string{`no backup "2020-01-01T00:00:00Z-000009" in`, "list-backups"}},
		{"flipped byte", "2020-01-01T00:00:00Z-000001", []string{"2020-01-01T00:00:00Z-000001/etcd.backup.gz"}, nil},
		{"truncated", "2020-01-01T00:00:00Z-000002", []string{"2020-01-01T00:00:00Z-000002/etcd.backup.gz"}, nil},
		{"meta without data", "2020-01-01T00:00:00Z-000003", []string{"2020-01-01T00:00:00Z-000003", "has a meta but no"},
			[]string{"backup 2020-01-01T00:00:00Z-000003 in", "is not whole: it has no etcd.backup.gz"}},
		{"bomb with a kops meta", "2020-01-01T00:00:00Z-000004", []string{"2020-01-01T00:00:00Z-000004/etcd.backup.gz", fmt.Sprintf("unpacked to over %d bytes, the agent's maximum", maxSnapshot)}, nil},
		{"bomb with our meta", "2020-01-01T00:00:00Z-000005", []string{"2020-01-01T00:00:00Z-000005/etcd.backup.gz", "more than the", "bytes its meta records"}, nil},
		{"token out of the data dir", "2020-01-01T00:00:00Z-000006", []string{"2020-01-01T00:00:00Z-000006/_etcd_backup.meta", `cluster token "../../../victim"`},
			[]string{"backup 2020-01-01T00:00:00Z-000006 cannot be restored", `cluster token "../../../victim"`}},
		{"a size over the free space", "2020-01-01T00:00:00Z-000007", []string{"2020-01-01T00:00:00Z-000007/etcd.backup.gz", "unpacks to 1125899906842624 bytes (its meta)"}, nil},
		{"an oversized meta", "2020-01-01T00:00:00Z-000008", []string{"2020-01-01T00:00:00Z-000008/_etcd_backup.meta", "no valid one is over"},
			[]string{"backup 2020-01-01T00:00:00Z-000008 cannot be restored", "no valid one is over"}},
	}
	restoreLine := func(backup string) string {
		cmds := env.MustCtl("list-commands")
		for _, l := range strings.Split(cmds, "\n") {
			if strings.Contains(l, "restore-backup") && strings.Contains(l, backup) {
				return l
			}
		}
		return ""
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, err := env.Ctl("restore-backup", tt.backup, "--timeout=2m")
			if err == nil {
				t.Fatalf("restore-backup %s succeeded: %s", tt.backup, out)
			}
			if tt.wantCtl != nil {
				for _, w := range append(tt.wantCtl, "nothing was queued") {
					if !strings.Contains(errOut, w) {
						t.Errorf("the ctl's error lacks %q:\n%s", w, errOut)
					}
				}
				if line := restoreLine(tt.backup); line != "" {
					t.Fatalf("the ctl refused the restore, yet queued it: %s", line)
				}
				// Queued by another tool, the leader fails it.
				s, err := store.Open(t.Context(), env.StoreURL, store.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if _, err := s.AddCommand(t.Context(), spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: tt.backup}}, time.Now()); err != nil {
					t.Fatal(err)
				}
				harness.WaitFor(t, 2*time.Minute, "the leader to fail the restore of "+tt.backup, func() bool {
					return strings.Contains(restoreLine(tt.backup), "failed")
				})
				for _, w := range append(tt.want, "the cluster was not touched") {
					if line := restoreLine(tt.backup); !strings.Contains(line, w) {
						t.Errorf("list-commands does not show the failed restore of %s with %q:\n%s", tt.backup, w, line)
					}
				}
				return
			}
			for _, w := range append(tt.want, "failed", "the cluster was not touched") {
				if !strings.Contains(errOut, w) {
					t.Errorf("the error lacks %q:\n%s", w, errOut)
				}
			}
			if line := restoreLine(tt.backup); !strings.Contains(line, "failed") || !strings.Contains(line, tt.want[0]) {
				t.Errorf("list-commands does not show the failed restore of %s with its reason:\n%s", tt.backup, line)
			}
		})
	}

	// A junk command is failed too, with the object named.
	junk := filepath.Join(env.StoreDir, "control", "2020-01-01T00:00:00Z-000001")
	if err := os.MkdirAll(junk, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(junk, "_command.json"), []byte(`{"restoreBackup":`), 0o644); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, "the junk command to be marked failed", func() bool {
		out, _, _ := env.Ctl("list-commands")
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "2020-01-01T00:00:00Z-000001 ") {
				return strings.Contains(l, "failed") && strings.Contains(l, "_command.json")
			}
		}
		return false
	})

	// A procedure's choice read from the store names folders on every
	// node: one whose token leaves the data dir fails its command.
	hostile := filepath.Join(env.StoreDir, "control", "2020-01-01T00:00:00Z-000002")
	if err := os.MkdirAll(hostile, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostile, "_command.json"), []byte(`{"restoreBackup":{"backup":"`+good+`"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostile, "_choice.json"), []byte(`{"term":1,"restore":{"token":"../../../victim","members":["x"]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, "the command with a hostile choice to be marked failed", func() bool {
		out, _, _ := env.Ctl("list-commands")
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "2020-01-01T00:00:00Z-000002 ") {
				return strings.Contains(l, "failed") && strings.Contains(l, "_choice.json") && strings.Contains(l, "is not a cluster token")
			}
		}
		return false
	})
	if !etcdproc.HasData(victim) {
		t.Error("the folder a hostile token names was moved")
	}
	for _, a := range agents {
		if entries, _ := os.ReadDir(filepath.Join(a.DataDir, "tmp")); len(entries) != 0 {
			t.Errorf("agent %s left %d entries in its tmp dir", a.Name, len(entries))
		}
	}

	// The cluster is exactly as it was, and no agent restarted.
	after := harness.WaitSettled(t, agents, 3, settleTimeout)
	if len(after.ClusterIDs) != 1 || len(before.ClusterIDs) != 1 || fmt.Sprint(keys(after.ClusterIDs)) != fmt.Sprint(keys(before.ClusterIDs)) {
		t.Fatalf("the cluster changed: before %v, after %v", before.ClusterIDs, after.ClusterIDs)
	}
	if got := get(t, c, "/bad/key"); got != "untouched" {
		t.Fatalf("/bad/key = %q", got)
	}
	for _, a := range agents {
		if !a.Running() {
			t.Errorf("agent %s exited", a.Name)
		}
		if n := strings.Count(a.Log(), "=== harness: starting agent"); n != 1 {
			t.Errorf("agent %s was started %d times", a.Name, n)
		}
	}
	if strings.Contains(allLogs(agents), `msg="restore started`) {
		t.Error("a restore started from a bad backup")
	}
}

// The survivor's agent restarts while quorum is lost. Its etcd then never
// serves a client (etcd serves clients only once it has joined its cluster
// through raft, which needs a leader), yet recover-quorum must still get
// the survivor's evidence and recover. Before the fix, it waited forever
// for the survivor's etcd to report its members.
func TestRecoverQuorumAfterSurvivorRestart(t *testing.T) {
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{})
	c := clusterClient(t, agents)
	put(t, c, "/q/before-loss", "survives")
	survivor, lost := agents[0], agents[1:]
	lostIDs := killAndWipe(t, lost)
	survivor.Stop()
	survivor.Start()
	harness.WaitFor(t, time.Minute, "the survivor's etcd to run", func() bool { return survivor.EtcdPID() > 0 })
	if _, ok := memberStatus(survivor); ok {
		t.Fatal("the restarted survivor's etcd serves clients without quorum: the test does not exercise its case")
	}
	out, errOut, err := env.Ctl("recover-quorum", "--timeout=3m", "--lost="+strings.Join(lostIDs, ","))
	if err != nil {
		t.Fatalf("recover-quorum: %v\n%s\n%s", err, out, errOut)
	}
	sc := clusterClient(t, []*harness.Agent{survivor})
	if got := get(t, sc, "/q/before-loss"); got != "survives" {
		t.Fatalf("/q/before-loss = %q after the recovery, want %q", got, "survives")
	}
	put(t, sc, "/q/after-recovery", "writable")
}

// Two of three members lose their data for good. recover-quorum rebuilds
// the cluster from the survivor, and nothing it had is lost, not even the
// writes made after the last backup; the wiped nodes then rejoin. While
// quorum holds, recover-quorum is refused and changes nothing.
func TestRecoverQuorum(t *testing.T) {
	env, agents, before := startCluster(t, 3, 3, harness.AgentOptions{})
	c := clusterClient(t, agents)
	put(t, c, "/q/before-backup", "v")
	env.MustCtl("backup-now")
	put(t, c, "/q/after-backup", "survives")

	_, errOut, err := env.Ctl("recover-quorum", "--timeout=1m")
	if err == nil || !strings.Contains(errOut, "quorum is not lost") {
		t.Fatalf("recover-quorum on a healthy cluster: %v\n%s", err, errOut)
	}
	if after := harness.Observe(agents); fmt.Sprint(keys(after.ClusterIDs)) != fmt.Sprint(keys(before.ClusterIDs)) {
		t.Fatalf("a refused recover-quorum changed the cluster: %v -> %v", before.ClusterIDs, after.ClusterIDs)
	}

	survivor, lost := agents[0], agents[1:]
	lostIDs := killAndWipe(t, lost)
	// Until its election timeout passes, the survivor still follows the
	// old leader, and recover-quorum would rightly be refused.
	harness.WaitFor(t, 30*time.Second, "the survivor's etcd to see no leader", func() bool {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{survivor.ClientURL}, TLS: survivor.TLS(), DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return false
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := cli.Status(ctx, survivor.ClientURL)
		return err == nil && st.Leader == 0
	})
	// Not reaching the lost members is no evidence that they have no
	// quorum: the command waits, and says how to name them lost.
	_, errOut, err = env.Ctl("recover-quorum", "--timeout=15s")
	if err == nil || !strings.Contains(errOut, "are silent") || !strings.Contains(errOut, "--lost=") {
		t.Fatalf("recover-quorum with silent members and no --lost: %v\n%s", err, errOut)
	}
	if st, ok := memberStatus(survivor); !ok || st.Leader != 0 {
		t.Fatal("the survivor was forced into a new cluster without evidence")
	}
	listed := env.MustCtl("list-commands")
	for _, line := range strings.Split(listed, "\n") {
		if strings.Contains(line, "recover-quorum") {
			env.MustCtl("delete-command", strings.Fields(line)[0])
		}
	}
	out, errOut, err := env.Ctl("recover-quorum", "--timeout=3m", "--lost="+strings.Join(lostIDs, ","))
	if err != nil {
		t.Fatalf("recover-quorum: %v\n%s\n%s", err, out, errOut)
	}
	if !strings.Contains(out, "quorum recovered from") {
		t.Errorf("recover-quorum printed %q", out)
	}
	sc := clusterClient(t, []*harness.Agent{survivor})
	for k, want := range map[string]string{"/q/before-backup": "v", "/q/after-backup": "survives"} {
		if got := get(t, sc, k); got != want {
			t.Fatalf("%s = %q on the survivor, want %q", k, got, want)
		}
	}
	put(t, sc, "/q/after-recovery", "writable")

	for _, a := range lost {
		a.Start()
	}
	cs := harness.WaitSettled(t, agents, 3, settleTimeout)
	t.Logf("after rejoin: %+v", cs)
	c2 := clusterClient(t, agents)
	for _, k := range []string{"/q/before-backup", "/q/after-backup", "/q/after-recovery"} {
		if get(t, c2, k) == "" {
			t.Fatalf("%s is missing after the rejoin", k)
		}
	}
	assertOneCluster(t, agents)
}

// killAndWipe kills the agents (their etcd dies with them) and deletes
// their data dirs, as a lost node; it returns their node IDs.
func killAndWipe(t *testing.T, agents []*harness.Agent) []string {
	t.Helper()
	var ids []string
	for _, a := range agents {
		ids = append(ids, a.NodeID())
		a.Kill()
		if err := os.RemoveAll(a.DataDir); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// A survivor whose data is behind the newest backup of its cluster (it
// was stopped while the others went on) must not seed the cluster:
// recover-quorum fails, naming the backup to restore instead, and the
// survivor's etcd is left as it was.
func TestRecoverQuorumRefusesSurvivorBehindBackup(t *testing.T) {
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{})
	c := clusterClient(t, agents)
	put(t, c, "/behind/early", "v")
	stale, lost := agents[2], agents[:2]
	stale.Stop()
	for i := range 20 {
		put(t, c, fmt.Sprintf("/behind/later-%d", i), "v")
	}
	name := strings.TrimSpace(env.MustCtl("backup-now"))
	lostIDs := killAndWipe(t, lost)
	// Its etcd restarts without quorum, and so never serves: the
	// revision is that of its data when it started.
	stale.Start()
	_, errOut, err := env.Ctl("recover-quorum", "--timeout=3m", "--lost="+strings.Join(lostIDs, ","))
	if err == nil || !strings.Contains(errOut, "behind backup "+name) || !strings.Contains(errOut, "restore-backup "+name) {
		t.Fatalf("recover-quorum from a survivor behind backup %s: %v\n%s", name, err, errOut)
	}
	if st, ok := memberStatus(stale); ok && st.Leader != 0 {
		t.Fatal("the stale survivor was forced into a new cluster")
	}
	if strings.Contains(stale.Log(), "--force-new-cluster") {
		t.Fatal("the stale survivor's etcd was restarted with --force-new-cluster")
	}
}

// The agent driving a restore is killed right after it records each
// phase. The restore resumes, on the restarted agent or another, and ends
// with one cluster of the spec's size holding the backup's data.
func TestRestoreCrashSafety(t *testing.T) {
	// node-data is inside each chosen node's own restore, so every node
	// crashes there; the rest are the driving agent's phases.
	points := []string{"stopping", "restoring", "node-data", "verifying", "backing-up", "lifting"}
	for _, phase := range points {
		t.Run(phase, func(t *testing.T) {
			env := harness.NewEnv(t)
			env.ExtraEnv = append(env.ExtraEnv, testhook.Env+"=restore-"+phase)
			env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
			agents := env.StartAgents(3, harness.AgentOptions{})
			harness.WaitSettled(t, agents, 3, settleTimeout)
			c := clusterClient(t, agents)
			put(t, c, "/crash/key", "from-backup")
			name := strings.TrimSpace(env.MustCtl("backup-now"))
			put(t, c, "/crash/key", "after-backup")

			type result struct {
				out, errOut string
				err         error
			}
			done := make(chan result, 1)
			go func() {
				out, errOut, err := env.Ctl("restore-backup", name, "--timeout=4m")
				done <- result{out, errOut, err}
			}()
			var res result
			crashed := map[string]bool{}
			harness.WaitFor(t, 5*time.Minute, "the restore to finish", func() bool {
				for _, a := range agents {
					if !a.Running() {
						crashed[a.Name] = true
						// Restarted agents carry no crash point: a node
						// redoing its restore must not crash again.
						env.ExtraEnv = nil
						a.Start()
					}
				}
				select {
				case res = <-done:
					return true
				default:
					return false
				}
			})
			if res.err != nil {
				t.Fatalf("restore-backup: %v\n%s\n%s", res.err, res.out, res.errOut)
			}
			want := 1
			if phase == "node-data" {
				want = 3
			}
			if len(crashed) != want {
				t.Fatalf("agents crashed: %v, want %d", crashed, want)
			}
			if n := strings.Count(allLogs(agents), "test hook: crashing here"); n != want {
				t.Fatalf("the crash point was hit %d times, want %d", n, want)
			}
			harness.WaitSettled(t, agents, 3, settleTimeout)
			assertOneCluster(t, agents)
			if got := get(t, clusterClient(t, agents), "/crash/key"); got != "from-backup" {
				t.Fatalf("/crash/key = %q after the restore, want the backup's value", got)
			}
		})
	}
}

// Clients are back as soon as HashKV agrees: the quarantine is lifted
// before the restored cluster's fresh backup, which is taken while clients
// write. Every agent pauses as it starts that backup, so the test sees the
// restored cluster serve writes while the command is still open and no
// fresh backup exists; once resumed, the fresh backup is taken, holds the
// write made meanwhile, and only then is the command removed.
func TestRestoreClientsBackBeforeFreshBackup(t *testing.T) {
	env := harness.NewEnv(t)
	env.ExtraEnv = append(env.ExtraEnv, testhook.PauseEnv+"=procedure-restore-"+spec.RestoreBackingUp)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	put(t, c, "/fresh/in-backup", "v")
	name := strings.TrimSpace(env.MustCtl("backup-now"))
	put(t, c, "/fresh/after-backup", "rolled back by the restore")
	env.MustCtl("restore-backup", name, "--wait=false")

	var paused *harness.Agent
	harness.WaitFor(t, 3*time.Minute, "the driver to pause as it starts the fresh backup", func() bool {
		for _, a := range agents {
			if a.Paused() {
				paused = a
				return true
			}
		}
		return false
	})
	// The restored cluster serves: the write made after the backup is
	// gone, and a new write is acknowledged.
	c2 := clusterClient(t, agents)
	if n := count(t, c2, "/fresh/after-backup"); n != 0 {
		t.Fatal("the cluster serving clients is not the restored one")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	resp, err := c2.Put(ctx, "/fresh/during-backup", "v")
	cancel()
	if err != nil {
		t.Fatalf("a write while the fresh backup is pending: %v", err)
	}
	during := resp.Header.Revision
	var rows []cli.CommandRow
	if err := json.Unmarshal([]byte(env.MustCtl("list-commands", "-o", "json")), &rows); err != nil {
		t.Fatal(err)
	}
	open := false
	for _, r := range rows {
		open = open || (r.Kind == "restore-backup" && r.State == spec.CommandRunning && r.Phase == spec.RestoreBackingUp)
	}
	if !open {
		t.Fatalf("with clients back, the restore command should be open in phase %s: %+v", spec.RestoreBackingUp, rows)
	}
	if fresh := restoredBackups(t, env); len(fresh) != 0 {
		t.Fatalf("a fresh backup %v exists before the driver took it", fresh)
	}

	// Resume every agent that pauses there, until the command is done.
	harness.WaitFor(t, 4*time.Minute, "the restore to finish with its fresh backup", func() bool {
		for _, a := range agents {
			if a.Paused() {
				a.Continue()
			}
		}
		out, _, err := env.Ctl("list-commands")
		return err == nil && !strings.Contains(out, "restore-backup")
	})
	fresh := restoredBackups(t, env)
	if len(fresh) == 0 {
		t.Fatal("the restore finished without a fresh backup of the restored cluster")
	}
	if last := fresh[len(fresh)-1]; last.Revision < during {
		t.Errorf("the fresh backup %s is at revision %d, before the write made at %d while clients were back", last.Name, last.Revision, during)
	}
	if !strings.Contains(allLogs(agents), `msg="restore complete; the command is removed"`) {
		t.Error("no agent logged the restore's completion")
	}
	if !strings.Contains(paused.Log(), "test hook: resumed") {
		t.Error("the paused driver never resumed")
	}
	if got := get(t, c2, "/fresh/during-backup"); got != "v" {
		t.Errorf("/fresh/during-backup = %q after the restore completed", got)
	}
}

// restoredBackups are the store's backups of kind restored, oldest first.
func restoredBackups(t *testing.T, env *harness.Env) []cli.BackupRow {
	t.Helper()
	var rows, out []cli.BackupRow
	if err := json.Unmarshal([]byte(env.MustCtl("list-backups", "-o", "json")), &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Kind == spec.BackupRestored {
			out = append(out, r)
		}
	}
	return out
}
