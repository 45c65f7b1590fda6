package harness

import (
	"context"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// CapturedAt is the last revision continuous capture put into the store,
// on any timeline, and when capture observed it; 0 when there is none.
func CapturedAt(ctx context.Context, s *store.Store) (int64, time.Time) {
	tls, err := changelog.Timelines(ctx, s)
	if err != nil {
		return 0, time.Time{}
	}
	var last int64
	var at time.Time
	for _, tl := range tls {
		if runs, err := changelog.Runs(ctx, s, tl); err == nil && len(runs) > 0 && runs[len(runs)-1].Last > last {
			last, at = runs[len(runs)-1].Last, runs[len(runs)-1].LastTime
		}
	}
	return last, at
}

// CapturedTo is CapturedAt's revision.
func CapturedTo(ctx context.Context, s *store.Store) int64 {
	rev, _ := CapturedAt(ctx, s)
	return rev
}
