package spec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Compaction modes, with etcd's own names.
const (
	CompactionPeriodic = "periodic"
	CompactionRevision = "revision"
)

// DefaultCompactionRetention is the history a cluster keeps when its spec
// names no compaction policy: an hour, compacted by time.
const DefaultCompactionRetention = "1h"

// ErrInvalidCompaction is returned for a compaction policy that cannot
// work.
var ErrInvalidCompaction = errors.New("spec: invalid compaction policy")

// CompactionPolicy is how much history the cluster keeps: Period of time
// (periodic mode) or Revisions (revision mode). Both zero: the agent never
// compacts.
type CompactionPolicy struct {
	Period    time.Duration
	Revisions int64
}

// Off reports whether the policy never compacts.
func (p CompactionPolicy) Off() bool { return p.Period == 0 && p.Revisions == 0 }

func (p CompactionPolicy) String() string {
	switch {
	case p.Period > 0:
		return fmt.Sprintf("keep %s of history", shortDuration(p.Period))
	case p.Revisions > 0:
		return fmt.Sprintf("keep %d revisions", p.Revisions)
	}
	return "never compact"
}

// shortDuration writes 1h, not 1h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// maxRevisionRetention bounds a revision retention to something etcd can
// hold.
const maxRevisionRetention = 1 << 40

// ParseCompaction reads a policy the way etcd reads its
// --auto-compaction-mode and --auto-compaction-retention: periodic takes a
// duration ("30m", "72h") or a bare number of hours; revision takes a
// count. A retention of "0" turns compaction off. An empty mode is
// periodic, and an empty retention in periodic mode is
// DefaultCompactionRetention.
func ParseCompaction(mode, retention string) (CompactionPolicy, error) {
	retention = strings.TrimSpace(retention)
	switch mode {
	case "", CompactionPeriodic:
		if retention == "" {
			retention = DefaultCompactionRetention
		}
		if n, err := strconv.ParseInt(retention, 10, 64); err == nil {
			if n < 0 || n > 100_000 {
				return CompactionPolicy{}, fmt.Errorf("%w: periodic retention %q is out of range (hours from 0 to 100000)", ErrInvalidCompaction, retention)
			}
			return CompactionPolicy{Period: time.Duration(n) * time.Hour}, nil
		}
		d, err := time.ParseDuration(retention)
		if err != nil || d < 0 {
			return CompactionPolicy{}, fmt.Errorf("%w: periodic retention %q is neither a duration such as 30m or 72h nor a number of hours", ErrInvalidCompaction, retention)
		}
		if d > 0 && d < time.Second {
			return CompactionPolicy{}, fmt.Errorf("%w: periodic retention %s is under a second", ErrInvalidCompaction, d)
		}
		return CompactionPolicy{Period: d}, nil
	case CompactionRevision:
		if retention == "" {
			return CompactionPolicy{}, fmt.Errorf("%w: revision mode needs a retention, the number of revisions to keep", ErrInvalidCompaction)
		}
		n, err := strconv.ParseInt(retention, 10, 64)
		if err != nil || n < 0 || n > maxRevisionRetention {
			return CompactionPolicy{}, fmt.Errorf("%w: revision retention %q is not a count of revisions from 0 to %d", ErrInvalidCompaction, retention, int64(maxRevisionRetention))
		}
		return CompactionPolicy{Revisions: n}, nil
	default:
		return CompactionPolicy{}, fmt.Errorf("%w: mode %q is neither %s nor %s", ErrInvalidCompaction, mode, CompactionPeriodic, CompactionRevision)
	}
}

// Compaction is the spec's compaction policy, defaults filled in.
func (s ClusterSpec) Compaction() (CompactionPolicy, error) {
	return ParseCompaction(s.AutoCompactionMode, s.AutoCompactionRetention)
}

// compactionWarning is a warning for a policy that works but may hurt.
func compactionWarning(p CompactionPolicy) string {
	if p.Period > 0 && p.Period < 5*time.Minute {
		return fmt.Sprintf("compaction keeps only %s of history: a watcher that falls further behind (kube-apiserver's informers after a restart, say) must list everything again", p.Period)
	}
	if p.Revisions > 0 && p.Revisions < 1000 {
		return fmt.Sprintf("compaction keeps only %d revisions: a watcher that falls further behind must list everything again", p.Revisions)
	}
	return ""
}
