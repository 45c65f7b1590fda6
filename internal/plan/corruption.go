package plan

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"
)

// Corruption. etcd's own checks catch a member whose data differs from
// its peers' when it starts, and its periodic check raises the CORRUPT
// alarm, after which the whole cluster refuses requests until the alarm
// is disarmed. On top of them the leader compares every voting member's
// HashKV at one revision on a schedule (and at once under a CORRUPT
// alarm). A member whose hash differs from that of a majority of the
// voters has its data set aside at once, so that no client reads from
// it, and the lost-data rule removes it and adds it back to copy from
// its healthy peers (never from a backup). With no majority nothing is
// rebuilt: there is no telling which copy is right.

// HashCheck is the leader's last comparison of the members' HashKV.
type HashCheck struct {
	// Revision is the revision every member hashed its keys at.
	Revision int64
	// Hashes are the members' answers, by member ID.
	Hashes map[uint64]MemberHash
}

// MemberHash is one member's HashKV: the hash of its keys from its
// compaction revision up to the check's revision.
type MemberHash struct {
	Hash            uint32
	CompactRevision int64
}

// CheckHashes compares the voting members' HashKV at one revision.
type CheckHashes struct{ Reason string }

// DiscardMemberData has a member's node stop etcd and set its data aside:
// its data disagrees with the majority's.
type DiscardMemberData struct {
	NodeID   string
	MemberID uint64
	Reason   string
	// On is what Plan attached (see Targets).
	On Targets
}

// RecheckFailedAfter spaces the comparisons a failed initial check asks
// for, when one was inconclusive: each reads every member's keyspace.
const RecheckFailedAfter = 10 * time.Second

// UnjudgedRecheck spaces the comparisons asked for by members that
// started without their failed initial check.
const UnjudgedRecheck = time.Minute

// ResumeMember has a member whose initial corruption check failed, and
// whose data agrees with the majority's, start etcd without that check:
// it failed against a damaged peer.
type ResumeMember struct {
	NodeID   string
	MemberID uint64
	Reason   string
	// On is what Plan attached (see Targets).
	On Targets
}

func (a ResumeMember) String() string {
	return fmt.Sprintf("resume-member %s member=%x (%s)", a.NodeID, a.MemberID, a.Reason)
}
func (ResumeMember) Mutates() bool { return true }

// DisarmCorrupt disarms etcd's CORRUPT alarms of these members.
type DisarmCorrupt struct {
	MemberIDs []uint64
	Reason    string
}

func (a CheckHashes) String() string { return "check-hashes (" + a.Reason + ")" }

// CheckHashes changes nothing, but its result is observed next cycle.
func (CheckHashes) Mutates() bool { return true }
func (a DiscardMemberData) String() string {
	return fmt.Sprintf("discard-member-data %s member=%x (%s)", a.NodeID, a.MemberID, a.Reason)
}
func (DiscardMemberData) Mutates() bool { return true }
func (a DisarmCorrupt) String() string {
	return fmt.Sprintf("disarm-corrupt %s (%s)", hexIDs(a.MemberIDs), a.Reason)
}
func (DisarmCorrupt) Mutates() bool { return true }

func hexIDs(ids []uint64) string {
	var s []string
	for _, id := range ids {
		s = append(s, fmt.Sprintf("%x", id))
	}
	return strings.Join(s, ",")
}

// hashVerdict is what a HashCheck says about the voters.
type hashVerdict struct {
	// complete is set when every voter answered at one compaction
	// revision, so that the hashes compare.
	complete bool
	// agreed is set when every voter's hash is the same.
	agreed bool
	// minority are the voters whose hash differs from that of a strict
	// majority; none when there is no majority.
	minority []Member
	// noMajority is set when the voters disagree and no hash is held by
	// a strict majority.
	noMajority bool
}

// JudgeHashes compares the voting members' hashes in r, for the agent's
// metrics: which verdict the planner acts on.
func JudgeHashes(r *HashCheck, members []Member) Verdict {
	var voters []Member
	for _, m := range members {
		if !m.IsLearner {
			voters = append(voters, m)
		}
	}
	return Verdict{judgeHashes(r, voters)}
}

// Verdict is a comparison's outcome.
type Verdict struct{ v hashVerdict }

// NoMajority says the voters' data disagree and no copy is held by a
// majority: the cluster is corrupt, and nothing is rebuilt on its own.
func (v Verdict) NoMajority() bool { return v.v.noMajority }

