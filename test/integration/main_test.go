// Package integration runs real etcd-manager agents with real etcd on
// loopback, against a file store on real disk.
package integration

import (
	"os"
	"testing"

	"github.com/etcd-manager/etcd-manager/test/harness"
)

func TestMain(m *testing.M) {
	code := m.Run()
	harness.Cleanup()
	os.Exit(code)
}
