package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// syncBuffer is a bytes.Buffer safe to write from the command's
// goroutine and read from the test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// runUntil runs the ctl in the background until stop is called, which
// waits for it and returns its error.
func (e ctlEnv) runUntil(t *testing.T, out *syncBuffer, args ...string) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"--backup-store=" + e.store, "--store-attempts=1"}, args...), out, &syncBuffer{})
	}()
	return func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("the ctl did not stop on the interrupt")
			return nil
		}
	}
}

func waitOutput(t *testing.T, out *syncBuffer, what string, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in:\n%s", what, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// status --watch prints the status again when it changes, not when it
// stays, and ends at the interrupt without an error.
func TestStatusWatch(t *testing.T) {
	e := newCtlEnv(t)
	if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	stop := e.runUntil(t, &out, "--insecure", "--discovery=static:127.0.0.1:1", "status", "--watch", "--interval=50ms")
	waitOutput(t, &out, "the first status", func(s string) bool { return strings.Contains(s, "memberCount=1") })
	time.Sleep(300 * time.Millisecond) // several polls with nothing new
	if _, _, err := e.run(t, "configure-cluster", "--member-count=3"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, &out, "the changed status", func(s string) bool { return strings.Contains(s, "memberCount=3") })
	if err := stop(); err != nil {
		t.Errorf("status --watch ended with %v at the interrupt", err)
	}
	got := out.String()
	if n := strings.Count(got, "\n--- ") + strings.Count(got[:4], "--- "); n != 2 {
		t.Errorf("status --watch printed %d statuses, want 2 (one per change):\n%s", n, got)
	}
	if !strings.Contains(got, "status: no agent answered") {
		t.Errorf("status --watch does not say no agent answered:\n%s", got)
	}
}

// events --follow prints what is there, then each new event once, as
// rows or as JSON documents, until the interrupt.
func TestEventsFollow(t *testing.T) {
	for _, format := range []string{formatText, formatJSON} {
		t.Run(format, func(t *testing.T) {
			e := newCtlEnv(t)
			if _, _, err := e.run(t, "--member-count=1", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
				t.Fatal(err)
			}
			s := e.open(t)
			defer s.Close()
			now := time.Now()
			add := func(ev spec.Event) {
				if err := s.AddEvent(t.Context(), ev); err != nil {
					t.Fatal(err)
				}
			}
			add(spec.Event{Time: now.Add(-time.Minute), Node: "n1", Action: "add-member before", Outcome: spec.EventOK})
			var out syncBuffer
			stop := e.runUntil(t, &out, "events", "--follow", "--interval=50ms", "-o", format)
			waitOutput(t, &out, "the event already there", func(s string) bool { return strings.Contains(s, "add-member before") })
			add(spec.Event{Time: now, Node: "n2", Action: "take-backup (on-demand)", Outcome: spec.EventFailed, Message: "store away", Count: 2, Since: now.Add(-time.Second)})
			add(spec.Event{Time: now, Node: "n2", Action: "take-backup (on-demand)", Outcome: spec.EventFailed, Message: "store away", Count: 3, Since: now.Add(-time.Second)})
			waitOutput(t, &out, "the new events", func(s string) bool { return strings.Count(s, "take-backup") == 2 })
			time.Sleep(200 * time.Millisecond) // polls that find nothing new
			if err := stop(); err != nil {
				t.Errorf("events --follow ended with %v at the interrupt", err)
			}
			got := out.String()
			if strings.Count(got, "add-member before") != 1 || strings.Count(got, "take-backup") != 2 {
				t.Errorf("events --follow printed an event twice, or missed one:\n%s", got)
			}
			if format == formatJSON && strings.Count(got, `"action":`) != 3 {
				t.Errorf("want 3 JSON documents:\n%s", got)
			}
		})
	}
}