// judgeHashes compares the voters' hashes in r.
func judgeHashes(r *HashCheck, voters []Member) hashVerdict {
	var v hashVerdict
	if r == nil || len(voters) == 0 {
		return v
	}
	count := map[uint32]int{}
	var compact *int64
	for _, m := range voters {
		h, ok := r.Hashes[m.ID]
		if !ok || (compact != nil && *compact != h.CompactRevision) {
			return v
		}
		compact = &h.CompactRevision
		count[h.Hash]++
	}
	v.complete = true
	if len(count) == 1 {
		v.agreed = true
		return v
	}
	for hash, n := range count {
		if n > len(voters)/2 {
			for _, m := range voters {
				if r.Hashes[m.ID].Hash != hash {
					v.minority = append(v.minority, m)
				}
			}
			return v
		}
	}
	v.noMajority = true
	return v
}

// planCorruption returns the leader's next step against corrupt data.
func planCorruption(o Observed) []Action {
	c := o.Cluster
	if c == nil {
		return nil
	}
	var voters []Member
	for _, m := range c.Members {
		if !m.IsLearner {
			voters = append(voters, m)
		}
	}
	sort.Slice(voters, func(i, j int) bool { return voters[i].Name < voters[j].Name })
	v := judgeHashes(o.HashCheck, voters)
	switch {
	case len(v.minority) > 0:
		return settleMinority(o, voters, v)
	case v.noMajority:
		var hs []string
		for _, m := range voters {
			hs = append(hs, fmt.Sprintf("%s=%08x", m.Name, o.HashCheck.Hashes[m.ID].Hash))
		}
		return []Action{Report{Level: slog.LevelError,
			Msg:   "CORRUPT: the members' data disagree and no copy is held by a majority: nothing is rebuilt automatically; compare the members' data, then remove the wrong ones (or restore a backup)",
			Attrs: []any{"revision", o.HashCheck.Revision, "hashes", hs}}}
	}
	// A member whose initial check failed is judged by the majority's
	// hash, its own read from its data.
	var failed []string
	for _, m := range voters {
		if n, ok := nodeOfMember(o, m); ok && n.InitialCheckFailed {
			failed = append(failed, m.Name)
		}
	}
	var unjudged []string
	for _, m := range voters {
		if n, ok := nodeOfMember(o, m); ok && n.Unjudged {
			unjudged = append(unjudged, m.Name)
		}
	}
	if len(failed) == 0 && len(unjudged) > 0 && (o.HashCheckedAgo == 0 || o.HashCheckedAgo >= UnjudgedRecheck) && hashable(o, voters) && len(voters) > 1 {
		return []Action{CheckHashes{Reason: strings.Join(unjudged, ", ") + " started without the initial check, unjudged"}}
	}
	if len(failed) > 0 {
		if o.HashCheckedAgo != 0 && o.HashCheckedAgo < RecheckFailedAfter {
			return []Action{Report{Level: slog.LevelError, Msg: "a member's initial corruption check failed; the members' data are compared again in a moment",
				Attrs: []any{"members", failed}}}
		}
		if hashable(o, voters) && len(voters) > 1 {
			return []Action{CheckHashes{Reason: "the initial corruption check of " + strings.Join(failed, ", ") + " failed"}}
		}
		return []Action{Report{Level: slog.LevelError, Msg: "a member's initial corruption check failed; its data is judged once every other voting member serves or can be read",
			Attrs: []any{"members", failed}}}
	}
	if len(c.Corrupt) > 0 {
		var gone, kept []uint64
		for _, id := range c.Corrupt {
			if slices.ContainsFunc(c.Members, func(m Member) bool { return m.ID == id }) {
				kept = append(kept, id)
			} else {
				gone = append(gone, id)
			}
		}
		switch {
		case len(gone) > 0:
			return []Action{DisarmCorrupt{MemberIDs: gone, Reason: "the members it names were removed"}}
		case v.agreed:
			return []Action{DisarmCorrupt{MemberIDs: kept, Reason: fmt.Sprintf("every voting member's HashKV agrees at revision %d", o.HashCheck.Revision)}}
		}
		if hashable(o, voters) {
			return []Action{CheckHashes{Reason: "etcd's CORRUPT alarm is raised for member(s) " + hexIDs(kept)}}
		}
		return []Action{Report{Level: slog.LevelError, Msg: "etcd's CORRUPT alarm is raised, and the cluster refuses requests; the hashes are compared once every voting member is healthy",
			Attrs: []any{"members", hexIDs(kept)}}}
	}
	if o.HashCheckDue && healthyVoters(voters) && len(voters) > 1 && oneVersion(o, voters) {
		return []Action{CheckHashes{Reason: "periodic"}}
	}
	return nil
}

