package testhook

// Env names the point (see Here) at which the agent kills itself, as a
// power cut would. Env may be point@claim, as for PauseEnv: only the
// first process to create the claim file crashes, once.
const Env = "ETCD_MANAGER_TEST_CRASH_AT"

// PauseEnv names points at which the agent stops itself with SIGSTOP, as
// a long GC pause or a frozen VM would: a comma-separated list of
// point@claim. With a claim file, only the first process to create it
// pauses (once across all agents of a test); without one, every process
// pauses every time it passes the point. The test resumes the agent with
// SIGCONT.
const PauseEnv = "ETCD_MANAGER_TEST_PAUSE_AT"

// ClockFileEnv names a file holding a duration (as "-30s"; empty or
// absent: 0), read again at most every 100 ms, by which a test moves the
// agent's clock while it runs: Clock adds it to the capture's clock, and
// Offset to the clock the agent shows its peers and measures them and the
// store with. Leases keep the real clock.
const ClockFileEnv = "ETCD_MANAGER_TEST_CLOCK_FILE"
