// Package backupagent is the backup-only agent, for an etcd that
// etcd-manager does not manage: it backs the etcd up on a schedule and on
// demand (backup-now), verified, with retention and continuous capture, in
// the store format the managing agent writes. Of several backup agents on
// one store, the holder of the store lock backs up. Package agent runs it
// and serves its metrics.
package backupagent
