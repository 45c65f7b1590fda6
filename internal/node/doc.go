// Package node is this machine's side of the cluster: the node's state
// under --data-dir, the etcd child it supervises, and what the node does
// when the leader tells it to (the peer API's calls: join, leave, restore,
// quarantine, recover, change version, serve new peer URLs).
//
// A Node never decides anything about the cluster; the leader's control
// loop does (package plan) and asks. Every change to the node's state is
// written durably before etcd is started on it, so a crash at any point
// leaves a state the node resumes from.
package node
