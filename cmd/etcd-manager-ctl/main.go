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
		printError(os.Stderr, err)
		os.Exit(1)
	}
}

// printError prints the error that ends the ctl. Errors may quote the
// store: the line breaks of errors joined together stay, whatever else a
// terminal would act on is escaped.
func printError(w io.Writer, err error) {
	fmt.Fprintln(w, "etcd-manager-ctl:", printableLines(err.Error()))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newRootCommand(stdout, stderr)
	cmd.SetArgs(cli.NormalizeArgs(cmd.PersistentFlags(), args))
	return cmd.ExecuteContext(ctx)
}
