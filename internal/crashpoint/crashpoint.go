// Package crashpoint marks the agent's crash-consistency points: places
// where a crash must leave the store and the node's disk in a state the
// agent resumes from. The crash-safety tests name one point in the agent's
// environment and the agent kills itself there, as a power cut would.
package crashpoint

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"syscall"
)

// Env names the point (see Here) at which the agent kills itself. It
// exists for the crash-safety tests; production agents never set it.
const Env = "ETCD_MANAGER_TEST_CRASH_AT"

// Here SIGKILLs the agent when Env names this point. Its etcd dies with
// it (the child's parent-death signal). It returns only when Env names
// another point, or none. Env may be point@claim, as for PauseEnv: only
// the first process to create the claim file crashes, once.
func Here(log *slog.Logger, name string) {
	point, claim, _ := strings.Cut(os.Getenv(Env), "@")
	if point != name || !claimed(claim) {
		return
	}
	log.Error("test hook: crashing here", "point", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// PauseEnv names points at which the agent stops itself with SIGSTOP, as
// a long GC pause or a frozen VM would, for the tests of fencing: a
// comma-separated list of point@claim. With a claim file, only the first
// process to create it pauses (once across all agents of a test); without
// one, every process pauses every time it passes the point. The test
// resumes the agent with SIGCONT.
const PauseEnv = "ETCD_MANAGER_TEST_PAUSE_AT"

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
