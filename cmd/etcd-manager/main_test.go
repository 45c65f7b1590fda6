package main

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestTuneCollector: the agents' collector settings apply unless the
// environment sets its own, which the runtime has already read.
func TestTuneCollector(t *testing.T) {
	tests := []struct {
		name          string
		env           map[string]string
		wantGCPercent int
		wantLimit     int64
	}{
		{name: "defaults", wantGCPercent: defaultGCPercent, wantLimit: defaultMemoryLimit},
		{name: "GOGC set", env: map[string]string{"GOGC": "80"}, wantGCPercent: 100, wantLimit: defaultMemoryLimit},
		{name: "GOMEMLIMIT set", env: map[string]string{"GOMEMLIMIT": "1GiB"}, wantGCPercent: defaultGCPercent, wantLimit: math.MaxInt64},
	}
	gc, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(gc); debug.SetMemoryLimit(limit) })
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("GOGC", "")
			t.Setenv("GOMEMLIMIT", "")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			// What the runtime would run with had the environment said nothing.
			debug.SetGCPercent(100)
			debug.SetMemoryLimit(math.MaxInt64)
			tuneCollector()
			if got := debug.SetGCPercent(100); got != tt.wantGCPercent {
				t.Errorf("GC percent %d, want %d", got, tt.wantGCPercent)
			}
			if got := debug.SetMemoryLimit(math.MaxInt64); got != tt.wantLimit {
				t.Errorf("memory limit %d, want %d", got, tt.wantLimit)
			}
		})
	}
}
