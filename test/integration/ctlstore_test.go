package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// The ctl against a real MinIO, one store error of each class: each is
// reported at once, on one line of stderr naming what to set, with
// nothing on stdout and no word from the SDK; only a store that does not
// answer is tried again. The environment is the test's own: no variable
// of this machine's reaches the ctl.
func TestCtlStoreErrors(t *testing.T) {
	env := harness.NewEnv(t)
	minio := harness.StartMinIO(t)
	minio.CreateBucket(t, "bkt")
	home := t.TempDir()
	creds := []string{"AWS_ACCESS_KEY_ID=" + minio.User, "AWS_SECRET_ACCESS_KEY=" + minio.Password}
	base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "AWS_EC2_METADATA_DISABLED=true"}
	tests := []storeErrorCase{
		{name: "fine", url: minio.StoreURL("bkt", "x"), env: creds, slowest: 10 * time.Second},
		{name: "no bucket", url: minio.StoreURL("nobucket", "x"), env: creds, wantCode: 1,
			want: []string{"store: no such bucket or container", `bucket or container "nobucket" does not exist; create it first`}, unwanted: []string{"unreachable", "tried"}, slowest: 5 * time.Second},
		{name: "wrong secret", url: minio.StoreURL("bkt", "x"), env: []string{"AWS_ACCESS_KEY_ID=" + minio.User, "AWS_SECRET_ACCESS_KEY=wrong"}, wantCode: 1,
			want: []string{"store: access denied", "AWS_SECRET_ACCESS_KEY"}, unwanted: []string{"unreachable", "tried"}, slowest: 5 * time.Second},
		{name: "no credentials", url: minio.StoreURL("bkt", "x"), wantCode: 1,
			want: []string{"store: no credentials found", "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"}, unwanted: []string{"unreachable", "tried"}, slowest: 5 * time.Second},
		{name: "unknown query parameter", url: minio.StoreURL("bkt", "x") + "&regoin=us-east-1", env: creds, wantCode: 2,
			want: []string{"invalid backup store URL", `unknown query parameter "regoin"`}, slowest: 5 * time.Second},
		// With no endpoint and no region the SDK cannot resolve an
		// endpoint, so nothing leaves this machine.
		{name: "no region", url: "s3://bkt/x", env: creds, wantCode: 2,
			want: []string{"invalid backup store URL", "set the bucket's region with ?region= in the URL or AWS_REGION"}, slowest: 5 * time.Second},
	}
	checkStoreErrors(t, env.CtlBin, base, tests)

	// doctor against the real MinIO: its clock is the server's.
	stdout, stderr, code := runCtl(t, env.CtlBin, append(base, creds...), "--backup-store="+minio.StoreURL("bkt", "x"), "doctor", "-o", "json", "--etcd-bin-dir="+env.BinDir)
	for _, want := range []string{`"check": "store",` + "\n" + `    "status": "ok"`, `"check": "store-write",` + "\n" + `    "status": "ok"`, `"check": "store-clock",` + "\n" + `    "status": "ok"`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("doctor on MinIO (exit %d) lacks %s:\n%s\n%s", code, want, stdout, stderr)
		}
	}
	stdout, _, code = runCtl(t, env.CtlBin, append(base, creds...), "--backup-store="+minio.StoreURL("nobucket", "x"), "doctor", "-o", "json", "--etcd-bin-dir="+env.BinDir)
	if code != 1 || !strings.Contains(stdout, "create the bucket or container") {
		t.Errorf("doctor on a missing bucket: exit %d:\n%s", code, stdout)
	}

	// A store that does not answer is tried again, and says so.
	minio.Stop()
	_, stderr, code = runCtl(t, env.CtlBin, append(base, creds...), "--backup-store="+minio.StoreURL("bkt", "x"), "--store-attempts=2", "list-backups")
	if code != 1 || !strings.Contains(stderr, "backup store unreachable") || !strings.Contains(stderr, "tried 2 times") {
		t.Errorf("MinIO down: exit %d:\n%s", code, stderr)
	}
}

// storeErrorCase is one run of the ctl against a store, and what it must
// print.
type storeErrorCase struct {
	name     string
	url      string
	env      []string
	wantCode int
	want     []string
	unwanted []string
	// slowest is how long the ctl may take: a refusal is not retried.
	slowest time.Duration
}

