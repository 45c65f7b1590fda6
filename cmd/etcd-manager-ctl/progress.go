package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Progress intervals: a terminal's bar is redrawn often, in place; lines
// for a log or a pipe come seldom.
var (
	barInterval  = 250 * time.Millisecond
	lineInterval = 5 * time.Second
)

// meter shows the progress of a long transfer of a known size: on a
// terminal, one bar redrawn in place; otherwise a line now and then, for
// a log. Its counter is safe to add to from any goroutine.
type meter struct {
	w     io.Writer
	tty   bool
	what  string
	total atomic.Int64
	done  atomic.Int64
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
}

// startMeter starts showing the progress of what, of total bytes (0:
// unknown), on w, until Finish.
func startMeter(w io.Writer, what string, total int64) *meter {
	return startMeterAt(w, what, total, time.Now())
}

// startMeterAt is startMeter for a transfer that began at start, as
// another process reports it (see Set).
func startMeterAt(w io.Writer, what string, total int64, start time.Time) *meter {
	m := &meter{w: w, what: what, start: start, stop: make(chan struct{})}
	m.total.Store(total)
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		m.tty = true
	}
	interval := lineInterval
	if m.tty {
		interval = barInterval
	}
	m.wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-tick.C:
				m.show()
			}
		}
	})
	return m
}

// Add counts n more bytes done.
func (m *meter) Add(n int64) { m.done.Add(n) }

// Set says how far a transfer another process reports has gone.
func (m *meter) Set(done, total int64) {
	m.done.Store(done)
	m.total.Store(total)
}

// Finish stops the meter and shows where it ended.
func (m *meter) Finish() {
	close(m.stop)
	m.wg.Wait()
	m.show()
	if m.tty {
		fmt.Fprintln(m.w)
	}
}

// show prints the progress once.
func (m *meter) show() {
	done, total := m.done.Load(), m.total.Load()
	line := describeTransfer(spec.Transfer{What: m.what, Done: done, Total: total, Started: spec.Int64(m.start.UnixNano())}, time.Now())
	if !m.tty {
		fmt.Fprintln(m.w, line)
		return
	}
	const width = 30
	bar := ""
	if total > 0 {
		n := int(min(done*width/total, width))
		bar = "[" + strings.Repeat("=", n) + strings.Repeat(" ", width-n) + "] "
	}
	// \r and a clear to the end of the line redraw it in place.
	fmt.Fprintf(m.w, "\r%s%s\x1b[K", bar, line)
}

// meteredReader counts what is read through it on a meter.
type meteredReader struct {
	io.ReadCloser
	m *meter
}

func (r meteredReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.m.Add(int64(n))
	return n, err
}
