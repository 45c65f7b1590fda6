package main

import (
	"strings"
	"testing"
	"time"
)

// Progress on a terminal is one bar redrawn in place; for a log or a
// pipe it is a line now and then; both say the bytes, the share and the
// rate.
func TestMeterShowsProgress(t *testing.T) {
	start := time.Now().Add(-4 * time.Second)
	tests := []struct {
		name string
		tty  bool
		want []string
		not  []string
	}{
		{name: "a terminal", tty: true, want: []string{"\r[===============               ] fetch x: 12.0 MiB of 24.0 MiB (50%), ", "MiB/s\x1b[K"}, not: []string{"\n"}},
		{name: "a pipe", tty: false, want: []string{"fetch x: 12.0 MiB of 24.0 MiB (50%), ", "MiB/s\n"}, not: []string{"\r", "\x1b", "["}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			m := &meter{w: &b, tty: tt.tty, what: "fetch x", start: start, stop: make(chan struct{})}
			m.Set(12<<20, 24<<20)
			m.show()
			out := b.String()
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("%q lacks %q", out, w)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(out, n) {
					t.Errorf("%q has %q", out, n)
				}
			}
		})
	}
	// A meter on something that is no terminal writes lines, and ends
	// with where it stopped.
	var b strings.Builder
	barInterval, lineInterval = time.Millisecond, time.Millisecond
	defer func() { barInterval, lineInterval = 250*time.Millisecond, 5*time.Second }()
	m := startMeter(&b, "fetch y", 1<<20)
	m.Add(1 << 20)
	time.Sleep(20 * time.Millisecond)
	m.Finish()
	if out := b.String(); !strings.HasSuffix(out, "fetch y: 1.0 MiB of 1.0 MiB (100%)\n") || strings.Contains(out, "\r") {
		t.Errorf("meter on a buffer wrote %q", out)
	}
}
