// Package backupjob is the job of taking a cluster's full backups for an
// agent: one at a time (backup.Take does the taking), retried with a
// backoff that doubles up to the backup interval, the failure recorded in
// the store for every agent to report, the backup-now command's status
// kept, and the retention policy applied after each backup, with the
// captured segments no kept backup reaches. When a backup is due is
// plan's to decide.
package backupjob
