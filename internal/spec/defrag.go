package spec

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// DefragPolicy says when the leader defragments members on its own. A
// member is due when the space defragmenting would give back (its
// database size less the size in use) is at least MinReclaimableBytes,
// and either at least MinReclaimableFraction of the database or the
// database is at QuotaPercent of the backend quota or more. With a
// Window (cron syntax, in UTC), it runs only within WindowDuration of a
// time the window names.
type DefragPolicy struct {
	Off                    bool    `json:"off,omitempty"`
	MinReclaimableBytes    int64   `json:"minReclaimableBytes,omitempty"`
	MinReclaimableFraction float64 `json:"minReclaimableFraction,omitempty"`
	QuotaPercent           int     `json:"quotaPercent,omitempty"`
	Window                 string  `json:"window,omitempty"`
	WindowDuration         string  `json:"windowDuration,omitempty"`
}

// The defaults of a DefragPolicy's unset fields.
const (
	DefaultDefragMinReclaimableBytes    = 64 << 20
	DefaultDefragMinReclaimableFraction = 0.5
	DefaultDefragQuotaPercent           = 80
	DefaultDefragWindowDuration         = time.Hour
	// DefaultQuotaBytes is etcd's backend quota when none is set.
	DefaultQuotaBytes = 2 << 30
)

// Effective fills in the defaults; p may be nil.
func (p *DefragPolicy) Effective() DefragPolicy {
	var e DefragPolicy
	if p != nil {
		e = *p
	}
	if e.MinReclaimableBytes == 0 {
		e.MinReclaimableBytes = DefaultDefragMinReclaimableBytes
	}
	if e.MinReclaimableFraction == 0 {
		e.MinReclaimableFraction = DefaultDefragMinReclaimableFraction
	}
	if e.QuotaPercent == 0 {
		e.QuotaPercent = DefaultDefragQuotaPercent
	}
	if e.Window != "" && e.WindowDuration == "" {
		e.WindowDuration = DefaultDefragWindowDuration.String()
	}
	return e
}

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Validate checks the policy.
func (p DefragPolicy) Validate() error {
	switch {
	case p.MinReclaimableBytes < 0:
		return fmt.Errorf("spec: defrag: --defrag-min-reclaimable-bytes %d is negative", p.MinReclaimableBytes)
	case p.MinReclaimableFraction < 0 || p.MinReclaimableFraction > 1:
		return fmt.Errorf("spec: defrag: --defrag-min-reclaimable-fraction %v is not between 0 and 1", p.MinReclaimableFraction)
	case p.QuotaPercent < 0 || p.QuotaPercent > 100:
		return fmt.Errorf("spec: defrag: --defrag-quota-percent %d is not between 0 and 100", p.QuotaPercent)
	}
	if p.Window != "" {
		// A time zone prefix would move the window out of UTC, and the
		// cron parser panics on some malformed ones.
		if w := strings.ToUpper(strings.TrimSpace(p.Window)); strings.HasPrefix(w, "TZ=") || strings.HasPrefix(w, "CRON_TZ=") {
			return fmt.Errorf("spec: defrag: --defrag-window %q: no time zone; the window is in UTC", p.Window)
		}
		if len(p.Window) > 100 {
			return fmt.Errorf("spec: defrag: --defrag-window is %d bytes long", len(p.Window))
		}
		if _, err := cronParser.Parse(p.Window); err != nil {
			return fmt.Errorf("spec: defrag: --defrag-window %q: %w", p.Window, err)
		}
	}
	if p.WindowDuration != "" {
		d, err := time.ParseDuration(p.WindowDuration)
		if err != nil || d < time.Minute || d > 7*24*time.Hour {
			return fmt.Errorf("spec: defrag: --defrag-window-duration %q: want a duration from 1m to 168h", p.WindowDuration)
		}
	}
	return nil
}

// Open reports whether the window lets defragmentation run at now: with
// no window, always; else within WindowDuration after a time the window
// names.
func (p DefragPolicy) Open(now time.Time) bool {
	e := p.Effective()
	if e.Window == "" {
		return true
	}
	if e.Validate() != nil {
		return false
	}
	sched, err := cronParser.Parse(e.Window)
	if err != nil {
		return false
	}
	d, err := time.ParseDuration(e.WindowDuration)
	if err != nil {
		return false
	}
	now = now.UTC()
	// The last start at or before now is the first after now-d, if that
	// is not after now.
	start := sched.Next(now.Add(-d).Add(-time.Second))
	return !start.After(now)
}

// DefragDue says why a member with a database of dbSize bytes, inUse of
// them in use, is due for defragmentation under p with quota (0: etcd's
// default), or "" when it is not.
func (p DefragPolicy) DefragDue(dbSize, inUse, quota int64) string {
	e := p.Effective()
	if quota <= 0 {
		quota = DefaultQuotaBytes
	}
	free := dbSize - inUse
	if dbSize <= 0 || inUse <= 0 || free < e.MinReclaimableBytes {
		return ""
	}
	if float64(free) >= e.MinReclaimableFraction*float64(dbSize) {
		return fmt.Sprintf("%d of its %d bytes are free (at least %.0f%%)", free, dbSize, 100*e.MinReclaimableFraction)
	}
	if dbSize*100 >= int64(e.QuotaPercent)*quota {
		return fmt.Sprintf("its %d bytes are %d%% or more of the quota (%d), %d of them free", dbSize, e.QuotaPercent, quota, free)
	}
	return ""
}

// String renders the policy, defaults filled in.
func (p DefragPolicy) String() string {
	if p.Off {
		return "off"
	}
	e := p.Effective()
	out := fmt.Sprintf("when %d bytes or more are free and %.0f%% of the database, or it is at %d%% of the quota", e.MinReclaimableBytes, 100*e.MinReclaimableFraction, e.QuotaPercent)
	if e.Window != "" {
		out += fmt.Sprintf("; within %s of %q (UTC)", e.WindowDuration, e.Window)
	}
	return out
}
