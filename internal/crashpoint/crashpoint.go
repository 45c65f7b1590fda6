// Package crashpoint marks the agent's crash-consistency points: places
// where a crash must leave the store and the node's disk in a state the
// agent resumes from. The crash-safety tests name one point in the agent's
// environment and the agent kills itself there, as a power cut would.
package crashpoint

import (
	"log/slog"
	"os"
	"syscall"
)

// Env names the point (see Here) at which the agent kills itself. It
// exists for the crash-safety tests; production agents never set it.
const Env = "ETCD_MANAGER_TEST_CRASH_AT"

// Here SIGKILLs the agent when Env names this point. Its etcd dies with
// it (the child's parent-death signal). It returns only when Env names
// another point, or none.
func Here(log *slog.Logger, name string) {
	if os.Getenv(Env) != name {
		return
	}
	log.Error("test hook: crashing here", "point", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
