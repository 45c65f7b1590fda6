package history

import (
	"context"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
)

// Range is what a restore can reach on one timeline.
type Range struct {
	Timeline string `json:"timeline"`
	// Earliest is the oldest full backup's point; Latest the last
	// captured revision, or the newest backup's when it is later.
	EarliestRevision int64     `json:"earliestRevision"`
	EarliestTime     time.Time `json:"earliestTime"`
	LatestRevision   int64     `json:"latestRevision"`
	LatestTime       time.Time `json:"latestTime"`
	Backups          int       `json:"backups"`
	// Branch says where a restore started the timeline from another.
	Branch *changelog.Branch `json:"branch,omitempty"`
	// BranchError says why the branch record cannot be read.
	BranchError string `json:"branchError,omitempty"`
	Runs        []Run  `json:"runs"`
	// Restorable are the stretches of revisions the kept backups reach
	// through the runs; Gaps the holes between them.
	Restorable []changelog.Span `json:"restorable"`
	Gaps       []changelog.Gap  `json:"gaps"`
}

// Run is one captured run of a timeline.
type Run struct {
	Base      string    `json:"base,omitempty"`
	First     int64     `json:"first"`
	Last      int64     `json:"last"`
	FirstTime time.Time `json:"firstTime"`
	LastTime  time.Time `json:"lastTime"`
}

// Ranges reads every timeline's restorable range: the timelines of
// the backups, oldest first, then those with captured changes only.
func Ranges(ctx context.Context, s Store) ([]Range, error) {
	infos, err := backup.List(ctx, s)
	if err != nil {
		return nil, err
	}
	tls, err := changelog.Timelines(ctx, s)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var order []string
	for _, in := range infos {
		if t := in.Meta.ClusterToken; t != "" && !seen[t] {
			seen[t] = true
			order = append(order, t)
		}
	}
	for _, t := range tls {
		if !seen[t] {
			seen[t] = true
			order = append(order, t)
		}
	}
	var out []Range
	for _, t := range order {
		r := Range{Timeline: t, Runs: []Run{}, Restorable: []changelog.Span{}, Gaps: []changelog.Gap{}}
		if b, ok, err := changelog.ReadBranch(ctx, s, t); err != nil {
			r.BranchError = err.Error()
		} else if ok {
			r.Branch = &b
		}
		var revs []int64
		at := map[int64]time.Time{} // when each reachable end held
		for _, in := range infos {
			if in.Meta.ClusterToken != t {
				continue
			}
			rev := changelog.SnapshotRevision(in.Meta.Revision)
			if r.Backups == 0 {
				r.EarliestRevision, r.EarliestTime = rev, in.Meta.PointTime().UTC()
			}
			revs = append(revs, rev)
			at[rev] = in.Meta.PointTime().UTC()
			r.Backups++
		}
		runs, err := changelog.Runs(ctx, s, t)
		if err != nil {
			return nil, err
		}
		for _, run := range runs {
			row := Run{First: run.First, Last: run.Last, FirstTime: run.FirstTime.UTC(), LastTime: run.LastTime.UTC()}
			if run.Base != nil {
				row.Base = run.Base.Backup
			}
			r.Runs = append(r.Runs, row)
			at[run.Last] = run.LastTime.UTC()
		}
		// What the kept backups reach, not what the runs hold: a run
		// whose base backup retention removed is reachable only from a
		// kept backup inside it.
		if spans := changelog.Reachable(runs, revs); spans != nil {
			r.Restorable = spans
		}
		if n := len(r.Restorable); n > 0 {
			r.LatestRevision = r.Restorable[n-1].To
			r.LatestTime = at[r.LatestRevision]
		}
		r.Gaps = append(r.Gaps, changelog.Holes(r.Restorable)...)
		out = append(out, r)
	}
	return out, nil
}
