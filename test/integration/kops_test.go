package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	clientsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// The kops fixture: two complete backups, an unfinished one, the control
// objects and a queued restore of the older backup. The names are
// <RFC3339 UTC>-<6 digits> and the meta timestamps (unix seconds) match
// them.
const (
	kopsOldBackup      = "2023-11-14T22:13:20Z-000001"
	kopsOldStamp       = 1700000000
	kopsNewBackup      = "2023-11-14T23:13:20Z-000001"
	kopsNewStamp       = 1700003600
	kopsPartialBackup  = "2023-11-16T00:00:00Z-000001" // newest, but has no meta
	kopsCommandID      = "2023-11-15T00:00:00Z-000001"
	kopsCommandStampNs = "1700006400000000000"
	kopsCreatedStampNs = "1699990000000000000"
	kopsFirstKeys      = 25
	kopsMoreKeys       = 10
)

// A backup store written exactly as kops's etcd-manager writes it (no
// sha256, size or revision in the meta, int64 values as JSON strings) is
// listed by etcd-manager-ctl, its backups pass the same verification a
// restore makes, and retention spares the backup a queued restore names.
func TestKopsBackupStore(t *testing.T) {
	env := harness.NewEnv(t)
	ms := env.StartBareCluster(1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cfg := clientv3.Config{Endpoints: []string{ms[0].ClientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	c, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	harness.WaitFor(t, startTimeout, "bare etcd to serve", func() bool {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		defer pcancel()
		_, err := c.Get(pctx, "health-probe")
		return err == nil
	})

	// Two real snapshots: the older after 25 keys, the newer after 10 more.
	snapDir := t.TempDir()
	for i := range kopsFirstKeys {
		put(t, c, fmt.Sprintf("/kops/%02d", i), strings.Repeat("k", 64))
	}
	oldDB := filepath.Join(snapDir, "old.db")
	takeSnapshot(ctx, t, cfg, oldDB)
	for i := range kopsMoreKeys {
		put(t, c, fmt.Sprintf("/kops/more/%02d", i), strings.Repeat("m", 64))
	}
	newDB := filepath.Join(snapDir, "new.db")
	takeSnapshot(ctx, t, cfg, newDB)

	// The fixture, in a fresh directory, in kops's format and nothing more.
	dir := filepath.Join(env.Root, "kops-store")
	const specJSON = `{"memberCount":3,"etcdVersion":"3.6.16"}`
	kopsMeta := func(stamp int64) string {
		return fmt.Sprintf(`{"etcdVersion":"3.6.16","timestamp":"%d","clusterSpec":%s}`, stamp, specJSON)
	}
	writeFixture(t, dir, kopsOldBackup+"/"+backup.DataObject, gzipFile(t, oldDB))
	writeFixture(t, dir, kopsOldBackup+"/"+backup.MetaObject, []byte(kopsMeta(kopsOldStamp)))
	writeFixture(t, dir, kopsNewBackup+"/"+backup.DataObject, gzipFile(t, newDB))
	writeFixture(t, dir, kopsNewBackup+"/"+backup.MetaObject, []byte(kopsMeta(kopsNewStamp)))
	writeFixture(t, dir, kopsPartialBackup+"/"+backup.DataObject, gzipFile(t, newDB)) // data, no meta
	writeFixture(t, dir, "control/etcd-cluster-spec", []byte(specJSON))
	writeFixture(t, dir, "control/etcd-cluster-created", []byte(`{"timestamp":"`+kopsCreatedStampNs+`"}`))
	writeFixture(t, dir, "control/"+kopsCommandID+"/_command.json", []byte(
		`{"timestamp":"`+kopsCommandStampNs+`","restoreBackup":{"clusterSpec":`+specJSON+`,"backup":"`+kopsOldBackup+`"}}`))
	env.StoreDir, env.StoreURL = dir, harness.FileURL(dir)

	t.Run("list-backups", func(t *testing.T) {
		out := env.MustCtl("list-backups")
		var names []string
		for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
			if f := strings.Fields(line); len(f) > 0 {
				names = append(names, f[0])
			}
		}
		if want := []string{kopsOldBackup, kopsNewBackup}; !slices.Equal(names, want) {
			t.Errorf("list-backups printed %q; want exactly %q, oldest first (and not the unfinished %s)", out, want, kopsPartialBackup)
		}
	})

	t.Run("list-backups json", func(t *testing.T) {
		out := env.MustCtl("list-backups", "-o", "json")
		var rows []struct {
			Name        string  `json:"name"`
			EtcdVersion string  `json:"etcdVersion"`
			AgeSeconds  float64 `json:"ageSeconds"`
		}
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("list-backups -o json: %v\n%s", err, out)
		}
		if len(rows) != 2 {
			t.Fatalf("list-backups -o json has %d rows, want 2:\n%s", len(rows), out)
		}
		for i, want := range []struct {
			name  string
			stamp int64
		}{{kopsOldBackup, kopsOldStamp}, {kopsNewBackup, kopsNewStamp}} {
			r := rows[i]
			if r.Name != want.name || r.EtcdVersion != "3.6.16" {
				t.Errorf("row %d = %+v; want name %s, etcdVersion 3.6.16", i, r, want.name)
			}
			// The age comes from the meta's timestamp in unix seconds; read
			// as anything else (ns, ms, or zero) it would be far off.
			wantAge := time.Since(time.Unix(want.stamp, 0)).Seconds()
			if math.Abs(r.AgeSeconds-wantAge) > 300 {
				t.Errorf("row %d: ageSeconds %.0f, want about %.0f (timestamp %d s)", i, r.AgeSeconds, wantAge, want.stamp)
			}
		}
		if d := rows[0].AgeSeconds - rows[1].AgeSeconds; math.Abs(d-(kopsNewStamp-kopsOldStamp)) > 5 {
			t.Errorf("the backups' ages differ by %.0fs, want %ds", d, kopsNewStamp-kopsOldStamp)
		}
	})

	t.Run("get", func(t *testing.T) {
		out := env.MustCtl("get")
		if !hasLine(out, "memberCount: 3") || !hasLine(out, "etcdVersion: 3.6.16") {
			t.Errorf("get printed %q; want memberCount 3 and etcdVersion 3.6.16", out)
		}
		var cs spec.ClusterSpec
		if err := json.Unmarshal([]byte(env.MustCtl("get", "-o", "json")), &cs); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(cs, spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"}) {
			t.Errorf("get -o json = %+v", cs)
		}
	})

	t.Run("list-commands", func(t *testing.T) {
		out := env.MustCtl("list-commands")
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if len(lines) != 1 {
			t.Fatalf("list-commands printed %q; want one command", out)
		}
		f := strings.Fields(lines[0])
		if want := []string{kopsCommandID, "restore-backup", "pending", "backup", kopsOldBackup}; !slices.Equal(f, want) {
			t.Errorf("list-commands printed %q; want the fields %q", lines[0], want)
		}
		var rows []struct {
			ID, Kind, State, Backup, Queued string
		}
		if err := json.Unmarshal([]byte(env.MustCtl("list-commands", "-o", "json")), &rows); err != nil {
			t.Fatal(err)
		}
		// The queued time is the command's timestamp, unix ns as a string.
		if len(rows) != 1 || rows[0].Queued != "2023-11-15T00:00:00Z" || rows[0].Backup != kopsOldBackup || rows[0].State != spec.CommandPending {
			t.Errorf("list-commands -o json = %+v", rows)
		}
	})

	s, err := store.Open(ctx, harness.FileURL(dir), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	t.Run("control objects", func(t *testing.T) {
		cs, err := s.ReadSpec(ctx)
		if err != nil || !reflect.DeepEqual(cs, spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"}) {
			t.Errorf("ReadSpec = %+v, %v", cs, err)
		}
		created, err := s.ReadCreated(ctx)
		if want, _ := strconv.ParseInt(kopsCreatedStampNs, 10, 64); err != nil || int64(created.Timestamp) != want {
			t.Errorf("ReadCreated = %+v, %v; want timestamp %d", created, err, want)
		}
	})

	infos, err := backup.List(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Name != kopsOldBackup || infos[1].Name != kopsNewBackup {
		t.Fatalf("backup.List = %+v; want %s and %s", infos, kopsOldBackup, kopsNewBackup)
	}

	t.Run("restore-ready", func(t *testing.T) {
		var revs []int64
		for i, info := range infos {
			m := info.Meta
			if m.EtcdVersion != "3.6.16" || m.ClusterSpec == nil || !reflect.DeepEqual(*m.ClusterSpec, spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"}) ||
				int64(m.Timestamp) != []int64{kopsOldStamp, kopsNewStamp}[i] {
				t.Errorf("meta of %s read as %+v", info.Name, m)
			}
			if m.SHA256 != "" || m.Revision != 0 {
				t.Errorf("meta of %s has fields the kops fixture does not write: %+v", info.Name, m)
			}
			revs = append(revs, verifyStoredSnapshot(ctx, t, s, info.Name))
		}
		if revs[0] < kopsFirstKeys {
			t.Errorf("%s: snapshot revision %d, want at least %d (the keys written)", kopsOldBackup, revs[0], kopsFirstKeys)
		}
		if revs[1] < revs[0]+kopsMoreKeys {
			t.Errorf("%s: snapshot revision %d, want at least %d", kopsNewBackup, revs[1], revs[0]+kopsMoreKeys)
		}
	})

	t.Run("retention spares the restore's backup", func(t *testing.T) {
		// As the controller's prune builds it: backups named by restore
		// commands that are not finished.
		cmds, err := s.ListCommands(ctx)
		if err != nil {
			t.Fatal(err)
		}
		protected := map[string]bool{}
		for _, q := range cmds {
			if q.Err != nil {
				t.Errorf("command %s did not parse: %v", q.ID, q.Err)
			}
			if r := q.Command.RestoreBackup; r != nil && !q.Status.Finished() {
				protected[r.Backup] = true
			}
		}
		if len(protected) != 1 || !protected[kopsOldBackup] {
			t.Fatalf("protected = %v; want exactly %s, from command %s", protected, kopsOldBackup, kopsCommandID)
		}
		policy, err := backup.ParseRetention("count:1")
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		// Without the restore, count:1 drops the older backup ...
		if got := policy.Expired(infos, now, nil); !slices.Equal(got, []string{kopsOldBackup}) {
			t.Fatalf("count:1 without protection expires %q; want [%s]", got, kopsOldBackup)
		}
		// ... with it, the older backup stays.
		if got := policy.Expired(infos, now, protected); slices.Contains(got, kopsOldBackup) || len(got) != 0 {
			t.Errorf("count:1 expires %q although a queued restore names %s", got, kopsOldBackup)
		}
	})

	// Agents started on the kops store find a created cluster with no
	// members and kops's queued restore, and carry it out.
	t.Run("agents run kops's queued restore", func(t *testing.T) {
		agents := env.StartAgents(3, harness.AgentOptions{})
		harness.WaitSettled(t, agents, 3, 3*time.Minute)
		ac := clusterClient(t, agents)
		if n := count(t, ac, "/kops/"); n != kopsFirstKeys {
			t.Fatalf("%d keys under /kops/ after restoring %s, want its %d", n, kopsOldBackup, kopsFirstKeys)
		}
		harness.WaitFor(t, time.Minute, "the restore command to be removed", func() bool {
			out, _, err := env.Ctl("list-commands")
			return err == nil && !strings.Contains(out, kopsCommandID)
		})
	})
}

// takeSnapshot streams a snapshot of the member into path.
func takeSnapshot(ctx context.Context, t *testing.T, cfg clientv3.Config, path string) {
	t.Helper()
	version, err := clientsnapshot.SaveWithVersion(ctx, zap.NewNop(), cfg, path)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if !strings.HasPrefix(version, "3.6") {
		t.Fatalf("snapshot storage version %q, want 3.6.x", version)
	}
}

// gzipFile returns the gzip of a file's contents.
func gzipFile(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// writeFixture writes one object of a file:// store directly, as another
// tool would.
func writeFixture(t *testing.T, dir, key string, data []byte) {
	t.Helper()
	path := filepath.Join(dir, filepath.FromSlash(key))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// verifyStoredSnapshot downloads a backup's data object through the store,
// gunzips it and has backup.Verify check it as a restore would (the sha256
// trailer, then etcdutl's snapshot status). It needs nothing from the meta,
// so it serves backups whose meta has no sha256. It returns the snapshot's
// revision.
func verifyStoredSnapshot(ctx context.Context, t *testing.T, s *store.Store, name string) int64 {
	t.Helper()
	gz, err := s.Read(ctx, name+"/"+backup.DataObject)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	db := filepath.Join(t.TempDir(), "snapshot.db")
	f, err := os.Create(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, zr); err != nil {
		f.Close()
		t.Fatalf("%s: gunzip: %v", name, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	status, err := backup.Verify(db)
	if err != nil {
		t.Fatalf("verify %s: %v", name, err)
	}
	return status.Revision
}
