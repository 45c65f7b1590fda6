package history

import (
	"context"
	"fmt"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
)

// NewestPoint is when the newest point a restore of timeline can reach
// was current: the newest backup's time, or, with captured changes
// (captured), when the last captured revision was observed if that is
// later. newest is the store's newest backup (nil: none); a zero time
// means nothing is restorable. When the captured runs cannot be read, it
// returns the backup's point with the error.
func NewestPoint(ctx context.Context, s changelog.Store, timeline string, newest *backup.Info, captured bool) (time.Time, error) {
	var point time.Time
	if newest != nil {
		point = time.Unix(int64(newest.Meta.Timestamp), 0)
	}
	if !captured || timeline == "" {
		return point, nil
	}
	runs, err := changelog.Runs(ctx, s, timeline)
	if err != nil {
		return point, fmt.Errorf("history: captured runs of %s: %w", timeline, err)
	}
	if len(runs) > 0 && runs[len(runs)-1].LastTime.After(point) {
		point = runs[len(runs)-1].LastTime
	}
	return point, nil
}
