// Package storeops holds the store operations that etcd-manager-ctl and
// the agents both carry out: the command queue and the backups as the
// rows people and the Kubernetes operator read, the checks a backup passes
// before a restore of it is queued, and the spec written with its owner.
// The agents do them for the operator (see package operatorapi), which
// holds no store credentials of its own.
package storeops
