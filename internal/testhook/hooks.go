//go:build testhooks

package testhook

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Enabled is set in binaries built with the testhooks tag.
const Enabled = true

// Here SIGKILLs the agent when Env names this point. Its etcd dies with
// it (the child's parent-death signal). It returns only when Env names
// another point, or none.
func Here(log *slog.Logger, name string) {
	point, claim, _ := strings.Cut(os.Getenv(Env), "@")
	if point != name || !claimed(claim) {
		return
	}
	log.Error("test hook: crashing here", "point", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// Pause stops the agent when PauseEnv names this point, and returns once
// it is resumed.
func Pause(log *slog.Logger, name string) {
	for _, entry := range strings.Split(os.Getenv(PauseEnv), ",") {
		point, claim, _ := strings.Cut(entry, "@")
		if point != name {
			continue
		}
		if !claimed(claim) {
			return // another process paused here already
		}
		log.Error("test hook: pausing here", "point", name, "pid", os.Getpid())
		// Signal this very thread: a process-directed SIGSTOP may let it
		// run on for a moment; one directed at the thread stops it before
		// it returns to this code, and the whole process with it.
		runtime.LockOSThread()
		_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
		runtime.UnlockOSThread()
		log.Warn("test hook: resumed", "point", name)
		return
	}
}

// claimed creates the claim file, if one is named, and reports whether
// this process did: the first to pass a point claims it.
func claimed(claim string) bool {
	if claim == "" {
		return true
	}
	f, err := os.OpenFile(claim, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false
	}
	fmt.Fprintf(f, "%d\n", os.Getpid())
	f.Close()
	return true
}

// clockReread is how often Clock reads ClockFileEnv's file again.
const clockReread = 100 * time.Millisecond

var clock struct {
	sync.Mutex
	offset time.Duration
	read   time.Time
}

// Offset is the duration ClockFileEnv's file holds now, 0 when the
// variable is not set or the file holds none.
func Offset() time.Duration {
	path := os.Getenv(ClockFileEnv)
	if path == "" {
		return 0
	}
	clock.Lock()
	defer clock.Unlock()
	if time.Since(clock.read) >= clockReread {
		clock.read = time.Now()
		clock.offset = 0
		if b, err := os.ReadFile(path); err == nil {
			if d, err := time.ParseDuration(strings.TrimSpace(string(b))); err == nil {
				clock.offset = d
			}
		}
	}
	return clock.offset
}

// Clock returns now with Offset added, or now itself when ClockFileEnv
// is not set.
func Clock(now func() time.Time) func() time.Time {
	if os.Getenv(ClockFileEnv) == "" {
		return now
	}
	return func() time.Time { return now().Add(Offset()) }
}
