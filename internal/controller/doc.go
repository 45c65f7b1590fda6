// Package controller is the control loop. Each cycle it observes the
// store, its peers and etcd, asks the planner (package plan) what to do,
// and hands the actions, one at a time, to their executors: the membership
// and version steps to package membership, long operations to the
// procedure runner (package procedure), backups, maintenance, drills and
// capture to their packages, and the node's own steps to the node
// (package node). Each round is published as a Cycle. Package agent
// builds the node and hands the loop what the process holds (an Env:
// credentials, keys, the journal, what wakes it); the loop holds no agent.
//
// Leadership is etcd's: the agent beside etcd's raft leader leads while
// etcd has quorum. While it has none (first boot, a restore, a lost
// quorum), a lock in the store (package lease) picks the one agent that acts.
package controller
