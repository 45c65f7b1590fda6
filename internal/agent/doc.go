// Package agent is the composition root of etcd-manager's agents; only
// cmd/ imports it. It keeps the process's lifetime: it reads the
// configuration and the key files, locks the data dir, sets up TLS and
// renews the node certificate, serves the peer API (and the operator's
// calls on it) and the HTTP server (metrics, health, the status page,
// pprof), starts the child processes that read snapshots and data dirs,
// and pages the binary out after a busy spell. It builds the node (package
// node) and the control loop (package controller), and stops them in
// order. RunBackupAgent does the same for the backup-only agent.
package agent
