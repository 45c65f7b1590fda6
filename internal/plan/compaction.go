package plan

import (
	"fmt"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// RevisionSample is etcd's head revision as seen at a time.
type RevisionSample struct {
	At  time.Time
	Rev int64
}

// CompactionInput is what a compaction decision rests on.
type CompactionInput struct {
	Policy spec.CompactionPolicy
	Now    time.Time
	// Head is etcd's revision now; Compacted the revision this agent last
	// compacted it to (0: not yet).
	Head, Compacted int64
	// Samples are head revisions seen, oldest first: a periodic policy
	// compacts to the newest at least Policy.Period old.
	Samples []RevisionSample
	// Capture is set when continuous capture runs: compaction keeps at or
	// below Captured+1, the last revision capture made durable in the
	// store (0: none known yet), unless capture has made no progress
	// since HeldSince for CaptureWait, or it is Stalled (no progress
	// since the last check) while the database's bytes in use (DBInUse)
	// reach QuotaShare of Quota.
	Capture     bool
	Captured    int64
	Stalled     bool
	HeldSince   time.Time
	CaptureWait time.Duration
	DBInUse     int64
	Quota       int64
	QuotaShare  float64
}

// CompactionDecision is a compaction decision.
type CompactionDecision struct {
	// Revision is the revision to compact to; 0 for none.
	Revision int64
	// Wanted is the revision the policy asks for.
	Wanted int64
	// Held is set when capture holds Wanted back.
	Held bool
	// Overtake says why compaction goes past capture, when it does.
	Overtake string
}

// PlanCompaction decides whether, and how far, to compact.
func PlanCompaction(in CompactionInput) CompactionDecision {
	var p CompactionDecision
	switch {
	case in.Policy.Period > 0:
		for _, s := range in.Samples {
			if s.At.After(in.Now.Add(-in.Policy.Period)) {
				break
			}
			p.Wanted = s.Rev
		}
	case in.Policy.Revisions > 0:
		p.Wanted = in.Head - in.Policy.Revisions
	}
	p.Wanted = min(p.Wanted, in.Head)
	if p.Wanted <= in.Compacted {
		return CompactionDecision{}
	}
	floor := in.Captured + 1
	if !in.Capture || p.Wanted <= floor {
		p.Revision = p.Wanted
		return p
	}
	p.Held = true
	switch {
	case in.Stalled && in.Quota > 0 && float64(in.DBInUse) >= in.QuotaShare*float64(in.Quota):
		p.Overtake = fmt.Sprintf("capture is stalled and the database's %d bytes in use reach %.0f%% of its %d-byte quota", in.DBInUse, 100*float64(in.DBInUse)/float64(in.Quota), in.Quota)
	case !in.HeldSince.IsZero() && in.Now.Sub(in.HeldSince) >= in.CaptureWait:
		p.Overtake = fmt.Sprintf("capture has made no progress for %s", in.Now.Sub(in.HeldSince).Round(time.Second))
	}
	if p.Overtake != "" {
		p.Revision = p.Wanted
		return p
	}
	if floor > in.Compacted && in.Captured > 0 {
		p.Revision = min(floor, in.Head)
	}
	return p
}
