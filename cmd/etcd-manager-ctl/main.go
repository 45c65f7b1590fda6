// Command etcd-manager-ctl is the operator's tool. It reads and writes the
// backup store, so it works even when etcd is down.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/etcd-manager/etcd-manager/cmd/internal/flags"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Exit statuses.
const (
	// exitFailed: the command could not do its work.
	exitFailed = 1
	// exitUsage: the command line is wrong, and trying again as it is
	// cannot help.
	exitUsage = 2
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		printError(os.Stderr, err)
		os.Exit(exitCode(err))
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newRootCommand(stdout, stderr)
	args = flags.Normalize(cmd.PersistentFlags(), args)
	// An unknown command is a usage error; ExecuteContext would report
	// it as any other. Cobra adds its help and completion commands as it
	// starts, so add them first.
	cmd.InitDefaultHelpCmd()
	cmd.InitDefaultCompletionCmd(args...)
	if _, _, err := cmd.Find(args); err != nil && !isCompletion(args) {
		return usageError{fmt.Errorf("%w; see etcd-manager-ctl --help", err)}
	}
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}

// printError prints the error that ends the ctl. Errors may quote the
// store: the line breaks of errors joined together stay, whatever else a
// terminal would act on is escaped.
func printError(w io.Writer, err error) {
	fmt.Fprintln(w, "etcd-manager-ctl:", printableLines(err.Error()))
}

// usageError is an error in the command line: an unknown command or
// flag, a missing or malformed value.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef is a usageError made as fmt.Errorf makes an error.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// exitCode is the exit status for the error that ends the ctl.
func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) || errors.Is(err, store.ErrBadURL) {
		return exitUsage
	}
	return exitFailed
}

// asUsage makes the errors of cobra's checks of a command's arguments and
// flags usage errors, on cmd and every command under it.
func asUsage(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w; see %s --help", err, c.CommandPath())}
	})
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				return usageError{fmt.Errorf("%s: %w", c.CommandPath(), err)}
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		asUsage(sub)
	}
}
