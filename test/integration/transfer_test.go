package integration

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// During a restore each node's peer API Info shows its download of the
// backup as it goes, bytes done of the object's size, and none once the
// restore is done: what the ctl and status show per node.
func TestRestoreDownloadsShowInInfo(t *testing.T) {
	env := harness.NewEnv(t)
	env.Insecure = true
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c := clusterClient(t, agents)
	// 96 MiB of values that do not compress: a download that takes a while.
	value := make([]byte, 1<<20)
	for i := range 96 {
		if _, err := rand.Read(value); err != nil {
			t.Fatal(err)
		}
		put(t, c, fmt.Sprintf("/big/%03d", i), string(value))
	}
	name := strings.TrimSpace(env.MustCtl("backup-now", "--timeout=3m"))
	for _, a := range agents {
		a.Stop()
	}
	for _, a := range agents {
		if err := os.RemoveAll(a.DataDir); err != nil {
			t.Fatal(err)
		}
		a.Start()
	}
	harness.WaitFor(t, time.Minute, "the leader to refuse an empty cluster", func() bool {
		return strings.Contains(allLogs(agents), "must issue restore-backup command to proceed")
	})

	// Ask every agent's Info every 20 ms while the restore runs.
	ctx, cancel := context.WithCancel(t.Context())
	var mu sync.Mutex
	seen := map[string]int64{} // node: the most bytes it showed
	var bad []string
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Go(func() {
			pc, err := peer.Dial(a.PeerAPI, "test", insecure.NewCredentials())
			if err != nil {
				return
			}
			defer pc.Close()
			for i := 0; i < 30000 && ctx.Err() == nil; i++ { // bounded: 10 min at most
				ictx, icancel := context.WithTimeout(ctx, time.Second)
				info, err := pc.Info(ictx)
				icancel()
				if err == nil && info.Transfer != nil {
					tr := info.Transfer
					mu.Lock()
					if tr.What != "fetch "+name || tr.Done < 0 || (tr.Total > 0 && tr.Done > tr.Total) || tr.Started == 0 {
						bad = append(bad, fmt.Sprintf("%s: %+v", info.NodeID, *tr))
					}
					seen[info.NodeID] = max(seen[info.NodeID], tr.Done)
					mu.Unlock()
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	out, errOut, err := env.Ctl("restore-backup", name, "--timeout=5m")
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatalf("restore-backup: %v\n%s\n%s", err, out, errOut)
	}
	if len(bad) > 0 {
		t.Errorf("Info showed transfers that are not the backup's download: %v", bad)
	}
	if len(seen) == 0 {
		t.Fatalf("no agent's Info showed its download of the %s backup", name)
	}
	t.Logf("downloads seen (node: most bytes shown): %v; the ctl showed:\n%s", seen, errOut)
	// Done: no agent shows a download any more.
	for _, a := range agents {
		pc, err := peer.Dial(a.PeerAPI, "test", insecure.NewCredentials())
		if err != nil {
			t.Fatal(err)
		}
		ictx, icancel := context.WithTimeout(t.Context(), 5*time.Second)
		info, err := pc.Info(ictx)
		icancel()
		pc.Close()
		if err != nil || info.Transfer != nil {
			t.Errorf("%s after the restore: transfer %+v, %v", a.Name, info.Transfer, err)
		}
	}
}
