// Package procedure runs the operations that take longer than one cycle
// of the control loop and must survive the crash, pause or replacement of
// the agent that drives them: restore, dump-restore and recover-quorum
// today; every new long operation is written as a procedure from the
// start.
//
// A procedure is a named list of phases. The planner (package plan)
// decides, each cycle and from what it observes, which idempotent step of
// the current phase to take next, or that the phase is done. The Runner
// carries the step out under the driver's fence:
//
//   - it checks, before acting, that the driver still holds its term, and
//     refuses to act (ErrFenced) when it does not;
//   - it renews the driver's lease while a step runs, and cancels the step
//     the moment the lease cannot be renewed;
//   - it bounds every step by its phase's deadline;
//   - it records a phase in the store before anything of that phase acts,
//     so whichever agent drives next resumes exactly there;
//   - it reports the phase in progress to metrics.
//
// The steps themselves (restore.go, recover.go) take narrow interfaces:
// the nodes they call and the backups they take.
package procedure
