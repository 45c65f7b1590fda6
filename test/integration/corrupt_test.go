package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// memberDB is the bbolt file of an agent's etcd.
func memberDB(t *testing.T, a *harness.Agent) string {
	t.Helper()
	dbs, err := filepath.Glob(filepath.Join(a.DataDir, "data", "*", "member", "snap", "db"))
	if err != nil || len(dbs) != 1 {
		t.Fatalf("%s: etcd's database: %v %v", a.Name, dbs, err)
	}
	return dbs[0]
}

// TestCorruptMemberRebuilt: bytes flipped inside a stored value of one
// member's database, while it is stopped, are caught by etcd's initial
// corruption check when it starts; its agent sets the data aside, and
// the leader rebuilds the member from its peers: the cluster is whole
// again, every member's HashKV agrees, and the value reads back intact
// from the rebuilt member.
func TestCorruptMemberRebuilt(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	marker := "corruption-marker-" + strings.Repeat("m", 64)
	for i := range 50 {
		if _, err := c.Put(ctx, fmt.Sprintf("/corrupt/%d", i), fmt.Sprintf("%s-%d", marker, i)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // etcd commits its backend every 100ms

	victim := agents[2]
	victim.Stop()
	db := memberDB(t, victim)
	data, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	n := bytes.Count(data, []byte(marker))
	if n == 0 {
		t.Fatalf("the marker is not in %s", db)
	}
	data = bytes.ReplaceAll(data, []byte(marker), []byte(strings.Replace(marker, "marker", "MARKER", 1)))
	if err := os.WriteFile(db, data, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("flipped %d stored values in %s", n, db)
	victim.Start()

	victim.WaitLog("etcd found its data differs from its peers'", 1, 2*time.Minute)
	harness.WaitFor(t, 4*time.Minute, "the member to be rebuilt from its peers", func() bool {
		st := harness.Observe(agents)
		return st.Healthy == 3 && len(st.Voters) == 3 && len(st.ClusterIDs) == 1
	})
	trash, _ := filepath.Glob(filepath.Join(victim.DataDir, "trash", "*"))
	if len(trash) == 0 {
		t.Error("the corrupt data is not in the trash")
	}
	rev := headRevision(t, ctx, c)
	var hashes []uint32
	for _, a := range agents {
		harness.WaitFor(t, time.Minute, a.Name+"'s HashKV", func() bool {
			hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			h, err := c.HashKV(hctx, a.ClientURL, rev)
			if err != nil {
				return false
			}
			hashes = append(hashes, h.Hash)
			return true
		})
	}
	if hashes[0] != hashes[1] || hashes[1] != hashes[2] {
		t.Fatalf("HashKV at revision %d: %v", rev, hashes)
	}
	vc, err := clientv3.New(clientv3.Config{Endpoints: []string{victim.ClientURL}, TLS: victim.TLS(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	resp, err := vc.Get(ctx, "/corrupt/7", clientv3.WithSerializable())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != marker+"-7" {
		t.Fatalf("the rebuilt member reads %v, %v", resp, err)
	}
}
