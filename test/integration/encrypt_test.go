package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/crypt/crypttest"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// Encryption at rest, on a real 3-member cluster: agents started with
// --backup-encryption-key-file write backups and captured segments that
// are age files, not gzip or plaintext, whose meta and headers name the
// key; a restore decrypts on every node. Restarted with another key, the
// agents refuse to restore that backup before anything stops, naming
// both keys, and the cluster keeps serving, untouched.
func TestEncryptionAtRest(t *testing.T) {
	keyDir := t.TempDir()
	keyPath, keyA := crypttest.KeyFile(t, keyDir, "backup.key")
	secretA, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{ExtraArgs: []string{"--backup-encryption-key-file=" + keyPath}})
	c := clusterClient(t, agents)
	put(t, c, "/enc/before-backup", "kept-secret-value")
	name := strings.TrimSpace(env.MustCtl("backup-now"))
	// Writes after the backup, spread over several segments; mid is a
	// moment among them.
	var afterRev int64
	var mid time.Time
	for i := range 6 {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		resp, err := c.Put(ctx, fmt.Sprintf("/enc/after-backup/%d", i), "captured-secret-value")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		afterRev = resp.Header.Revision
		if i == 2 {
			mid = time.Now()
		}
		time.Sleep(300 * time.Millisecond)
	}

	// The backup: an age file, not gzip, with no plaintext; its meta, which
	// stays readable, names the key.
	data, err := os.ReadFile(filepath.Join(env.StoreDir, name, backup.DataObject))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.HasPrefix(data, []byte{0x1f, 0x8b}) || !bytes.HasPrefix(data, []byte("age-encryption.org/v1\n")) {
		t.Fatalf("%s/%s starts %q: want an age file, not gzip", name, backup.DataObject, data[:min(len(data), 24)])
	}
	if bytes.Contains(data, []byte("kept-secret-value")) {
		t.Fatal("the backup holds a value in the clear")
	}
	rawMeta, err := os.ReadFile(filepath.Join(env.StoreDir, name, backup.MetaObject))
	if err != nil {
		t.Fatal(err)
	}
	var meta backup.Meta
	if err := json.Unmarshal(rawMeta, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Encryption == nil || meta.Encryption.Scheme != "age" || meta.Encryption.KeyID != keyA {
		t.Fatalf("meta encryption = %+v, want age with %s", meta.Encryption, keyA)
	}

	// Continuous capture is on by default: its segments are encrypted too.
	s, err := store.Open(t.Context(), env.StoreURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	harness.WaitFor(t, time.Minute, fmt.Sprintf("capture to reach revision %d", afterRev), func() bool {
		return harness.CapturedTo(t.Context(), s) >= afterRev
	})
	timelines, err := changelog.Timelines(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	segments := 0
	for _, tl := range timelines {
		refs, err := changelog.List(t.Context(), s, tl)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range refs {
			h, err := changelog.ReadHeaderAt(t.Context(), s, r.Key)
			if err != nil {
				t.Fatal(err)
			}
			if h.Format != changelog.FormatEncrypted || h.Encryption == nil || h.Encryption.KeyID != keyA {
				t.Errorf("segment %s: format %d, encryption %+v; want format %d with %s", r.Key, h.Format, h.Encryption, changelog.FormatEncrypted, keyA)
			}
			raw, err := s.ReadMax(t.Context(), r.Key, 64<<20)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(raw, []byte("secret-value")) || bytes.Contains(raw, []byte("/enc/")) {
				t.Errorf("segment %s holds a key or value in the clear", r.Key)
			}
			segments++
		}
	}
	if segments == 0 {
		t.Fatal("no captured segment in the store")
	}
	t.Logf("backup %s and %d segments are encrypted with %s", name, segments, keyA)

	// The agents say they encrypt, by key ID, and never log the key.
	logs := allLogs(agents)
	if !strings.Contains(logs, "encrypted at rest") || !strings.Contains(logs, keyA) {
		t.Error("no agent logged that it encrypts, with the key ID")
	}
	for _, l := range strings.Split(string(secretA), "\n") {
		if strings.HasPrefix(l, "AGE-SECRET-KEY-") && strings.Contains(logs, l) {
			t.Fatal("an agent logged the secret key")
		}
	}

	// The ctl reads metas and headers only. --to-time must read times
	// inside the segments: without the key it says which it needs.
	out, errOut, err := env.Ctl("restore-backup", "--to-time="+mid.UTC().Format(time.RFC3339Nano), "--wait=false")
	if err == nil || !strings.Contains(errOut, "encrypted with key "+keyA) || !strings.Contains(errOut, "--backup-decryption-key-file") {
		t.Errorf("restore-backup --to-time without the key: %v\nstdout: %s\nstderr: %s\nwant a refusal naming %s", err, out, errOut, keyA)
	}
	if cmds := env.MustCtl("list-commands"); strings.Contains(cmds, "restore-backup") {
		t.Fatalf("a refused restore was queued:\n%s", cmds)
	}

	// A restore decrypts on every node.
	out, errOut, err = env.Ctl("restore-backup", name, "--timeout=3m")
	if err != nil {
		t.Fatalf("restore-backup: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	harness.WaitSettled(t, agents, 3, settleTimeout)
	c2 := clusterClient(t, agents)
	if got := get(t, c2, "/enc/before-backup"); got != "kept-secret-value" {
		t.Fatalf("/enc/before-backup = %q after the restore", got)
	}
	if n := count(t, c2, "/enc/after-backup"); n != 0 {
		t.Fatal("/enc/after-backup exists after the restore: it was written after the backup")
	}

	// Restarted with another key, the agents cannot read that backup.
	for _, a := range agents {
		a.Stop()
	}
	_, keyB := crypttest.KeyFile(t, keyDir, "backup.key")
	for _, a := range agents {
		a.Start()
	}
	before := harness.WaitSettled(t, agents, 3, settleTimeout)
	c3 := clusterClient(t, agents)
	put(t, c3, "/enc/untouched", "yes")
	started := strings.Count(allLogs(agents), `msg="restore started`)
	out, errOut, err = env.Ctl("restore-backup", name, "--timeout=2m")
	if err == nil {
		t.Fatalf("restore-backup with the wrong key succeeded: %s", out)
	}
	for _, w := range []string{name, "encrypted with key " + keyA, "[" + keyB + "]", "--backup-encryption-key-file", "the cluster was not touched"} {
		if !strings.Contains(errOut, w) {
			t.Errorf("the refusal lacks %q:\n%s", w, errOut)
		}
	}
	after := harness.WaitSettled(t, agents, 3, settleTimeout)
	if fmt.Sprint(keys(after.ClusterIDs)) != fmt.Sprint(keys(before.ClusterIDs)) || len(after.ClusterIDs) != 1 {
		t.Fatalf("the cluster changed: before %v, after %v", before.ClusterIDs, after.ClusterIDs)
	}
	if got := get(t, c3, "/enc/untouched"); got != "yes" {
		t.Fatalf("/enc/untouched = %q", got)
	}
	if n := strings.Count(allLogs(agents), `msg="restore started`); n != started {
		t.Error("a restore started with a key no agent holds")
	}
	for _, a := range agents {
		if !a.Running() {
			t.Errorf("agent %s exited", a.Name)
		}
	}
}

// fetch-backup of an encrypted backup, then etcd's own tools by hand, as
// docs/manual-restore.md says: the restored etcd serves the backup's
// keys. Without the key nothing is written, and the error names the key.
func TestFetchBackupThenRestoreByHand(t *testing.T) {
	keyPath, keyID := crypttest.KeyFile(t, t.TempDir(), "backup.key")
	env, agents, _ := startCluster(t, 1, 1, harness.AgentOptions{ExtraArgs: []string{"--backup-encryption-key-file=" + keyPath}})
	c := clusterClient(t, agents)
	want := map[string]string{}
	for i := range 20 {
		k, v := fmt.Sprintf("/fetch/%02d", i), fmt.Sprintf("secret-%d", i)
		put(t, c, k, v)
		want[k] = v
	}
	name := strings.TrimSpace(env.MustCtl("backup-now"))
	put(t, c, "/fetch/after-backup", "not in the backup")

	out := filepath.Join(t.TempDir(), "restore")
	_, errOut, err := env.Ctl("fetch-backup", name, "--out", out)
	if err == nil || !strings.Contains(errOut, keyID) || !strings.Contains(errOut, "--backup-decryption-key-file") {
		t.Errorf("fetch-backup without the key: %v\n%s\nwant a refusal naming %s", err, errOut, keyID)
	}
	if _, err := os.Stat(filepath.Join(out, "snapshot.db")); !os.IsNotExist(err) {
		t.Errorf("a refused fetch wrote snapshot.db: %v", err)
	}
	res, errOut, err := env.Ctl("fetch-backup", name, "--out", out, "--backup-decryption-key-file="+keyPath, "-o", "json")
	if err != nil {
		t.Fatalf("fetch-backup: %v\n%s", err, errOut)
	}
	var fetched struct {
		Snapshot, Meta, EncryptionKeyID string
		Revision                        int64
		TotalKeys                       int
	}
	if err := json.Unmarshal([]byte(res), &fetched); err != nil {
		t.Fatalf("fetch-backup -o json: %v\n%s", err, res)
	}
	if fetched.Snapshot != filepath.Join(out, "snapshot.db") || fetched.EncryptionKeyID != keyID || fetched.Revision == 0 {
		t.Errorf("fetch-backup reported %+v", fetched)
	}
	if !strings.Contains(errOut, "fetch "+name+": ") || !strings.Contains(errOut, "checking the snapshot's status") {
		t.Errorf("fetch-backup showed no progress:\n%s", errOut)
	}
	var meta backup.Meta
	if raw, err := os.ReadFile(fetched.Meta); err != nil || json.Unmarshal(raw, &meta) != nil || meta.Revision != fetched.Revision {
		t.Errorf("the meta written beside the snapshot: %v, %+v", err, meta)
	}
	if _, errOut, err := env.Ctl("fetch-backup", name, "--out", out, "--backup-decryption-key-file="+keyPath); err == nil || !strings.Contains(errOut, "never overwrites") {
		t.Errorf("a second fetch into the same --out: %v\n%s", err, errOut)
	}

	// By hand: etcdutl's restore with the five flags the page gives,
	// then etcd on the restored data dir.
	ip := harness.AllocIP(t)
	peer := "http://" + ip + ":2380"
	data := filepath.Join(t.TempDir(), "data")
	restore := exec.Command(filepath.Join(env.BinDir, "etcd-v"+harness.DefaultEtcdVersion, "etcdutl"), "snapshot", "restore", fetched.Snapshot,
		"--name", "byhand", "--initial-cluster", "byhand="+peer, "--initial-cluster-token", "manual-restore-1",
		"--initial-advertise-peer-urls", peer, "--data-dir", data)
	if b, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("etcdutl snapshot restore: %v\n%s", err, b)
	}
	m := env.NewBareOnData(data, "byhand", ip)
	m.Start(env.DefaultEtcd())
	defer m.Stop()
	rc, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	waitEtcd(t, rc)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := rc.Get(ctx, "/fetch/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	if !maps.Equal(got, want) {
		t.Errorf("the etcd restored by hand holds %d keys %v, want the backup's %d", len(got), got, len(want))
	}
	if resp.Header.Revision != fetched.Revision {
		t.Errorf("the etcd restored by hand is at revision %d, the backup at %d", resp.Header.Revision, fetched.Revision)
	}
}
