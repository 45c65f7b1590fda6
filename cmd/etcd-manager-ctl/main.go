// Command etcd-manager-ctl is the operator's tool. It reads and writes the
// backup store, so it works even when etcd is down.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/etcd-manager/etcd-manager/internal/cli"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "etcd-manager-ctl:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newRootCommand(stdout, stderr)
	cmd.SetArgs(cli.NormalizeArgs(cmd.PersistentFlags(), args))
	return cmd.ExecuteContext(ctx)
}
