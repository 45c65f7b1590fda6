package chaos

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// rpo is what a total loss may cost with continuous capture: writes
// acknowledged longer ago than this are in the store. The goal is 1s at
// the 99th percentile, which make bench measures (rpo-p99); every write,
// on a 2-core machine running the rest of the suite, gets twice that.
const rpo = 2 * time.Second

// TestRestoreLatestIsAPrefix: under the chaos workload (puts, reads and
// compare-and-swaps on contended keys, log puts) and a writer of leased
// keys (some expiring) and deletes, every node is killed and wiped at
// once. restore-backup --latest must bring back every write acknowledged
// more than the RPO before the loss, and porcupine must accept the
// restored values as the state after a prefix of the history: writes in
// the last RPO may be lost, never reordered or half-applied.
func TestRestoreLatestIsAPrefix(t *testing.T) {
	env := harness.NewEnv(t)
	env.MustCtl(fmt.Sprintf("--member-count=%d", members), "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(members, harness.AgentOptions{})
	harness.WaitSettled(t, agents, members, recoveryBound)
	const initial = "init-pitr"
	if err := resetKeys(agents, initial); err != nil {
		t.Fatal(err)
	}
	env.MustCtl("backup-now")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := store.Open(ctx, env.StoreURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := client(agents)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A write after the backup: capture has it in the store once it runs.
	head, err := c.Put(ctx, "/chaos/started", "x")
	if err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, time.Minute, "capture to run", func() bool { return harness.CapturedTo(ctx, s) >= head.Header.Revision })

	w, err := newWorkload(harness.Endpoints(agents), env.ClientTLS(), clientCount, workerCount, rate, 42)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	w.run(1, rate*30)
	side := startSideWriter(c)
	time.Sleep(6 * time.Second)

	// The loss: every node at once, spool included.
	loss, lossAt := w.now(), time.Now()
	for _, a := range agents {
		a.Kill()
	}
	last, lastAt := harness.CapturedAt(ctx, s)
	t.Logf("the store held revisions up to %d, observed %s before the loss", last, lossAt.Sub(lastAt).Round(time.Millisecond))
	w.halt()
	side.halt()
	intact := w.ackedBefore(loss - int64(rpo))
	history, _, ops, failed := w.take()
	for _, a := range agents {
		if err := os.RemoveAll(a.DataDir); err != nil {
			t.Fatal(err)
		}
		a.Start()
	}
	harness.WaitFor(t, time.Minute, "the leader to refuse an empty cluster", func() bool {
		for _, a := range agents {
			if strings.Contains(a.Log(), "must issue restore-backup command to proceed") {
				return true
			}
		}
		return false
	})
	out, errOut, err := env.Ctl("restore-backup", "--latest", "--timeout=3m")
	if err != nil {
		t.Fatalf("restore-backup --latest: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	harness.WaitSettled(t, agents, members, recoveryBound)
	t.Logf("%d ops (%d failed) and %d side writes before the loss; %d log writes acknowledged over %s before it", ops, failed, side.n, len(intact), rpo)

	// Every write acknowledged more than the RPO before the loss is back.
	lost, err := lostWrites(agents, intact)
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d writes acknowledged over %s before the loss are not restored, such as %s (the store's newest point was observed %s before the loss)",
			len(lost), len(intact), rpo, lost[0], lossAt.Sub(lastAt).Round(time.Millisecond))
	}

	// The restored values end a prefix of the history: what returned
	// within the RPO of the loss may or may not be in it, so a write
	// there counts as unknown (it may take effect at any time after its
	// call, or never: after the final reads), and a read there, which may
	// have seen a lost write, is dropped.
	cut := loss - int64(rpo)
	var checked []porcupine.Operation
	for _, op := range history {
		if op.Return >= cut {
			if op.Input.(kvInput).Op == opGet {
				continue
			}
			op.Output, op.Return = kvOutput{Unknown: true}, math.MaxInt64
		}
		checked = append(checked, op)
	}
	rc, err := client(agents)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	end := w.now()
	for i := range contendedKeys {
		resp, err := rc.Get(ctx, contendedKey(i))
		if err != nil {
			t.Fatal(err)
		}
		var v string
		if len(resp.Kvs) > 0 {
			v = string(resp.Kvs[0].Value)
		}
		checked = append(checked, porcupine.Operation{ClientId: 10000 + i, Input: kvInput{Op: opGet, Key: contendedKey(i)},
			Call: end + int64(i), Output: kvOutput{Value: v}, Return: end + int64(i) + 1})
	}
	if res := porcupine.CheckOperationsTimeout(kvModel(initial), checked, checkTimeout); res != porcupine.Ok {
		t.Errorf("porcupine: the restored state does not end a prefix of the history (%v, %d operations)", res, len(checked))
	}

	// Every restored key under a long lease has its lease, alive (a
	// 2-second one may expire after the restore, as it should).
	resp, err := rc.Get(ctx, sidePrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	leased := 0
	for _, kv := range resp.Kvs {
		if kv.Lease == 0 || string(kv.Value) != "leased 600s" {
			continue
		}
		leased++
		ttl, err := rc.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil || ttl.TTL <= 0 {
			t.Errorf("restored key %s: its lease %x is not alive (%v)", kv.Key, kv.Lease, err)
		}
	}
	t.Logf("porcupine checked %d operations; %d leased keys restored with their leases", len(checked), leased)
}

const sidePrefix = "/chaos/side/"

// sideWriter puts keys under leases (a few short enough to expire) and
// deletes keys, beside the workload.
type sideWriter struct {
	stop chan struct{}
	done chan struct{}
	n    int
}

func startSideWriter(c *clientv3.Client) *sideWriter {
	sw := &sideWriter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(sw.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < 2000; i++ {
			select {
			case <-sw.stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			k := fmt.Sprintf("%s%d", sidePrefix, i%50)
			var err error
			switch i % 4 {
			case 0, 1:
				ttl := int64(600)
				if i%8 == 0 {
					ttl = 2 // expires during the run
				}
				var l *clientv3.LeaseGrantResponse
				if l, err = c.Grant(ctx, ttl); err == nil {
					_, err = c.Put(ctx, k, fmt.Sprintf("leased %ds", ttl), clientv3.WithLease(l.ID))
				}
			case 2:
				_, err = c.Delete(ctx, k)
			case 3:
				_, err = c.Put(ctx, k, "plain")
			}
			cancel()
			if err == nil {
				sw.n++
			}
		}
	}()
	return sw
}

func (sw *sideWriter) halt() {
	close(sw.stop)
	<-sw.done
}
