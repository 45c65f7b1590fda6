package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestWatchOthers: the watch stops an isolated defragmentation only when
// one member fails defragWatchMisses status reads in a row, and names it.
func TestWatchOthers(t *testing.T) {
	down := errors.New("connection refused")
	// Each probe answers from its script, one entry per read, then the
	// last entry for good.
	tests := []struct {
		name     string
		scripts  map[string][]error
		wantStop string // the member named in the cause; "" for no stop
	}{
		{name: "every member answers", scripts: map[string][]error{"a": {nil}, "b": {nil}}},
		{name: "a miss then an answer, again and again", scripts: map[string][]error{"a": {nil}, "b": {down, nil, down, nil, down, nil, down, nil, down, nil, nil}}},
		{name: "one member gone", scripts: map[string][]error{"a": {nil}, "b": {nil, nil, down}}, wantStop: "b"},
		{name: "a member gone from the start", scripts: map[string][]error{"a": {down}, "b": {nil}}, wantStop: "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			reads := map[string]int{}
			probes := map[string]Probe{}
			for name, script := range tt.scripts {
				probes[name] = func(context.Context) error {
					mu.Lock()
					defer mu.Unlock()
					i := min(reads[name], len(script)-1)
					reads[name]++
					return script[i]
				}
			}
			// Long enough for every script to play out several times over.
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			wctx, stop := context.WithCancelCause(ctx)
			defer stop(nil)
			watchOthers(wctx, probes, 5*time.Millisecond, stop)
			cause := context.Cause(wctx)
			if tt.wantStop == "" {
				if !errors.Is(cause, context.DeadlineExceeded) {
					t.Errorf("the watch ended with %v; want it to run until its context ended", cause)
				}
				mu.Lock()
				defer mu.Unlock()
				for name := range tt.scripts {
					if reads[name] < 10 {
						t.Errorf("member %s was read %d times in 300ms at a 5ms interval", name, reads[name])
					}
				}
				return
			}
			if !errors.Is(cause, errClusterDegraded) {
				t.Fatalf("the watch ended with %v; want a stop for a degraded cluster", cause)
			}
			if !strings.Contains(cause.Error(), "member "+tt.wantStop+" ") || !errors.Is(cause, down) {
				t.Errorf("the stop says %q; want it to name member %s and its error", cause, tt.wantStop)
			}
		})
	}
}

// TestIsolatedDefragStops checks that a node goes to defragmentation in
// place after maxDefragStops isolated ones in a row were stopped, and
// only then.
func TestIsolatedDefragStops(t *testing.T) {
	degraded := fmt.Errorf("member b: %w", errClusterDegraded)
	tests := []struct {
		name    string
		events  []string // "stop <node>" or "done <node>"
		inPlace []string // nodes defragmented in place afterwards
		counts  map[string]int
	}{
		{"two stops", []string{"stop a", "stop a"}, nil, map[string]int{"a": 2}},
		{"three stops", []string{"stop a", "stop a", "stop a"}, []string{"a"}, map[string]int{}},
		{"a success between", []string{"stop a", "stop a", "done a", "stop a", "stop a"}, nil, map[string]int{"a": 2}},
		{"nodes counted apart", []string{"stop a", "stop b", "stop a", "stop b", "stop a"}, []string{"a"}, map[string]int{"b": 2}},
		{"counted afresh after", []string{"stop a", "stop a", "stop a", "stop a"}, []string{"a"}, map[string]int{"a": 1}},
		{"another node's success", []string{"stop a", "stop a", "done b", "stop a"}, []string{"a"}, map[string]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
			d := &Defragger{log: slog.New(slog.DiscardHandler), now: func() time.Time { return now }}
			for _, e := range tt.events {
				verb, node, _ := strings.Cut(e, " ")
				if verb == "stop" {
					d.isolatedStopped(node, degraded)
				} else {
					d.isolatedDone(node)
				}
			}
			var inPlace []string
			for node, at := range d.failed {
				if !at.Equal(now) {
					t.Errorf("node %s in place since %v, want %v", node, at, now)
				}
				inPlace = append(inPlace, node)
			}
			slices.Sort(inPlace)
			if !slices.Equal(inPlace, tt.inPlace) {
				t.Errorf("in place: %v, want %v", inPlace, tt.inPlace)
			}
			counts := d.stops
			if counts == nil {
				counts = map[string]int{}
			}
			if !maps.Equal(counts, tt.counts) {
				t.Errorf("stops in a row: %v, want %v", counts, tt.counts)
			}
		})
	}
}
