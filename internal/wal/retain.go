package wal

import (
	"context"
	"errors"
	"fmt"
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
// timeline that has kept backups to its oldest one's revision; a timeline
// not in it has no backup left and loses every segment. With no floors
// at all (no backup records its timeline), nothing is deleted.
func Prune(ctx context.Context, s Store, floors map[string]int64) (Pruned, error) {
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
				return out, fmt.Errorf("wal: prune %s: %w", r.Key, err)
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
