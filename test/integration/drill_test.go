package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// The leader restores the newest backup into a scratch etcd on loopback
// and checks its revision and HashKV against the meta, which the backup
// recorded from the member. A backup whose data no longer matches its meta
// fails the drill; the store's record, every agent's metrics, the event
// history and status say so. The cluster itself is never touched, and no
// scratch etcd or folder is left behind.
func TestRestoreDrill(t *testing.T) {
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{Metrics: true, ExtraArgs: []string{"--restore-drill-interval=4s"}})
	ctx := t.Context()
	c := clusterClient(t, agents)
	for i := range 200 {
		if _, err := c.Put(ctx, fmt.Sprintf("/drill/%03d", i), strings.Repeat("v", 100)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Delete(ctx, "/drill/000"); err != nil {
		t.Fatal(err)
	}
	etcdPIDs := map[string]int{}
	for _, a := range agents {
		etcdPIDs[a.Name] = a.EtcdPID()
	}
	name := strings.TrimSpace(env.MustCtl("backup-now"))
	s := openStore(t, env.StoreURL)
	meta, err := backup.ReadMeta(ctx, s, name)
	if err != nil {
		t.Fatal(err)
	}
	if meta.HashKV == nil || meta.Kind != spec.BackupOnDemand || meta.Seconds <= 0 || meta.Revision < 201 {
		t.Fatalf("the backup's meta records no HashKV, kind or duration: %+v", meta)
	}
	// The HashKV was read beside the status check, at the revision a
	// child read from the copy (the drill below checks it against the
	// restored data).
	taken := regexp.MustCompile(`msg="backup taken" name=` + regexp.QuoteMeta(name) + ` .*hashkv-beside-check=(\w+)`)
	beside := ""
	for _, a := range agents {
		if m := taken.FindStringSubmatch(a.Log()); m != nil {
			beside = m[1]
		}
	}
	if beside != "true" {
		t.Errorf("backup %s: hashkv-beside-check=%q in the agents' logs, want true", name, beside)
	}

	var rec *spec.DrillRecord
	harness.WaitFor(t, 90*time.Second, "a restore drill of the new backup to pass", func() bool {
		rec, err = s.ReadDrills(ctx)
		return err == nil && rec != nil && rec.Last.Backup == name && rec.Last.Outcome == spec.EventOK
	})
	if l := rec.Last; l.HashKV == nil || *l.HashKV != meta.HashKV.Hash || l.Revision < meta.Revision || l.Seconds <= 0 {
		t.Errorf("the drill did not compare the HashKV and revision: %+v (meta %+v)", l, meta.HashKV)
	}

	// The backup's data no longer matches its meta: here, its meta says
	// another hash, as it would if the object had been swapped.
	bad := meta
	bad.HashKV = &backup.HashKV{Hash: meta.HashKV.Hash + 1, CompactRevision: meta.HashKV.CompactRevision}
	data, err := json.Marshal(bad)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, name+"/"+backup.MetaObject, data); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 90*time.Second, "a restore drill of the altered backup to fail", func() bool {
		rec, err = s.ReadDrills(ctx)
		return err == nil && rec != nil && rec.Last.Backup == name && rec.Last.Outcome == spec.EventFailed
	})
	if !strings.Contains(rec.Last.Message, "HashKV") || rec.LastPassed == nil {
		t.Errorf("the failed drill's record: %+v, last passed %+v", rec.Last, rec.LastPassed)
	}

	// Every agent reads the outcome from the store.
	successRE := regexp.MustCompile(`(?m)^etcd_manager_restore_drill_last_success_timestamp_seconds (\S+)$`)
	failureRE := regexp.MustCompile(`(?m)^etcd_manager_restore_drill_last_failure_timestamp_seconds (\S+)$`)
	harness.WaitFor(t, 60*time.Second, "every agent to report the failed drill after a passed one", func() bool {
		for _, a := range agents {
			m := scrape(t, a.MetricsURL)
			ok, failed := successRE.FindStringSubmatch(m), failureRE.FindStringSubmatch(m)
			if ok == nil || failed == nil {
				return false
			}
			okAt, _ := strconv.ParseFloat(ok[1], 64)
			failedAt, _ := strconv.ParseFloat(failed[1], 64)
			if okAt == 0 || failedAt <= okAt {
				return false
			}
		}
		return true
	})
	out := env.MustCtl("events", "--since=1h")
	if !regexp.MustCompile(`restore-drill ` + regexp.QuoteMeta(name) + `\s.*failed`).MatchString(out) {
		t.Errorf("the event history lacks the failed drill:\n%s", out)
	}
	if out := env.MustCtl("status"); !strings.Contains(out, "last restore drill: FAILED") {
		t.Errorf("status does not show the failed drill:\n%s", out)
	}

	// The cluster was not touched: the same etcd processes, the keys
	// written, and no scratch etcd nor folder once the agents stop.
	for _, a := range agents {
		if pid := a.EtcdPID(); pid != etcdPIDs[a.Name] {
			t.Errorf("agent %s's etcd changed from pid %d to %d", a.Name, etcdPIDs[a.Name], pid)
		}
	}
	if resp, err := c.Get(ctx, "/drill/", clientv3.WithPrefix()); err != nil || resp.Count != 199 {
		t.Errorf("the keys after the drills: %v, %v", resp, err)
	}
	for _, a := range agents {
		a.Stop()
	}
	for _, a := range agents {
		left, _ := filepath.Glob(filepath.Join(a.DataDir, "tmp", "drill-*"))
		if len(left) > 0 {
			t.Errorf("agent %s left %v", a.Name, left)
		}
	}
	if pids := scratchEtcds(t); len(pids) > 0 {
		t.Errorf("scratch etcds still run: %v", pids)
	}
}

// scratchEtcds lists the processes running a restore drill's etcd.
func scratchEtcds(t *testing.T) []int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), "--name=restore-drill") {
			pids = append(pids, pid)
		}
	}
	return pids
}
