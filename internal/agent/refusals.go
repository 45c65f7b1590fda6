package agent

import (
	"net"
	"sync"
	"time"
)

// Refused handshakes on the peer API are logged through a refusalLog, so
// that a scanner, or a client with the wrong certificate retrying in a
// loop, cannot flood the log.
const (
	refusalLogInterval = time.Minute
	refusalLogMaxKeys  = 1024
)

// pooledHosts stands for the sources of refusals past refusalLogMaxKeys
// distinct (host, reason) pairs.
const pooledHosts = "(other hosts)"

// refusalLog decides which refusals are logged: the first of each (remote
// host, reason) at once, later ones at most once per interval, with the
// number left out since the last line. It remembers at most maxKeys
// pairs, forgetting those quiet for an interval when it needs room; past
// that, new pairs share one entry (pooledHosts, whatever the reason), so a
// flood from many addresses takes bounded memory and still shows. It is
// safe for concurrent use: handshakes run on the server's goroutines.
type refusalLog struct {
	interval time.Duration
	maxKeys  int
	now      func() time.Time

	mu   sync.Mutex
	seen map[refusalKey]*refusalCount
	// nextQuiet is when the next pair falls quiet, as of the last sweep:
	// until then a sweep would find nothing.
	nextQuiet time.Time
}

type refusalKey struct{ host, reason string }

type refusalCount struct {
	logged     time.Time // the last line; zero for none yet
	suppressed int       // refusals left out since
}

func newRefusalLog(interval time.Duration, maxKeys int, now func() time.Time) *refusalLog {
	return &refusalLog{interval: interval, maxKeys: maxKeys, now: now, seen: map[refusalKey]*refusalCount{}}
}

// allow records a refusal of host for reason and reports whether to log
// it now, how many refusals of the same pair were left out since the
// last line, and whether the pair was pooled with other hosts'.
func (l *refusalLog) allow(host, reason string) (log bool, suppressed int, pooled bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := refusalKey{host, reason}
	c, ok := l.seen[k]
	if !ok && len(l.seen) >= l.maxKeys {
		l.forgetQuiet(now)
		if len(l.seen) >= l.maxKeys {
			k, pooled = refusalKey{host: pooledHosts}, true
			c, ok = l.seen[k]
		}
	}
	if !ok {
		c = &refusalCount{}
		l.seen[k] = c
	}
	if !c.logged.IsZero() && now.Sub(c.logged) < l.interval {
		c.suppressed++
		return false, 0, pooled
	}
	suppressed = c.suppressed
	c.logged, c.suppressed = now, 0
	return true, suppressed, pooled
}

// forgetQuiet drops the pairs last logged an interval ago or more. What
// they left out since is carried into the pooled entry, to be counted in
// its next line.
func (l *refusalLog) forgetQuiet(now time.Time) {
	if now.Before(l.nextQuiet) {
		return
	}
	pooledKey := refusalKey{host: pooledHosts}
	carried := 0
	l.nextQuiet = time.Time{}
	for k, c := range l.seen {
		switch quiet := c.logged.Add(l.interval); {
		case k == pooledKey:
		case !now.Before(quiet):
			carried += c.suppressed
			delete(l.seen, k)
		case l.nextQuiet.IsZero() || quiet.Before(l.nextQuiet):
			l.nextQuiet = quiet
		}
	}
	if carried > 0 {
		p := l.seen[pooledKey]
		if p == nil {
			p = &refusalCount{}
			l.seen[pooledKey] = p
		}
		p.suppressed += carried
	}
}

// size is how many pairs it remembers.
func (l *refusalLog) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// remoteHost is the host of a client's address, without the port, which
// changes with each connection.
func remoteHost(a net.Addr) string {
	if a == nil {
		return "unknown"
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}
