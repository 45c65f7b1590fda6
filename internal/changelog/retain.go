package changelog

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Retention. A point can be restored only from a full backup of its
// timeline at or before it, so segments are kept from each timeline's
// oldest kept backup on: every kept backup's successors stay reachable,
// and the segments before it, which nothing can reach, go.

// Pruned counts what Prune deleted.
type Pruned struct {
	Segments  int
	Timelines int
}

// Prune deletes the segments no kept backup can reach. floors maps each
// timeline that has kept backups to its oldest one's revision. A timeline
// not in it has no backup left: it loses every segment, but only once
// its newest segment was observed before before (the oldest kept
// backup's time), so that a current timeline, whose backups a listing
// missed, is never emptied. With no floors at all, nothing is deleted.
func Prune(ctx context.Context, s Store, floors map[string]int64, before time.Time) (Pruned, error) {
	var out Pruned
	if len(floors) == 0 {
		return out, nil
	}
	timelines, err := Timelines(ctx, s)
	if err != nil {
		return out, err
	}
	for _, t := range timelines {
		floor, kept := floors[t]
		refs, err := List(ctx, s, t)
		if err != nil {
			return out, err
		}
		if !kept && len(refs) > 0 {
			h, err := ReadHeaderAt(ctx, s, refs[len(refs)-1].Key)
			if err != nil || !time.Unix(0, h.LastTime).Before(before) {
				continue // recent, or unreadable: kept
			}
		}
		deleted := 0
		for _, r := range refs {
			if kept {
				if r.First > floor {
					break // sorted by first revision: the rest are needed
				}
				h, err := ReadHeaderAt(ctx, s, r.Key)
				if isNotFound(err) || errors.Is(err, ErrCorrupt) {
					continue // gone already; or unreadable, so kept for a person to look at
				}
				if err != nil {
					return out, err
				}
				if h.Last > floor {
					continue
				}
			}
			if err := s.Delete(ctx, r.Key); err != nil {
				return out, fmt.Errorf("changelog: prune %s: %w", r.Key, err)
			}
			deleted++
		}
		out.Segments += deleted
		if !kept && deleted > 0 {
			out.Timelines++
		}
	}
	return out, nil
}
