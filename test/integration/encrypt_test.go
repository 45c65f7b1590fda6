package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
