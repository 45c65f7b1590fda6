package procedure

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// fakeFence holds term until it is lost, at once or after loseAfter
// renewals.
type fakeFence struct {
	mu        sync.Mutex
	term      int64
	lost      bool
	loseAfter int // renewals that succeed before the fence is lost (0: never lost by renewal)
	renewals  int
	flaky     bool // renewals fail, but not for a lost lease
	// deadline is the lease's local deadline; zero: none kept.
	deadline time.Time
}

func (f *fakeFence) Deadline() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deadline
}

func (f *fakeFence) Hold(context.Context) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost {
		return 0, fmt.Errorf("%w: fake", ErrFenced)
	}
	return f.term, nil
}

func (f *fakeFence) Renew(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.renewals++
	if f.loseAfter > 0 && f.renewals > f.loseAfter {
		f.lost = true
	}
	if f.lost {
		return fmt.Errorf("%w: fake", ErrFenced)
	}
	if f.flaky {
		return errors.New("store: backup store unreachable: 503")
	}
	return nil
}

func (f *fakeFence) Renewals() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renewals
}

// fenceSetup is how a test's fakeFence starts.
type fenceSetup struct {
	term      int64
	lost      bool
	loseAfter int
	flaky     bool
}

// fakeRecords records the statuses written.
type fakeRecords struct {
	calls  []string
	choice *spec.Choice
}

func (r *fakeRecords) SetCommandStatus(_ context.Context, id string, term int64, st spec.CommandStatus, _ time.Time) error {
	phase := ""
	if st.Restore != nil {
		phase = st.Restore.Phase
	}
	r.calls = append(r.calls, fmt.Sprintf("SetCommandStatus(%s, %d, %s, %s)", id, term, st.State, phase))
	return nil
}

func (r *fakeRecords) CreateChoice(_ context.Context, id string, c spec.Choice) (spec.Choice, error) {
	r.calls = append(r.calls, fmt.Sprintf("CreateChoice(%s, %d, %s)", id, c.Term, c.Survivor))
	if r.choice != nil {
		return *r.choice, nil
	}
	r.choice = &c
	return c, nil
}

func (r *fakeRecords) DeleteCommand(_ context.Context, id string) error {
	r.calls = append(r.calls, "DeleteCommand("+id+")")
	return nil
}

func newRunner(f *fakeFence, r *fakeRecords) *Runner {
	return &Runner{Fence: f, Records: r, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: time.Now,
		RenewEvery: 10 * time.Millisecond}
}

var testProc = Definition{Name: "test", Phases: []Phase{{"one", time.Minute}, {"two", 200 * time.Millisecond}, {"three", time.Minute}}}

func TestRunnerDo(t *testing.T) {
	tests := []struct {
		name  string
		fence fenceSetup
		phase string
		step  func(ctx context.Context) error
		// wantErr is a substring of the error, empty for none;
		// wantFenced says whether it wraps ErrFenced.
		wantErr    string
		wantFenced bool
		wantRan    bool
		minRenew   int
	}{
		{name: "a fenced driver does not act", fence: fenceSetup{term: 7, lost: true}, phase: "one",
			step: func(context.Context) error { return nil }, wantErr: "no longer the driver", wantFenced: true},
		{name: "a step runs under the term", fence: fenceSetup{term: 7}, phase: "one",
			step: func(context.Context) error { return nil }, wantRan: true},
		{name: "the lease is renewed while a step runs", fence: fenceSetup{term: 7}, phase: "one",
			step: func(context.Context) error { time.Sleep(80 * time.Millisecond); return nil }, wantRan: true, minRenew: 3},
		{name: "a lost lease cancels the step", fence: fenceSetup{term: 7, loseAfter: 2}, phase: "one",
			step: func(ctx context.Context) error {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(10 * time.Second):
					return errors.New("the step was not cancelled")
				}
			},
			wantErr: "the lease was lost during test phase one", wantFenced: true, wantRan: true, minRenew: 3},
		{name: "a renewal the store does not answer leaves the step running", fence: fenceSetup{term: 7, flaky: true}, phase: "one",
			step: func(context.Context) error { time.Sleep(80 * time.Millisecond); return nil }, wantRan: true, minRenew: 3},
		{name: "a step is bounded by its phase's deadline", fence: fenceSetup{term: 7}, phase: "two",
			step: func(ctx context.Context) error {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(10 * time.Second):
					return errors.New("the deadline did not cut the step")
				}
			},
			wantErr: "longer than its deadline of 200ms", wantRan: true},
		{name: "a step's own error is returned", fence: fenceSetup{term: 7}, phase: "one",
			step: func(context.Context) error { return errors.New("node unreachable") }, wantErr: "node unreachable", wantRan: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeFence{term: tt.fence.term, lost: tt.fence.lost, loseAfter: tt.fence.loseAfter, flaky: tt.fence.flaky}
			r := newRunner(f, &fakeRecords{})
			ran := false
			var gotTerm int64
			err := r.Do(t.Context(), testProc, &plan.Command{ID: "c1"}, tt.phase, func(ctx context.Context, term int64) error {
				ran, gotTerm = true, term
				return tt.step(ctx)
			})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Do: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Do: %v, want an error with %q", err, tt.wantErr)
			}
			if errors.Is(err, ErrFenced) != tt.wantFenced {
				t.Errorf("Do: %v; wraps ErrFenced = %v, want %v", err, errors.Is(err, ErrFenced), tt.wantFenced)
			}
			if ran != tt.wantRan {
				t.Errorf("step ran = %v, want %v", ran, tt.wantRan)
			}
			if ran && gotTerm != 7 {
				t.Errorf("step ran under term %d, want 7", gotTerm)
			}
			if got := f.Renewals(); got < tt.minRenew {
				t.Errorf("%d renewals, want at least %d", got, tt.minRenew)
			}
		})
	}
}

