package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// status with no agent answering shows what the store says, and fails.
func TestStatusWithNoAgent(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=3", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	s, err := store.Open(ctx, e.store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	name := "2026-12-04T01:00:00Z-000001"
	if err := s.Write(ctx, name+"/"+backup.MetaObject, []byte(`{"etcdVersion":"3.6.16","clusterToken":"tok","timestamp":"1796346000"}`)); err != nil {
		t.Fatal(err)
	}
	id, err := s.AddCommand(ctx, spec.Command{BackupNow: &spec.BackupNowCommand{}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.run(t, "revoke-node", "gone", "--force"); err != nil {
		t.Fatal(err)
	}
	out, _, err := e.run(t, "--insecure", "--discovery=static:127.0.0.1:1", "status")
	if err == nil || exitCode(err) != exitFailed || !strings.Contains(err.Error(), "no agent answered") {
		t.Errorf("status with no agent: %v (exit %d), want it to fail saying so", err, exitCode(err))
	}
	for _, want := range []string{"no agent answered; the store says", "memberCount=3", "newest backup: " + name, "newest restorable point: 2026-12-04T01:00:00Z", id + "  backup-now",
		"revoked nodes (their certificates are refused): gone"} {
		if !strings.Contains(out, want) {
			t.Errorf("status printed no %q:\n%s", want, out)
		}
	}
	out, _, _ = e.run(t, "--insecure", "--discovery=static:127.0.0.1:1", "-o", "json", "status")
	if !strings.Contains(out, `"storeOnly": true`) || !strings.Contains(out, `"newestBackup": "`+name+`"`) || !strings.Contains(out, `"revoked": [`) {
		t.Errorf("status -o json printed %s", out)
	}
}

// status shows an agent's download in progress, with its rate.
func TestStatusShowsTransfers(t *testing.T) {
	now := time.Now()
	tr := spec.Transfer{What: "fetch 2026-12-04T01:00:00Z-000001", Done: 12 << 20, Total: 24 << 20, Started: spec.Int64(now.Add(-4 * time.Second).UnixNano())}
	if got, want := describeTransfer(tr, now), "fetch 2026-12-04T01:00:00Z-000001: 12.0 MiB of 24.0 MiB (50%), 3.0 MiB/s"; got != want {
		t.Errorf("describeTransfer = %q, want %q", got, want)
	}
	var b bytes.Buffer
	st := cli.ClusterStatus{Agents: []cli.AgentStatus{{ID: "a", Role: cli.RoleStandby, Transfer: &tr}, {ID: "b", Role: cli.RoleStandby}}}
	if err := printStatus(&b, st); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "agent a: fetch 2026-12-04T01:00:00Z-000001: 12.0 MiB of 24.0 MiB (50%)") || strings.Contains(b.String(), "agent b: ") {
		t.Errorf("status printed:\n%s", b.String())
	}
}
