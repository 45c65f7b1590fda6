package agent

import (
	"os"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
)

// VerifySnapshotCommand is the etcd-manager subcommand that verifies a
// snapshot in a child process (see backup.VerifyCommand).
const VerifySnapshotCommand = "verify-snapshot"

// StatusOnlyFlag makes VerifySnapshotCommand only read the snapshot's
// status, for a copy whose sha256 trailer was checked as it streamed.
const StatusOnlyFlag = "status-only"

// childStatusReader reads snapshots' status in a child etcd-manager, so
// that the agent's own memory does not grow with the database it maps to
// read. Backups and fetches check the sha256 trailer as the snapshot
// streams, so the child only reads the status.
func childStatusReader() backup.VerifyFunc {
	exe, err := os.Executable()
	if err != nil {
		return nil // read in process
	}
	return backup.VerifyCommand(exe, VerifySnapshotCommand, "--"+StatusOnlyFlag)
}

// RevisionOnlyFlag has the VerifySnapshotCommand child only print the
// snapshot's revision (backup.ReadRevision).
const RevisionOnlyFlag = "revision-only"

// childRevisionReader reads a backup's revision in a child etcd-manager,
// so that the member hashes it while the status is read: bbolt may crash
// on a damaged file, and the agent must not.
func childRevisionReader() backup.RevisionFunc {
	exe, err := os.Executable()
	if err != nil {
		return nil // the HashKV waits for the status
	}
	return backup.RevisionCommand(exe, VerifySnapshotCommand, "--"+RevisionOnlyFlag)
}

// CheckDataCommand is the etcd-manager subcommand that checks a
// member's database in a child process (see etcdproc.CheckDataCommand).
const CheckDataCommand = "check-data"

// childDataChecker checks a member's database in a child etcd-manager:
// bbolt may crash on a damaged file, and the agent must not.
func childDataChecker() etcdproc.DataChecker {
	exe, err := os.Executable()
	if err != nil {
		return nil // check in process
	}
	return etcdproc.CheckDataCommand(exe, CheckDataCommand)
}

// CompactDBCommand is the etcd-manager subcommand that defragments a
// member's database offline in a child process (see
// etcdproc.CompactDBCommand).
const CompactDBCommand = "compact-db"

// childCompactor copies a member's database for an isolated
// defragmentation in a child etcd-manager, which the leader can stop
// midway and whose crash on a damaged file is not the agent's.
func childCompactor() etcdproc.Compactor {
	exe, err := os.Executable()
	if err != nil {
		return nil // copy in process
	}
	return etcdproc.CompactDBCommand(exe, CompactDBCommand)
}

// readers are the child processes that read snapshots for the loop and
// the backup-only agent.
func readers() backupjob.Readers {
	return backupjob.Readers{Status: childStatusReader(), Revision: childRevisionReader()}
}
