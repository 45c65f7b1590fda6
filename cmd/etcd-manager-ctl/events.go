package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

func eventsCommand(o *options, stdout io.Writer) *cobra.Command {
	var since, interval time.Duration
	var follow bool
	cmd := &cobra.Command{
		Use:   "events [--since 24h]",
		Short: "Print the cluster's history: every change the agents made, and every failure",
		Long: `events prints the history the agents record in the backup store's events/
prefix, oldest first: membership changes, backups, restores and their steps,
version and settings rolls, defragmentations, CA rotation steps, certificates
issued, and every action that failed. A failure that repeats is one line
with its count, once every 10 minutes, and the success that ends it another.
It reads the store alone, so it works while etcd is down. The store keeps the
newest 1000 events, for 30 days at most. Text from the store is escaped.
--follow (-f) then prints each new event as the agents record it, until
interrupted: one row each, or one JSON or YAML document each.`,
		Example: `  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test events --since 1h
  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test events -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since < 0 {
				return usagef("--since %s must not be negative", since)
			}
			if follow && interval <= 0 {
				return usagef("--interval %s must be positive", interval)
			}
			return o.events(cmd.Context(), stdout, since, follow, interval)
		},
	}
	cmd.Flags().DurationVar(&since, "since", 24*time.Hour, "how far back to look; 0 for everything kept")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "go on printing each new event until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "with --follow, how often to read the store")
	return cmd
}

func (o *options) events(ctx context.Context, w io.Writer, since time.Duration, follow bool, interval time.Duration) error {
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	var from time.Time
	if since > 0 {
		from = time.Now().Add(-since)
	}
	if follow {
		return o.followEvents(ctx, w, s, from, interval)
	}
	events, problems, err := s.ListEvents(ctx, from)
	if err != nil {
		return err
	}
	for _, p := range problems {
		fprintf(o.stderr, "warning: %s cannot be read: %v\n", p.Key, p.Err)
	}
	if o.structured() {
		if events == nil {
			events = []spec.Event{}
		}
		return o.emit(w, events, nil)
	}
	if len(events) == 0 {
		fprintf(w, "no events since %s (the store keeps %d, for %s at most)\n", from.UTC().Format(time.RFC3339), store.MaxEvents, store.EventMaxAge)
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "TIME\tNODE\tACTION\tOUTCOME\tMESSAGE\n")
	for _, e := range events {
		printEvent(tw, e)
	}
	return tw.Flush()
}

// printEvent prints one event as a row of events' table.
func printEvent(w io.Writer, e spec.Event) {
	outcome := e.Outcome
	if e.Count > 1 {
		outcome = fmt.Sprintf("%s x%d since %s", e.Outcome, e.Count, e.Since.UTC().Format(time.RFC3339))
	}
	fprintf(w, "%s\t%s\t%s\t%s\t%s\n", e.Time.UTC().Format(time.RFC3339), printable(e.Node), printable(e.Action), printable(outcome), printable(e.Message))
}
