// Command etcd is the real etcd server, built from the Go module proxy at the
// version pinned in this module's go.mod. Tests and the demo run it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
