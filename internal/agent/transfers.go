package agent

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// transfers follows the backups this node downloads (a restore's, a
// restore's validation), one at a time, for the peer API's Info: the ctl
// shows each node's download as a restore waits on it. It is a
// backup.Meter.
type transfers struct {
	now func() time.Time
	mu  sync.Mutex
	cur *transfer
}

type transfer struct {
	what    string
	total   int64
	started time.Time
	done    atomic.Int64
}

// Begin starts following a download; the newest begun is the one shown.
func (t *transfers) Begin(what string, total int64) (add func(int64), end func()) {
	if t == nil {
		return func(int64) {}, func() {}
	}
	x := &transfer{what: what, total: total, started: t.now()}
	t.mu.Lock()
	t.cur = x
	t.mu.Unlock()
	return func(n int64) { x.done.Add(n) }, func() {
		t.mu.Lock()
		if t.cur == x {
			t.cur = nil
		}
		t.mu.Unlock()
	}
}

// Current is the download in progress, nil when none.
func (t *transfers) Current() *spec.Transfer {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	x := t.cur
	t.mu.Unlock()
	if x == nil {
		return nil
	}
	return &spec.Transfer{What: x.what, Done: x.done.Load(), Total: x.total, Started: spec.Int64(x.started.UnixNano())}
}
