package plan

import "time"

// BackupDue reports whether a full backup is due: the periodic one, an
// interval after the newest stored (lastOK), or one continuous capture
// needs to start a run from (needsBase); neither while the backoff after
// a failed attempt runs.
func BackupDue(now, lastOK time.Time, interval time.Duration, failedRecently, needsBase bool) bool {
	if failedRecently {
		return false
	}
	return needsBase || now.Sub(lastOK) >= interval
}

// HashCheckDue reports whether the leader compares the members' HashKV:
// every interval after the last comparison (never with a zero interval),
// or at once when recheck asks for it.
func HashCheckDue(now, last time.Time, every time.Duration, recheck bool) bool {
	return recheck || every > 0 && now.Sub(last) >= every
}
