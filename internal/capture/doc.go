// Package capture runs continuous capture on a node (package changelog
// holds the format and the reads): it ships the spool to the store
// always, so that a former leader's segments still land, captures its own
// etcd's changes while the loop says it leads, merges the timeline's
// segments meanwhile, and waits for a full backup to start a run from
// when it has none. The managing agent's loop and the backup-only agent
// both drive it.
package capture
