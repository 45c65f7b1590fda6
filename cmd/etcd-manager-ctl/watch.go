package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// watchStatus prints the status every interval while it changes, until
// ctx ends (an interrupt): on a terminal redrawn in place, otherwise each
// new status after a line with its time, or as one more JSON or YAML
// document. A status that cannot be read is said, and the watch goes on.
func (o *options) watchStatus(ctx context.Context, w io.Writer, interval time.Duration) error {
	tty := isTerminal(w)
	last := ""
	for {
		var b bytes.Buffer
		err := o.status(ctx, &b)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			fmt.Fprintln(&b, "status:", printableLines(err.Error()))
		}
		if now := b.String(); now != last {
			last = now
			switch {
			case tty:
				fmt.Fprint(w, "\x1b[H\x1b[2J") // home, clear the screen
				fmt.Fprintf(w, "every %s, %s (interrupt to stop)\n\n", interval, time.Now().UTC().Format(time.RFC3339))
			case o.output == formatYAML:
				fmt.Fprintln(w, "---")
			case !o.structured():
				fmt.Fprintf(w, "--- %s\n", time.Now().UTC().Format(time.RFC3339))
			}
			if _, err := io.WriteString(w, now); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// eventKey tells events apart: a failure that repeats is a new event
// with a higher count.
type eventKey struct {
	at                   time.Time
	node, action, result string
	count                int
}

func keyOf(e spec.Event) eventKey {
	return eventKey{at: e.Time, node: e.Node, action: e.Action, result: e.Outcome, count: e.Count}
}

// followEvents prints the events since from, then each new one as the
// agents record it, every interval, until ctx ends (an interrupt): text
// rows, or one JSON or YAML document per event.
func (o *options) followEvents(ctx context.Context, w io.Writer, s *store.Store, from time.Time, interval time.Duration) error {
	seen := map[eventKey]bool{}
	header := false
	for {
		events, problems, err := s.ListEvents(ctx, from)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			fprintf(o.stderr, "warning: cannot list the events (trying again): %v\n", err)
		}
		for _, p := range problems {
			fprintf(o.stderr, "warning: %s cannot be read: %v\n", p.Key, p.Err)
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, e := range events {
			k := keyOf(e)
			if seen[k] {
				continue
			}
			seen[k] = true
			if e.Time.After(from) {
				from = e.Time
			}
			switch {
			case o.output == formatYAML:
				fmt.Fprintln(w, "---")
				if err := writeYAML(w, e); err != nil {
					return err
				}
			case o.structured():
				if err := writeJSON(w, e); err != nil {
					return err
				}
			default:
				if !header {
					fmt.Fprintf(tw, "TIME\tNODE\tACTION\tOUTCOME\tMESSAGE\n")
					header = true
				}
				printEvent(tw, e)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		// Keep only what can still be listed again: the events at the
		// newest time.
		for k := range seen {
			if k.at.Before(from) {
				delete(seen, k)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}
