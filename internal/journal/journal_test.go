package journal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// What the loop's outcomes become in the history: changes that worked,
// a failure at once, its repeats once per eventCollapse with the count,
// and the success that ends them; no waits, and no read-only successes.
func TestEventLogOutcomes(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	e := New("n1", func() time.Time { return now }, slog.New(slog.DiscardHandler), quiet)
	add := plan.AddMember{NodeID: "b"}
	boom := errors.New("boom")
	steps := []struct {
		after time.Duration
		act   plan.Action
		err   error
	}{
		{0, add, nil},
		{time.Second, plan.TakeBackup{Reason: "periodic"}, boom},
		{time.Minute, plan.TakeBackup{Reason: "periodic"}, boom},
		{2 * time.Minute, plan.TakeBackup{Reason: "periodic"}, fmt.Errorf("%w: not yet", errWait)},
		{3 * time.Minute, plan.BackupRestored{ID: "r1"}, fmt.Errorf("%w: members starting", errWait)},
		{9 * time.Minute, plan.TakeBackup{Reason: "periodic"}, boom},
		{11 * time.Minute, plan.TakeBackup{Reason: "periodic"}, errors.New("boom again")},
		{12 * time.Minute, plan.TakeBackup{Reason: "periodic"}, nil},
		{13 * time.Minute, plan.MoveLeader{To: 1}, fmt.Errorf("x: %w", errNotLeading)},
		{14 * time.Minute, plan.VerifyRestore{ID: "r2"}, fmt.Errorf("procedure: no longer the driver: %w: the lease ran out", errNotLeading)},
	}
	start := now
	for _, s := range steps {
		now = start.Add(s.after)
		e.Outcome(s.act, s.err)
	}
	var got []string
	for _, ev := range e.pending() {
		line := fmt.Sprintf("%s %s %s", ev.Action, ev.Outcome, ev.Message)
		if ev.Count > 0 {
			line += fmt.Sprintf(" count=%d since=%s", ev.Count, ev.Since.Sub(start))
		}
		if ev.Node != "n1" {
			t.Errorf("event of node %q", ev.Node)
		}
		got = append(got, line)
	}
	want := []string{
		"add-member b ok ",
		"take-backup (periodic) failed boom",
		"take-backup (periodic) failed boom again count=4 since=1s",
		"take-backup (periodic) ok succeeded after failing 4 times since 2026-11-24T12:00:01Z",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// fakeEvents is a store that fails its first writes.
type fakeEvents struct {
	mu      sync.Mutex
	failFor int
	got     []spec.Event
}

func (f *fakeEvents) AddEvent(_ context.Context, e spec.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failFor > 0 {
		f.failFor--
		return errors.New("store away")
	}
	f.got = append(f.got, e)
	return nil
}

// The writer keeps the events while the store is away and writes them in
// order once it is back; a full queue drops the oldest, counted.
func TestEventLogWriter(t *testing.T) {
	e := New("n1", time.Now, slog.New(slog.DiscardHandler), quiet)
	for i := range eventQueueLimit + 5 {
		e.Note(fmt.Sprintf("a%d", i), "")
	}
	if n := e.dropped.Load(); n != 5 {
		t.Fatalf("dropped %d, want 5", n)
	}
	f := &fakeEvents{failFor: 1}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go e.run(ctx, func(context.Context) (eventWriter, func(), error) { return f, func() {}, nil })
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		n := len(f.got)
		f.mu.Unlock()
		if n == eventQueueLimit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events written, want %d", n, eventQueueLimit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if f.got[0].Action != "a5" || f.got[len(f.got)-1].Action != fmt.Sprintf("a%d", eventQueueLimit+4) {
		t.Errorf("written from %s to %s", f.got[0].Action, f.got[len(f.got)-1].Action)
	}
}

// A command failed by the planner, or by a procedure step (which reports
// the step done), is a failure in the history, never a success; the
// record of an action's failures is dropped once it is not tried again.
func TestEventLogCommandFailures(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	e := New("n1", func() time.Time { return now }, slog.New(slog.DiscardHandler), quiet)
	e.Outcome(plan.FailCommand{ID: "c1", Reason: "junk"}, nil)
	step := plan.PrepareRestore{ID: "c2", Backup: "b"}
	e.CommandFailed("c2", "backup too large")
	e.Outcome(step, nil)
	e.Outcome(plan.TakeBackup{Reason: "before x"}, errors.New("boom"))
	now = now.Add(failingIdle + time.Second)
	e.Outcome(plan.AddMember{NodeID: "b"}, nil)
	e.Outcome(plan.TakeBackup{Reason: "before x"}, errors.New("boom"))
	var got []string
	for _, ev := range e.pending() {
		got = append(got, fmt.Sprintf("%s %s %s %d", ev.Action, ev.Outcome, ev.Message, ev.Count))
	}
	want := []string{
		"fail-command c1 failed junk 0",
		"fail-command c2 failed backup too large 0",
		"take-backup (before x) failed boom 0",
		"add-member b ok  0",
		"take-backup (before x) failed boom 0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// errWait and errNotLeading stand for the loop's errors that are no
// event: an action that must wait, and one refused for no longer leading.
var (
	errWait       = errors.New("must wait")
	errNotLeading = errors.New("no longer leading")
)

func quiet(err error) bool { return errors.Is(err, errWait) || errors.Is(err, errNotLeading) }
