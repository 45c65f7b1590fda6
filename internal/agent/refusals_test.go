package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

// The refusal log lets the first refusal of each host and reason through,
// then at most one a minute with the count left out.
func TestRefusalLog(t *testing.T) {
	type event struct {
		at             time.Duration // since the start
		host, reason   string
		wantLog        bool
		wantSuppressed int
	}
	tests := []struct {
		name   string
		events []event
	}{
		{"the first is logged, the rest of the minute counted", []event{
			{0, "10.0.0.1", "expired", true, 0},
			{time.Second, "10.0.0.1", "expired", false, 0},
			{30 * time.Second, "10.0.0.1", "expired", false, 0},
			{59 * time.Second, "10.0.0.1", "expired", false, 0},
			{time.Minute, "10.0.0.1", "expired", true, 3},
			{time.Minute + time.Second, "10.0.0.1", "expired", false, 0},
			{5 * time.Minute, "10.0.0.1", "expired", true, 1},
		}},
		{"another host or another reason is logged at once", []event{
			{0, "10.0.0.1", "expired", true, 0},
			{time.Second, "10.0.0.2", "expired", true, 0},
			{2 * time.Second, "10.0.0.1", "no certificate", true, 0},
			{3 * time.Second, "10.0.0.1", "expired", false, 0},
		}},
		{"a quiet pair starts again with nothing left out", []event{
			{0, "10.0.0.1", "expired", true, 0},
			{time.Hour, "10.0.0.1", "expired", true, 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			now := start
			l := newRefusalLog(time.Minute, 16, func() time.Time { return now })
			for i, e := range tt.events {
				now = start.Add(e.at)
				log, suppressed, pooled := l.allow(e.host, e.reason)
				if log != e.wantLog || suppressed != e.wantSuppressed || pooled {
					t.Errorf("event %d (%s %s at %s): log=%v suppressed=%d pooled=%v, want log=%v suppressed=%d",
						i, e.host, e.reason, e.at, log, suppressed, pooled, e.wantLog, e.wantSuppressed)
				}
			}
		})
	}
}

// A flood from many addresses cannot grow the log's memory without bound:
// past its size, new sources are pooled, logged at most once a minute
// with their count.
func TestRefusalLogIsBounded(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	const maxKeys = 64
	l := newRefusalLog(time.Minute, maxKeys, func() time.Time { return now })
	lines, pooledLines, pooledLeftOut := 0, 0, 0
	for i := range 100_000 {
		now = start.Add(time.Duration(i) * time.Millisecond) // 100 s in all
		log, _, pooled := l.allow(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), "no certificate")
		switch {
		case log && pooled:
			lines++
			pooledLines++
			pooledLeftOut = 0
		case log:
			lines++
		case pooled:
			pooledLeftOut++
		}
		if n := l.size(); n > maxKeys+1 {
			t.Fatalf("after %d sources the log remembers %d pairs, want at most %d", i+1, n, maxKeys+1)
		}
	}
	// The first sources on their own, then the pooled ones once a minute
	// (twice in 100 s), then, once the first are a minute old and make
	// room, as many again on their own.
	if pooledLines != 2 {
		t.Errorf("%d pooled lines over 100 s, want 2", pooledLines)
	}
	if lines > 2*maxKeys+2 {
		t.Errorf("%d lines for 100 000 refusals, want at most %d", lines, 2*maxKeys+2)
	}
	// The next pooled line counts every pooled refusal left out since the
	// last one.
	now = start.Add(time.Hour)
	for i := range 2 * maxKeys {
		log, suppressed, pooled := l.allow(fmt.Sprintf("192.168.0.%d", i), "no certificate")
		if pooled {
			if !log || suppressed != pooledLeftOut {
				t.Errorf("the next pooled refusal: log=%v suppressed=%d, want a line with the %d left out", log, suppressed, pooledLeftOut)
			}
			return
		}
	}
	t.Error("no refusal was pooled")
}

// The agent logs a refusal with the client's host (without the port) and
// the reason, and a repeat within the minute not at all.
func TestLogRefusal(t *testing.T) {
	rec := &logRecorder{}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := &Agent{log: slog.New(rec), now: func() time.Time { return now }}
	a.refusals = newRefusalLog(refusalLogInterval, refusalLogMaxKeys, a.now)
	reason := errors.New(`pki: certificate "x" expired at 2025-01-01T00:00:00Z`)
	for port := range 10 {
		a.logRefusal(&net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 40000 + port}, reason)
	}
	now = now.Add(refusalLogInterval)
	a.logRefusal(&net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 50000}, reason)
	a.logRefusal(nil, reason)
	lines := rec.find("peer API refused a connection")
	want := []string{
		"WARN remote=10.0.0.7 error=" + reason.Error() + " suppressed=0 suppressed-within=1m0s",
		"WARN remote=10.0.0.7 error=" + reason.Error() + " suppressed=9 suppressed-within=1m0s",
		"WARN remote=unknown error=" + reason.Error() + " suppressed=0 suppressed-within=1m0s",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
