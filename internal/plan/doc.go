// Package plan makes every decision of the control loop, and nothing
// else: Plan takes what one cycle observed and returns the actions to take,
// in order. It does no I/O, reads no clock and draws no random numbers, so
// the same observation always gives the same plan, and its table tests
// cover every rule.
//
// It imports only the standard library and package spec. What it sees
// (Observed, Node, Member, Command) and what it asks for (the Action types)
// are its own types; the controller fills the first from the store, the
// peers and etcd, and carries out the second.
package plan
