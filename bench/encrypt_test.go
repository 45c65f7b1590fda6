package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/crypt/crypttest"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// encryptRun is what the encryption benchmark measured: backups and
// fetches of one etcd, with and without a key, alternately.
type encryptRun struct {
	dbSize, snapBytes      int64
	plainObject, encObject int64
	backupPlain, backupEnc []float64 // whole backup.Take, s
	uploadPlain, uploadEnc []float64 // its gzip(+encrypt)+upload stage, s
	fetchPlain, fetchEnc   []float64 // backup.Fetch, s
	fillSecs               float64
	plainName, encName     string
	iterations             int
}

// benchEncryption measures what encryption at rest costs: backup.Take,
// the code an agent runs for every backup, and backup.Fetch, the code
// every node runs to restore one, each with a key and without, in this
// process, alternately, against one filled etcd, to a file:// store on
// real disk.
func benchEncryption(t *testing.T, sc scale) []Result {
	var r encryptRun
	t.Run("backup-encrypted", func(t *testing.T) {
		r = runEncryption(t, sc)
	})
	common := fmt.Sprintf("in this process, against a managed 1-member cluster (etcd %s, TLS as shipped, capture off) filled to %.0f MiB (scale %s) with %d KiB values of random hex in %.1fs; snapshot %.0f MiB; to a file:// store on real disk; age (X25519, ChaCha20-Poly1305 in 64 KiB chunks) after gzip at BestSpeed; with a key and without alternately, %d time(s) each, median",
		harness.DefaultEtcdVersion, mib(r.dbSize), sc.name, fillValueBytes>>10, r.fillSecs, mib(r.snapBytes), r.iterations)
	bv, bb := medianOr0(r.backupEnc), medianOr0(r.backupPlain)
	fv, fb := medianOr0(r.fetchEnc), medianOr0(r.fetchPlain)
	return []Result{
		{Name: "backup-encrypted", Value: bv, Unit: "s", Baseline: bb, Ratio: ratio(bv, bb),
			Note: fmt.Sprintf("backup.Take with --backup-encryption-key-file (snapshot, verify, gzip, encrypt, upload, meta), the code the leader runs for every backup; baseline: the same without a key; its streaming stage (snapshot, gzip, encryption and upload at once) %.2fs encrypted against %.2fs plain (%.2f×); stored object %.1f MiB encrypted, %.1f MiB plain; backups %s s encrypted, %s s plain; %s",
				medianOr0(r.uploadEnc), medianOr0(r.uploadPlain), ratio(medianOr0(r.uploadEnc), medianOr0(r.uploadPlain)),
				mib(r.encObject), mib(r.plainObject), fmtSecs(r.backupEnc), fmtSecs(r.backupPlain), common)},
		{Name: "restore-fetch-encrypted", Value: fv, Unit: "s", Baseline: fb, Ratio: ratio(fv, fb),
			Note: fmt.Sprintf("backup.Fetch of the encrypted backup (read, check the sha256, decrypt, gunzip, verify the snapshot), what every node runs before a restore; baseline: the same of the plaintext backup: %.0f MiB/s against %.0f MiB/s of snapshot; fetches %s s encrypted, %s s plain; %s",
				throughput(r.snapBytes, fv), throughput(r.snapBytes, fb), fmtSecs(r.fetchEnc), fmtSecs(r.fetchPlain), common)},
	}
}

func fmtSecs(xs []float64) string {
	s := ""
	for i, x := range xs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%.2f", x)
	}
	if s == "" {
		return "(none)"
	}
	return s
}

func runEncryption(t *testing.T, sc scale) encryptRun {
	r := encryptRun{iterations: max(2, sc.backupIterations)}
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(1, harness.AgentOptions{Defaults: true, ExtraArgs: []string{"--backup-interval=24h", "--capture=false"}})
	harness.WaitSettled(t, agents, 1, 2*time.Minute)
	agent := agents[0]
	fillTimeout := 30 * time.Second
	if sc.dbBytes > 256<<20 {
		fillTimeout = 5 * time.Minute
	}
	start := time.Now()
	r.dbSize = fill(t, agent.ClientURL, agent.TLS(), sc.dbBytes, fillTimeout)
	r.fillSecs = time.Since(start).Seconds()

	ctx := context.Background()
	s, err := store.Open(ctx, "file://"+filepath.Join(t.TempDir(), "store"), store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	keyPath, keyID := crypttest.KeyFile(t, t.TempDir(), "backup.key")
	key, err := crypt.LoadKeyFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	keys := crypt.NewKeyring(key)
	take := func(k *crypt.Keyring) backup.Info {
		tctx, cancel := context.WithTimeout(ctx, backupTimeout)
		defer cancel()
		began := time.Now()
		info, err := backup.Take(tctx, s, backup.Request{
			Client:   clientv3.Config{DialTimeout: 5 * time.Second, TLS: agent.TLS()},
			Endpoint: agent.ClientURL, TempDir: t.TempDir(), Now: time.Now(), Keys: k,
			EtcdVersion: harness.DefaultEtcdVersion,
		})
		if err != nil {
			t.Fatalf("backup (encrypted %v): %v", k != nil, err)
		}
		secs := time.Since(began).Seconds()
		r.snapBytes = info.Meta.Size
		if k != nil {
			if info.Meta.Encryption == nil || info.Meta.Encryption.KeyID != keyID {
				t.Fatalf("backup %s records encryption %+v, want %s", info.Name, info.Meta.Encryption, keyID)
			}
			r.backupEnc, r.uploadEnc = append(r.backupEnc, secs), append(r.uploadEnc, info.Stages.Stream.Seconds())
			r.encName, r.encObject = info.Name, info.Meta.CompressedSize
		} else {
			r.backupPlain, r.uploadPlain = append(r.backupPlain, secs), append(r.uploadPlain, info.Stages.Stream.Seconds())
			r.plainName, r.plainObject = info.Name, info.Meta.CompressedSize
		}
		t.Logf("backup %s (encrypted %v): %.2fs, of which the stream (snapshot, gzip, upload) %.2fs, the checks %.2fs, the meta %.2fs",
			info.Name, k != nil, secs, info.Stages.Stream.Seconds(), info.Stages.Verify.Seconds(), info.Stages.Commit.Seconds())
		return info
	}
	fetch := func(name string, k *crypt.Keyring) float64 {
		dir := t.TempDir()
		began := time.Now()
		path, _, err := backup.Fetch(ctx, s, name, dir, backup.FetchOptions{Keys: k})
		if err != nil {
			t.Fatalf("fetch %s: %v", name, err)
		}
		secs := time.Since(began).Seconds()
		os.Remove(path)
		t.Logf("fetch %s (encrypted %v): %.2fs", name, k != nil, secs)
		return secs
	}
	for i := range r.iterations {
		// Alternate which goes first, so neither always finds the page
		// cache warmed by the other.
		order := []*crypt.Keyring{nil, keys}
		if i%2 == 1 {
			order = []*crypt.Keyring{keys, nil}
		}
		for _, k := range order {
			take(k)
		}
		for _, k := range order {
			if k == nil {
				r.fetchPlain = append(r.fetchPlain, fetch(r.plainName, nil))
			} else {
				// The reader holds the key as an old one, as after a rotation.
				r.fetchEnc = append(r.fetchEnc, fetch(r.encName, crypt.NewKeyring(nil, key)))
			}
		}
	}
	return r
}