func TestRunnerRecord(t *testing.T) {
	status := func(phase string) spec.CommandStatus {
		return spec.CommandStatus{State: spec.CommandRunning, Restore: &spec.RestoreProgress{Phase: phase}}
	}
	tests := []struct {
		name      string
		lost      bool
		from, to  string
		wantErr   string
		wantCalls []string
	}{
		{name: "the first phase", from: "", to: "one", wantCalls: []string{"SetCommandStatus(c1, 3, running, one)"}},
		{name: "forward", from: "one", to: "three", wantCalls: []string{"SetCommandStatus(c1, 3, running, three)"}},
		{name: "the same phase again", from: "two", to: "two", wantCalls: []string{"SetCommandStatus(c1, 3, running, two)"}},
		{name: "never backwards", from: "three", to: "one", wantErr: `refusing to move from phase "three" to "one"`},
		{name: "never to an unknown phase", from: "one", to: "four", wantErr: `refusing to move from phase "one" to "four"`},
		{name: "a fenced driver records nothing", lost: true, from: "one", to: "two", wantErr: "no longer the driver"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &fakeRecords{}
			r := newRunner(&fakeFence{term: 3, lost: tt.lost}, rec)
			err := r.Record(t.Context(), testProc, "c1", tt.from, status(tt.to), tt.to, "")
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Record: %v, want error %q", err, tt.wantErr)
			}
			if !slices.Equal(rec.calls, tt.wantCalls) {
				t.Errorf("calls = %q, want %q", rec.calls, tt.wantCalls)
			}
		})
	}
}

func TestRunnerFinish(t *testing.T) {
	rec := &fakeRecords{}
	r := newRunner(&fakeFence{term: 3}, rec)
	if err := r.Finish(t.Context(), testProc, "c1"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"DeleteCommand(c1)"}; !slices.Equal(rec.calls, want) {
		t.Errorf("calls = %q, want %q", rec.calls, want)
	}
	rec = &fakeRecords{}
	r = newRunner(&fakeFence{term: 3, lost: true}, rec)
	if err := r.Finish(t.Context(), testProc, "c1"); !errors.Is(err, ErrFenced) {
		t.Errorf("Finish by a fenced driver: %v, want ErrFenced", err)
	}
	if len(rec.calls) != 0 {
		t.Errorf("a fenced driver wrote %q", rec.calls)
	}
}

// TestDefinitions checks that every procedure's phases are distinct and
// have deadlines.
func TestDefinitions(t *testing.T) {
	for _, d := range []Definition{Restore, DumpRestore, RecoverQuorum} {
		seen := map[string]bool{}
		for _, p := range d.Phases {
			if seen[p.Name] {
				t.Errorf("%s: phase %s twice", d.Name, p.Name)
			}
			seen[p.Name] = true
			if p.Deadline <= 0 {
				t.Errorf("%s: phase %s has no deadline", d.Name, p.Name)
			}
		}
	}
}

// A new driver first writes the status it adopts under its own term, then
// acts; one that already wrote under its term does not write it again.
func TestRunnerAdopts(t *testing.T) {
	running := func(term int64) *plan.Command {
		return &plan.Command{ID: "c1", Status: spec.CommandStatus{State: spec.CommandRunning, Term: term,
			Restore: &spec.RestoreProgress{Phase: "two"}}}
	}
	tests := []struct {
		name string
		c    *plan.Command
		want []string
	}{
		{"an earlier driver's status is adopted", running(4), []string{"SetCommandStatus(c1, 9, running, two)", "step"}},
		{"its own status is not written again", running(9), []string{"step"}},
		{"nothing to adopt before the first record", &plan.Command{ID: "c1", Status: spec.CommandStatus{State: spec.CommandPending}}, []string{"step"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &fakeRecords{}
			r := newRunner(&fakeFence{term: 9}, rec)
			if err := r.Do(t.Context(), testProc, tt.c, "two", func(context.Context, int64) error {
				rec.calls = append(rec.calls, "step")
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rec.calls, tt.want) {
				t.Errorf("calls = %q, want %q", rec.calls, tt.want)
			}
		})
	}
}

// The first choice stands: a later driver acts on it, not on its own.
func TestRunnerChoose(t *testing.T) {
	rec := &fakeRecords{}
	r := newRunner(&fakeFence{term: 5}, rec)
	got, err := r.Choose(t.Context(), "c1", spec.Choice{Survivor: "x"})
	if err != nil || got.Survivor != "x" || got.Term != 5 {
		t.Fatalf("first choice: %+v, %v", got, err)
	}
	r = newRunner(&fakeFence{term: 6}, rec)
	got, err = r.Choose(t.Context(), "c1", spec.Choice{Survivor: "y"})
	if err != nil || got.Survivor != "x" || got.Term != 5 {
		t.Fatalf("second choice: %+v, %v; want x of term 5", got, err)
	}
	r = newRunner(&fakeFence{term: 7, lost: true}, rec)
	if _, err := r.Choose(t.Context(), "c1", spec.Choice{Survivor: "z"}); !errors.Is(err, ErrFenced) {
		t.Fatalf("a fenced driver chose: %v", err)
	}
	if want := []string{"CreateChoice(c1, 5, x)", "CreateChoice(c1, 6, y)"}; !slices.Equal(rec.calls, want) {
		t.Errorf("calls = %q, want %q", rec.calls, want)
	}
}
