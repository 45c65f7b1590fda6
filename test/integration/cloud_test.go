package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// A real 3-member cluster backs up to each kind of store: before its
// membership changes, and on demand through backup-now. Every backup is
// restore-ready.
func TestClusterBackupsToEveryStore(t *testing.T) {
	minio := harness.StartMinIO(t)
	minio.CreateBucket(t, "backups")
	azurite := harness.StartAzurite(t)
	azurite.CreateContainer(t, "backups")
	gcs := harness.StartFakeGCS(t)
	gcs.CreateBucket(t, "backups")
	stores := []struct {
		name string
		url  string
		env  []string
	}{
		{"file", "", nil},
		{"minio", minio.StoreURL("backups", "my-cluster/backups/etcd/main"), minio.Env()},
		{"azurite", azurite.StoreURL("backups", "my-cluster/backups/etcd/main"), azurite.Env()},
		{"gcs", gcs.StoreURL("backups", "my-cluster/backups/etcd/main"), gcs.Env()},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			env := harness.NewEnv(t)
			if st.url != "" {
				env.UseStore(st.url, st.env)
				setEnv(t, st.env)
			}
			env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
			agents := env.StartAgents(3, harness.AgentOptions{})
			harness.WaitSettled(t, agents, 3, settleTimeout)
			c := clusterClient(t, agents)
			for i := range 20 {
				put(t, c, fmt.Sprintf("/cloud/%02d", i), st.name)
			}

			name := strings.TrimSpace(env.MustCtl("backup-now"))
			if !backupNameRE.MatchString(name) {
				t.Fatalf("backup-now printed %q, want a backup name", name)
			}
			listed := strings.Fields(env.MustCtl("list-backups"))
			if len(listed) == 0 || listed[len(listed)-1] != name {
				t.Fatalf("list-backups %q does not end with backup-now's %s", listed, name)
			}
			cmds := env.MustCtl("list-commands")
			if !strings.Contains(cmds, "backup-now") || !strings.Contains(cmds, "done") || !strings.Contains(cmds, name) {
				t.Errorf("list-commands does not show the done backup-now:\n%s", cmds)
			}

			s := openStore(t, env.StoreURL)
			meta := checkRestorable(t, s, name)
			if meta.Revision < 20 || meta.ClusterSpec == nil || meta.ClusterSpec.MemberCount != 3 {
				t.Errorf("meta %+v: want the 20 writes and the 3-member spec", meta)
			}
		})
	}
}

// checkRestorable downloads a backup, checks it against its meta, and has
// etcdutl's snapshot library read it, as a restore would.
func checkRestorable(t *testing.T, s *store.Store, name string) backup.Meta {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw, err := s.Read(ctx, name+"/"+backup.MetaObject)
	if err != nil {
		t.Fatal(err)
	}
	var meta backup.Meta
	if err := json.Unmarshal(raw, &meta); err != nil {
		t.Fatalf("meta of %s: %v", name, err)
	}
	gz, err := s.Read(ctx, name+"/"+backup.DataObject)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(gz)
	if hex.EncodeToString(sum[:]) != meta.SHA256 || int64(len(gz)) != meta.CompressedSize {
		t.Fatalf("%s: object sha256/size do not match the meta %+v", name, meta)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(t.TempDir(), "snapshot.db")
	f, err := os.Create(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, zr); err != nil {
		t.Fatal(err)
	}
	f.Close()
	status, err := backup.Verify(db)
	if err != nil {
		t.Fatalf("verify %s: %v", name, err)
	}
	if status.Revision != meta.Revision {
		t.Fatalf("%s: snapshot revision %d, meta says %d", name, status.Revision, meta.Revision)
	}
	return meta
}
