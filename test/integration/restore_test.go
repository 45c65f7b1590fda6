package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// restoreTimeout bounds a whole restore of a small backup.
const restoreTimeout = 3 * time.Minute

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
}

// assertOneCluster checks that every running etcd belongs to the same
// cluster.
func assertOneCluster(t *testing.T, agents []*harness.Agent) {
	t.Helper()
	ids := map[uint64][]string{}
	for _, a := range agents {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL, a.QuarURL}, DialTimeout: 2 * time.Second})
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
