package bench

import (
	"os"
	"testing"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

// TestMain removes the binaries the harness built for this run.
func TestMain(m *testing.M) {
	harness.ReleaseBuild = true // the agent as users run it: no test hooks
	code := m.Run()
	harness.Cleanup()
	os.Exit(code)
}
