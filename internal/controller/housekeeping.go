package controller

import (
	"context"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Housekeeping keeps what accumulates bounded: copies of etcd data in the
// trash, scratch space in tmp/, and the records of agents gone for long.
const (
	housekeepingEvery = 10 * time.Minute
	// tmpMaxAge is how long scratch space may stay in tmp/; no backup or
	// restore takes that long.
	tmpMaxAge = 24 * time.Hour
	// recordMaxAge is how long the record of an agent not heard from stays
	// in the store's discovery/ prefix.
	recordMaxAge = 24 * time.Hour
)

// housekeeping runs every housekeepingEvery, from the loop.
func (lp *loop) housekeeping(ctx context.Context, s *store.Store, obs plan.Observed) {
	if lp.now().Sub(lp.lastHousekeeping) < housekeepingEvery {
		return
	}
	lp.lastHousekeeping = lp.now()
	lp.node.Tidy(lp.cfg.Trash, obs.Self.Healthy)
	if removed, err := lp.node.Layout().TidyTmp(lp.now(), tmpMaxAge); err != nil {
		lp.log.Warn("cannot tidy the tmp folder", "error", err)
	} else if len(removed) > 0 {
		lp.log.Info("removed scratch space left in tmp", "entries", removed)
	}
	if s != nil && obs.StoreErr == nil && (obs.Cluster != nil || obs.LockHeld) {
		gone, err := peer.PruneRecords(ctx, s, lp.now(), recordMaxAge)
		if err != nil {
			lp.log.Warn("cannot prune the records of agents gone long ago", "error", err)
		}
		if len(gone) > 0 {
			lp.log.Info("removed the records of agents not heard from in a day", "nodes", gone)
		}
		if n, err := s.PruneEvents(ctx, lp.now(), store.MaxEvents, store.EventMaxAge); err != nil {
			lp.log.Warn("cannot prune the event history", "error", err)
		} else if n > 0 {
			lp.log.Info("pruned the event history", "removed", n, "keep", store.MaxEvents, "max-age", store.EventMaxAge)
		}
	}
}
