package plan

import (
	"testing"
	"time"
)

func TestBackupDue(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name           string
		now, lastOK    time.Time
		failedRecently bool
		needsBase      bool
		want           bool
	}{
		{"never backed up", t0, time.Time{}, false, false, true},
		{"within the interval", t0.Add(59 * time.Minute), t0, false, false, false},
		{"an interval after the newest", t0.Add(time.Hour), t0, false, false, true},
		{"capture needs a base within the interval", t0.Add(time.Minute), t0, false, true, true},
		{"due, but the backoff runs", t0.Add(2 * time.Hour), t0, true, false, false},
		{"capture needs a base, but the backoff runs", t0.Add(time.Minute), t0, true, true, false},
	} {
		if got := BackupDue(c.now, c.lastOK, time.Hour, c.failedRecently, c.needsBase); got != c.want {
			t.Errorf("%s: BackupDue = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestHashCheckDue(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		now     time.Time
		every   time.Duration
		recheck bool
		want    bool
	}{
		{"off", t0.Add(24 * time.Hour), 0, false, false},
		{"off, but a recheck is asked for", t0, 0, true, true},
		{"within the interval", t0.Add(59 * time.Minute), time.Hour, false, false},
		{"an interval after the last", t0.Add(time.Hour), time.Hour, false, true},
		{"a recheck within the interval", t0.Add(time.Minute), time.Hour, true, true},
	} {
		if got := HashCheckDue(c.now, t0, c.every, c.recheck); got != c.want {
			t.Errorf("%s: HashCheckDue = %v, want %v", c.name, got, c.want)
		}
	}
}
