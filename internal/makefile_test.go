package internal_test

import (
	"os/exec"
	"strings"
	"testing"
)

// make demo builds only what the demo runs: one etcd and the three
// binaries. Kubernetes alone took 21 CPU-minutes cold, and MinIO, Azurite,
// the other etcd versions and the linters are for the tests.
func TestMakeDemoBuildsOnlyTheDemo(t *testing.T) {
	out, err := exec.Command("make", "-n", "-C", "..", "demo").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n demo: %v\n%s", err, out)
	}
	plan := string(out)
	for _, want := range []string{"hack/build-etcd.sh 3.6.16", "go build -buildvcs=auto -o bin/ ./cmd/etcd-manager ./cmd/etcd-manager-ctl ./cmd/etcd-manager-operator", "hack/demo.sh"} {
		if !strings.Contains(plan, want) {
			t.Errorf("make demo does not run %q:\n%s", want, plan)
		}
	}
	for _, never := range []string{"build-kube", "minio", "azurite", "fake-gcs-server", "staticcheck", "controller-gen", "helm", "fetch-debian-etcd", "3.5.35", "3.7.3", "packages.sh"} {
		if strings.Contains(plan, never) {
			t.Errorf("make demo builds %q, which the demo does not run:\n%s", never, plan)
		}
	}
}
