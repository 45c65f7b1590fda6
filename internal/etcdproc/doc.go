// Package etcdproc runs the local etcd as a child process of the agent: it
// finds the binary for a version, starts, stops and restarts etcd with
// backoff, and keeps the node's local state under --data-dir.
package etcdproc