// settleMinority acts on a verdict with a majority: first, a member of
// the majority whose initial check failed (against a damaged peer) starts
// again without the check; then the data of the minority is set aside,
// one member at a time, those that do not serve first, never leaving
// fewer than a quorum of voters serving.
func settleMinority(o Observed, voters []Member, v hashVerdict) []Action {
	rev := o.HashCheck.Revision
	inMinority := func(m Member) bool {
		return slices.ContainsFunc(v.minority, func(x Member) bool { return x.ID == m.ID })
	}
	for _, m := range voters {
		if inMinority(m) {
			continue
		}
		if n, ok := nodeOfMember(o, m); ok && n.InitialCheckFailed {
			return []Action{ResumeMember{NodeID: n.ID, MemberID: m.ID,
				Reason: fmt.Sprintf("its HashKV at revision %d is the majority's: its initial check failed against a damaged peer", rev)}}
		}
	}
	serving := 0
	for _, m := range voters {
		if m.Healthy {
			serving++
		}
	}
	minority := slices.Clone(v.minority)
	sort.SliceStable(minority, func(i, j int) bool { return !minority[i].Healthy && minority[j].Healthy })
	m := minority[0]
	if m.Healthy && serving-1 < len(voters)/2+1 {
		return []Action{Report{Level: slog.LevelError, Msg: "a member's data disagrees with the majority's, but setting it aside now would leave fewer than a quorum serving; it waits",
			Attrs: []any{"member", m.Name, "revision", rev, "serving", serving, "voters", len(voters)}}}
	}
	return discardMinority(o, m, rev)
}

// hashable says whether every voter's data can be hashed: its etcd
// serves, or its agent answers with its etcd kept stopped after a failed
// initial check (its data is read from its database).
func hashable(o Observed, voters []Member) bool {
	for _, m := range voters {
		if m.Healthy {
			continue
		}
		n, ok := nodeOfMember(o, m)
		if !ok || !n.InitialCheckFailed || !n.HasData {
			return false
		}
	}
	return len(voters) > 0
}

// discardMinority sets aside the data of member m of the minority; the
// leader's own only after it handed on leadership.
func discardMinority(o Observed, m Member, rev int64) []Action {
	n, ok := nodeOfMember(o, m)
	if !ok {
		return []Action{Report{Level: slog.LevelError, Msg: "a member's data disagrees with the majority's, but no agent manages it: remove it by hand",
			Attrs: []any{"member", m.Name, "revision", rev}}}
	}
	if n.DataLost || (n.Member != nil && !n.HasData) {
		return nil // set aside already: the lost-data rule goes on
	}
	reason := fmt.Sprintf("its HashKV at revision %d differs from that of a majority of the voting members", rev)
	if n.ID == o.Self.ID {
		to := handOnTo(votingMembers(o), o.Self.ID)
		if to == nil {
			return []Action{Report{Level: slog.LevelError, Msg: "the leader's data disagrees with the majority's, and no other member can take the lead",
				Attrs: []any{"revision", rev}}}
		}
		return []Action{MoveLeader{To: to.m.ID, Reason: "before the leader's own data is set aside: " + reason}}
	}
	return []Action{DiscardMemberData{NodeID: n.ID, MemberID: m.ID, Reason: reason}}
}

func healthyVoters(voters []Member) bool {
	for _, m := range voters {
		if !m.Healthy {
			return false
		}
	}
	return len(voters) > 0
}

// oneVersion says whether every voter's agent reports the same etcd
// version: hashes are not compared in the middle of a version roll.
func oneVersion(o Observed, voters []Member) bool {
	version := ""
	for _, m := range voters {
		n, ok := nodeOfMember(o, m)
		if !ok || n.Version == "" || (version != "" && n.Version != version) {
			return false
		}
		version = n.Version
	}
	return true
}

// NodeOfMember is the agent that runs etcd member m, as the planner finds
// it: by name, or on the member's peer URLs.
func NodeOfMember(o Observed, m Member) (Node, bool) { return nodeOfMember(o, m) }
