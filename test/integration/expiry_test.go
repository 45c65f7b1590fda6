package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// A restore queued while no agent could take it up, whose expiry passed
// before one did, is failed as expired, not started: etcd keeps its
// cluster ID and every write made after the backup. A restore queued
// with the default expiry behind it is then taken up as usual.
func TestExpiredRestoreIsNotStarted(t *testing.T) {
	env, agents, _ := startCluster(t, 1, 1, harness.AgentOptions{})
	c := clusterClient(t, agents)
	put(t, c, "/expiry/in-backup", "v")
	name := strings.TrimSpace(env.MustCtl("backup-now"))
	put(t, c, "/expiry/after-backup", "kept: the stale restore never ran")
	id := clusterID(t, c)

	for _, a := range agents {
		a.Stop()
	}
	s, err := store.Open(t.Context(), env.StoreURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	queued := time.Now().Add(-2 * time.Hour)
	stale, err := s.AddCommand(t.Context(), spec.Command{
		RestoreBackup: &spec.RestoreBackupCommand{Backup: name},
		Expires:       spec.Int64(queued.Add(time.Hour).UnixNano()),
	}, queued)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		a.Start()
	}
	harness.WaitFor(t, 2*time.Minute, "the stale restore to fail as expired", func() bool {
		out, _, err := env.Ctl("list-commands")
		return err == nil && strings.Contains(out, stale) && strings.Contains(out, "failed") && strings.Contains(out, "expired before it started")
	})
	harness.WaitSettled(t, agents, 1, settleTimeout)
	c = clusterClient(t, agents)
	if got := get(t, c, "/expiry/after-backup"); got == "" {
		t.Fatal("/expiry/after-backup is gone: the expired restore ran")
	}
	if got := clusterID(t, c); got != id {
		t.Fatalf("cluster ID %x, was %x: the cluster was replaced", got, id)
	}

	// A failed command does not stand in the way of the next restore.
	out, errOut, err := env.Ctl("restore-backup", name, "--timeout=3m")
	if err != nil {
		t.Fatalf("restore-backup after the expired one: %v\n%s\n%s", err, out, errOut)
	}
	harness.WaitSettled(t, agents, 1, settleTimeout)
	c = clusterClient(t, agents)
	if n := count(t, c, "/expiry/after-backup"); n != 0 {
		t.Errorf("/expiry/after-backup is still there after the restore")
	}
	if got := get(t, c, "/expiry/in-backup"); got != "v" {
		t.Errorf("/expiry/in-backup = %q after the restore", got)
	}
}
