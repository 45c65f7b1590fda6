// Command etcd-manager-ctl is the operator's tool. It reads and writes the
// backup store, so it works even when etcd is down.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

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
	// exitQueued: --wait timed out, and what was asked stays queued or
	// goes on.
	exitQueued = 3
)

func main() {
	// An interrupt ends a command's wait (and a watch, which ends
	// there) rather than the process mid-write.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		printError(os.Stderr, err)
		os.Exit(exitCode(err))
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newRootCommand(stdout, stderr)
	all := allFlags(cmd)
	args = boolsWithValues(all, flags.Normalize(all, args))
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

// allFlags are the flags of cmd and of every command under it.
func allFlags(cmd *cobra.Command) *pflag.FlagSet {
	all := pflag.NewFlagSet(cmd.Name(), pflag.ContinueOnError)
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		add := func(f *pflag.Flag) {
			if all.Lookup(f.Name) == nil {
				all.AddFlag(f)
			}
		}
		c.PersistentFlags().VisitAll(add)
		c.LocalNonPersistentFlags().VisitAll(add)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd)
	return all
}

// flagOwner is the path of the first command under root whose own flag
// name is, "" when none has it.
func flagOwner(root *cobra.Command, name string) string {
	if root.LocalNonPersistentFlags().Lookup(name) != nil {
		return root.CommandPath()
	}
	for _, sub := range root.Commands() {
		if owner := flagOwner(sub, name); owner != "" {
			return owner
		}
	}
	return ""
}

// boolsWithValues spells each boolean flag of fs given without a value
// (--force) with one (--force=true), which means the same. A command's
// own flags may come before its name, and cobra, finding the command
// before it parses them, would take the word after a boolean flag it
// does not know for the flag's value: etcd-manager-ctl --force
// configure-cluster.
func boolsWithValues(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i, arg := range args {
		if arg == "--" {
			return append(out, args[i:]...)
		}
		if name, ok := strings.CutPrefix(arg, "--"); ok && !strings.Contains(name, "=") {
			if f := fs.Lookup(name); f != nil && f.Value.Type() == "bool" {
				arg += "=true"
			}
		}
		out = append(out, arg)
	}
	return out
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

// stillQueued is the error of a --wait that timed out while the command
// it waited for stays queued, or goes on.
type stillQueued struct{ err error }

func (e stillQueued) Error() string { return e.err.Error() }
func (e stillQueued) Unwrap() error { return e.err }

// exitCode is the exit status for the error that ends the ctl.
func exitCode(err error) int {
	var u usageError
	var q stillQueued
	switch {
	case errors.As(err, &u) || errors.Is(err, store.ErrBadURL):
		return exitUsage
	case errors.As(err, &q):
		return exitQueued
	}
	return exitFailed
}

// asUsage makes the errors of cobra's checks of a command's arguments and
// flags usage errors, on cmd and every command under it. A flag that
// belongs to another command says which.
func asUsage(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		name, unknown := strings.CutPrefix(err.Error(), "unknown flag: --")
		if owner := flagOwner(c.Root(), name); unknown && owner != "" {
			return usagef("%s takes no --%s: it is a flag of %s; see %s --help", c.CommandPath(), name, owner, c.CommandPath())
		}
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