// checkStoreErrors runs list-backups -o json for each case with base and
// the case's environment alone: a success prints [] alone on stdout, a
// failure one line of the ctl's own on stderr and nothing on stdout.
func checkStoreErrors(t *testing.T, ctlBin string, base []string, tests []storeErrorCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			stdout, stderr, code := runCtl(t, ctlBin, append(base, tt.env...), "--backup-store="+tt.url, "--store-attempts=3", "list-backups", "-o", "json")
			took := time.Since(start)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tt.wantCode, stderr)
			}
			if took > tt.slowest {
				t.Errorf("took %s, over %s: a refusal must not be retried", took, tt.slowest)
			}
			if code == 0 {
				if strings.TrimSpace(stdout) != "[]" || stderr != "" {
					t.Errorf("stdout %q, stderr %q; want [] alone", stdout, stderr)
				}
				return
			}
			if stdout != "" {
				t.Errorf("stdout %q: a failure prints nothing there", stdout)
			}
			if lines := strings.Count(strings.TrimSpace(stderr), "\n") + 1; lines != 1 || !strings.HasPrefix(stderr, "etcd-manager-ctl: ") {
				t.Errorf("stderr has %d lines, want the ctl's one error:\n%s", lines, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
			for _, u := range tt.unwanted {
				if strings.Contains(stderr, u) {
					t.Errorf("stderr says %q:\n%s", u, stderr)
				}
			}
		})
	}

}

// The ctl against a real Azurite and a real fake-gcs-server: a missing
// container or bucket, a refused or missing Azure account key and a
// missing GCS credentials file are each reported at once on one line
// naming what to set, with nothing on stdout and no word from the SDKs
// (gocloud's GCS opener printed a warning on stdout, then asked the GCE
// metadata server).
func TestCtlStoreErrorsAzureAndGCS(t *testing.T) {
	env := harness.NewEnv(t)
	az := harness.StartAzurite(t)
	az.CreateContainer(t, "ctr")
	gcs := harness.StartFakeGCS(t)
	gcs.CreateBucket(t, "bkt")
	base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	// The emulator's guard on the GCE metadata server: a client that
	// asked it would fail the test.
	var metadataGuard []string
	for _, kv := range gcs.Env() {
		if strings.HasPrefix(kv, "GCE_METADATA_HOST=") {
			metadataGuard = append(metadataGuard, kv)
		}
	}
	azEnv := az.Env()
	wrongKey := []string{azEnv[0], "AZURE_STORAGE_KEY=" + "d3Jvbmcga2V5IG9mIHRoZSByaWdodCBsZW5ndGggZm9yIGEgdGVzdCBhY2NvdW50IQ=="}
	checkStoreErrors(t, env.CtlBin, base, []storeErrorCase{
		{name: "azure fine", url: az.StoreURL("ctr", "x"), env: azEnv, slowest: 10 * time.Second},
		{name: "azure no container", url: az.StoreURL("noctr", "x"), env: azEnv, wantCode: 1,
			want: []string{"store: no such bucket or container", `"noctr" does not exist; create it first`}, unwanted: []string{"unreachable", "tried"}, slowest: 5 * time.Second},
		{name: "azure wrong key", url: az.StoreURL("ctr", "x"), env: wrongKey, wantCode: 1,
			want: []string{"store: access denied", "AZURE_STORAGE_ACCOUNT"}, unwanted: []string{"unreachable", "tried"}, slowest: 5 * time.Second},
		{name: "azure no account", url: az.StoreURL("ctr", "x"), wantCode: 1,
			want: []string{"store: no credentials found", "AZURE_STORAGE_ACCOUNT"}, unwanted: []string{"unreachable", "tried"}, slowest: 5 * time.Second},
		{name: "gcs fine", url: gcs.StoreURL("bkt", "x"), env: gcs.Env(), slowest: 10 * time.Second},
		{name: "gcs no bucket", url: gcs.StoreURL("nobkt", "x"), env: gcs.Env(), wantCode: 1,
			want: []string{"store: no such bucket or container", `"nobkt" does not exist; create it first`}, unwanted: []string{"unreachable", "tried"}, slowest: 5 * time.Second},
		// No emulator: the client reads its credentials file first, and
		// stops there, before anything leaves this machine.
		{name: "gcs credentials file missing", url: gcs.StoreURL("bkt", "x"), env: append([]string{"GOOGLE_APPLICATION_CREDENTIALS=" + t.TempDir() + "/missing.json"}, metadataGuard...), wantCode: 1,
			want: []string{"store: no credentials found", "GOOGLE_APPLICATION_CREDENTIALS"}, unwanted: []string{"unreachable", "tried"}, slowest: 5 * time.Second},
	})
}

// runCtl runs the ctl binary with exactly env and args.
func runCtl(t *testing.T, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}
