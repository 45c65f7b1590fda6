package controller

import (
	"context"
	"errors"
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
			probes := map[string]memberProbe{}
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
