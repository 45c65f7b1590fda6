package plan

import (
	"fmt"
	"log/slog"
	"sort"
)

// Quota alarms. When a member's database reaches the backend quota,
// etcd raises its NOSPACE alarm and takes no more writes until the alarm
// is disarmed. The leader compacts to the head (availability wins over
// continuous capture, which restarts after a full backup), defragments
// the members with space to give back, one at a time and never the
// leader in place, and disarms the alarm only once every database is
// well below the quota, so that it does not flap. When live data fills
// the quota, no compaction helps: it says so, and which setting to raise.

// RecoverSpace compacts etcd to its head revision: the first step after
// a NOSPACE alarm.
type RecoverSpace struct{ Reason string }

func (a RecoverSpace) String() string { return "recover-space (" + a.Reason + ")" }
func (RecoverSpace) Mutates() bool    { return true }

// DisarmNoSpace disarms the NOSPACE alarms: writes are taken again.
type DisarmNoSpace struct{ Reason string }

func (a DisarmNoSpace) String() string { return "disarm-nospace (" + a.Reason + ")" }
func (DisarmNoSpace) Mutates() bool    { return true }

// spaceHeadroom is the share of the quota every database must be under
// before the alarm is disarmed.
const spaceHeadroom = 0.8

// spaceFreeFloor is the free space worth a defragmentation under a
// NOSPACE alarm: at least this, and a tenth of the database (a database
// just defragmented has a little free space still, and must not be
// defragmented again and again).
const spaceFreeFloor = 1 << 20

// planSpace returns the next step while etcd's NOSPACE alarm is raised.
func planSpace(o Observed) []Action {
	if o.Cluster == nil || len(o.Cluster.NoSpace) == 0 {
		return nil
	}
	quota := o.Spec.QuotaBytes()
	if !o.SpaceCompacted {
		return []Action{RecoverSpace{Reason: fmt.Sprintf("NOSPACE alarm on %d member(s): compact to the head", len(o.Cluster.NoSpace))}}
	}
	ms := votingMembers(o)
	var largest int64
	for _, x := range ms {
		largest = max(largest, x.m.DBSize)
	}
	live := liveBytes(ms)
	worthIt := func(x memberNode) bool {
		return x.m.Healthy && live > 0 && x.m.DBSize-live >= max(spaceFreeFloor, x.m.DBSize/10)
	}
	if x := followerFirst(ms, o.Self.ID, worthIt); x != nil {
		if x.n.ID == o.Self.ID && len(ms) > 1 {
			to := handOnTo(ms, o.Self.ID)
			if to == nil {
				return []Action{Report{Level: slog.LevelWarn, Msg: "NOSPACE: the leader's member needs defragmenting, but no other member is healthy to take the lead"}}
			}
			return []Action{MoveLeader{To: to.m.ID, Reason: "before defragmenting the leader's member (NOSPACE)"}}
		}
		if len(x.m.ClientURLs) > 0 {
			return []Action{DefragMember{NodeID: x.n.ID, MemberID: x.m.ID, ClientURL: x.m.ClientURLs[0],
				Reason: fmt.Sprintf("NOSPACE: %d of its %d bytes are free", x.m.DBSize-live, x.m.DBSize)}}
		}
	}
	for _, x := range ms {
		if !x.n.Member.Settings.Equal(o.Spec.EtcdSettings) {
			// A change of quota is rolling out: disarm once every member
			// runs it, or the alarm comes straight back.
			return []Action{Report{Level: slog.LevelInfo, Msg: "NOSPACE: the alarm stays until every member runs the spec's etcd settings", Attrs: []any{"node", x.n.ID}}}
		}
	}
	if largest > 0 && float64(largest) <= spaceHeadroom*float64(quota) {
		return []Action{DisarmNoSpace{Reason: fmt.Sprintf("every database is at most %d bytes, under %.0f%% of the %d-byte quota", largest, 100*spaceHeadroom, quota)}}
	}
	return []Action{Report{Level: slog.LevelError,
		Msg:   "NOSPACE: live data fills the backend quota, and compaction and defragmentation cannot help; etcd takes no writes until the quota is raised with etcd-manager-ctl --quota-backend-bytes=N configure-cluster, or data is deleted",
		Attrs: []any{"in-use-bytes", live, "quota-bytes", quota, "suggested-quota-bytes", 2 * quota}}}
}

// liveBytes estimates the live data under a NOSPACE alarm, once compacted:
// the smallest in-use figure of a healthy member. Every member holds the
// same keys, but etcd counts the pages a compaction frees only at a later
// backend commit, and the alarm refuses the writes that would bring one:
// a member other than the one the compaction was sent to may report its
// old figure until it is defragmented. A stale figure is too high, never
// too low. Zero when no healthy member answered.
func liveBytes(ms []memberNode) int64 {
	var live int64
	for _, x := range ms {
		if x.m.Healthy && x.m.DBSizeInUse > 0 && (live == 0 || x.m.DBSizeInUse < live) {
			live = x.m.DBSizeInUse
		}
	}
	return live
}

// votingMembers pairs each voting member whose agent is reachable with
// that agent, sorted by name.
func votingMembers(o Observed) []memberNode {
	var ms []memberNode
	for _, m := range o.Cluster.Members {
		if n, ok := nodeOfMember(o, m); ok && n.Member != nil && !m.IsLearner {
			ms = append(ms, memberNode{m: m, n: n})
		}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].m.Name < ms[j].m.Name })
	return ms
}

// handOnTo is a healthy member other than self to hand leadership to,
// nil when there is none.
func handOnTo(ms []memberNode, self string) *memberNode {
	for i, x := range ms {
		if x.n.ID != self && x.m.Healthy && x.n.Healthy && !x.m.IsLearner {
			return &ms[i]
		}
	}
	return nil
}
