// Package status is the status page: a read-only HTML page at /status on
// --metrics-address, in one screen, of what this agent knows: the members
// and the leader, the newest backup and the RPO, the procedure in
// progress, the leader's warnings, and the newest events of the cluster's
// history. No script and no external asset: it reloads itself every 10
// seconds. The loop builds a View of each observation; the page serves
// the last one.
package status
