package backup

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrBadRetention means a --backup-retention value cannot be parsed.
var ErrBadRetention = errors.New("backup: invalid retention policy")

// tier keeps one backup per Bucket for backups younger than MaxAge.
type tier struct {
	MaxAge time.Duration
	Bucket time.Duration // zero keeps every backup
}

// Retention decides which backups to keep.
type Retention struct {
	name  string
	tiers []tier
	count int
}

const day = 24 * time.Hour

// ParseRetention parses a policy:
//
//	default      everything under 1h, hourly for 7d, daily for 90d
//	exponential  everything under 1h, hourly for 24h, daily for 7d, weekly for 4w
//	count:N      the N newest
func ParseRetention(s string) (Retention, error) {
	switch {
	case s == "" || s == "default":
		return Retention{name: "default", tiers: []tier{{time.Hour, 0}, {7 * day, time.Hour}, {90 * day, day}}}, nil
	case s == "exponential":
		return Retention{name: s, tiers: []tier{{time.Hour, 0}, {day, time.Hour}, {7 * day, day}, {28 * day, 7 * day}}}, nil
	case strings.HasPrefix(s, "count:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "count:"))
		if err != nil || n < 1 {
			return Retention{}, fmt.Errorf("%w %q: count:N needs N of at least 1", ErrBadRetention, s)
		}
		return Retention{name: s, count: n}, nil
	default:
		return Retention{}, fmt.Errorf("%w %q: use default, exponential or count:N", ErrBadRetention, s)
	}
}

// String is the policy as given.
func (r Retention) String() string { return r.name }

// Expired returns the backups the policy drops, given the backups (in any
// order), the time now and the names that must be kept whatever their age
// (such as one a queued restore names). The newest backup is always kept.
// It is pure.
func (r Retention) Expired(backups []Info, now time.Time, protected map[string]bool) []string {
	sorted := append([]Info(nil), backups...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name > sorted[j].Name }) // newest first
	var out []string
	seen := map[string]bool{} // tier/bucket keys already kept
	for i, b := range sorted {
		keep := i == 0 || protected[b.Name]
		if !keep && r.count > 0 {
			keep = i < r.count
		} else if !keep {
			age := now.Sub(time.Unix(int64(b.Meta.Timestamp), 0))
			for ti, t := range r.tiers {
				if age >= t.MaxAge {
					continue
				}
				if t.Bucket == 0 {
					keep = true
				} else {
					key := fmt.Sprintf("%d/%d", ti, time.Unix(int64(b.Meta.Timestamp), 0).UTC().Truncate(t.Bucket).Unix())
					// Newest first, so the first seen in a bucket is its newest.
					keep = !seen[key]
					seen[key] = true
				}
				break
			}
		}
		if !keep {
			out = append(out, b.Name)
		}
	}
	sort.Strings(out)
	return out
}

// Deleter is the part of the store pruning needs.
type Deleter interface {
	Delete(ctx context.Context, key string) error
}

// Remove deletes a backup: the meta first, so it stops being listed at
// once, then the data.
func Remove(ctx context.Context, s Deleter, name string) error {
	if err := s.Delete(ctx, name+"/"+MetaObject); err != nil {
		return fmt.Errorf("backup: delete %s: %w", name, err)
	}
	if err := s.Delete(ctx, name+"/"+DataObject); err != nil {
		return fmt.Errorf("backup: delete %s: %w", name, err)
	}
	return nil
}
