package plan

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Defragmentation. etcd gives back the free pages of its database only
// when a member is defragmented, and a member being defragmented stalls
// its clients and, if it leads, the cluster's writes. So the leader
// defragments one member at a time, followers first, and hands
// leadership on before its own turn: the leader is never defragmented in
// place. A member goes only while every member is healthy and caught up;
// a cluster that degrades stops the round. Members are due by the
// spec's policy (DefragPolicy), within its window; a defrag command
// (etcd-manager-ctl defrag) does every member now, whatever the policy.
// A cluster of one member has no one to hand leadership to: its member is
// defragmented in place, and its clients wait meanwhile.
//
// A member defragmenting holds every request sent to it until it is
// done, and a client of plain gRPC round-robin keeps sending to it, so
// each of its writers stalls in turn. Where the others keep quorum
// without it (three voters or more), a member is therefore isolated for
// its turn: its agent stops etcd, copies the database offline in small
// fsynced transactions, and starts etcd again, as a version roll
// restarts a member. Its clients find its port closed and go to the
// others at once, and the others' disk writes never queue behind one
// large flush of the copy. Fewer voters, a NOSPACE alarm (no write succeeds
// anyway) and a member whose isolated defragmentation failed lately are
// defragmented in place, with etcd's gRPC service reported as stopped
// for the duration where the version can.

// DefragMember defragments one member: in place through its client URL,
// or Isolated through its agent.
type DefragMember struct {
	NodeID    string
	MemberID  uint64
	ClientURL string
	Reason    string
	Isolate   bool
	// InUseBytes is the member's database in use, as last reported: the
	// space its compact copy needs.
	InUseBytes int64
	// CommandIDs are the defrag commands this step serves.
	CommandIDs []string
	// On is what Plan attached (see Targets).
	On Targets
}

func (a DefragMember) String() string {
	how := "in place"
	if a.Isolate {
		how = "isolated"
	}
	return fmt.Sprintf("defrag %s %s (%s)", a.NodeID, how, a.Reason)
}
func (DefragMember) Mutates() bool { return true }

// isolatedDefragMinVoters is the fewest voters with which one member can
// restart for its defragmentation while the others keep quorum.
const isolatedDefragMinVoters = 3

// FinishDefrag records defrag commands as done: every member is
// defragmented.
type FinishDefrag struct{ CommandIDs []string }

func (a FinishDefrag) String() string { return "finish-defrag " + strings.Join(a.CommandIDs, " ") }
func (FinishDefrag) Mutates() bool    { return true }

// planDefrag returns the next defragmentation step, or nothing.
func planDefrag(o Observed) []Action {
	var cmds []Command
	for _, c := range o.Commands {
		if c.Command.Defrag != nil && c.Err == nil && c.Newer == nil && !c.Status.Finished() && !c.lapsed() {
			cmds = append(cmds, c)
		}
	}
	policy := o.Spec.Defrag.Effective()
	auto := !policy.Off
	if len(cmds) == 0 && !auto {
		return nil
	}
	var ids []string
	for _, c := range cmds {
		ids = append(ids, c.ID)
	}
	// A member is due for a command until every command lists it.
	commandDue := func(id string) bool {
		for _, c := range cmds {
			if !slices.Contains(c.Status.Defragmented, id) {
				return true
			}
		}
		return false
	}
	var ms []memberNode
	due := map[string]string{} // node ID -> why it is due
	shut := 0                  // members due by the policy outside its window
	for _, m := range o.Cluster.Members {
		n, ok := nodeOfMember(o, m)
		if !ok || n.Member == nil || m.IsLearner {
			continue
		}
		v, _ := spec.ParseVersion(n.Member.EtcdVersion)
		ms = append(ms, memberNode{m, n, v})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].m.Name < ms[j].m.Name })
	for _, x := range ms {
		switch {
		case commandDue(x.n.ID) && len(cmds) > 0:
			due[x.n.ID] = "defrag " + strings.Join(ids, " ")
		case auto:
			why := policy.DefragDue(x.m.DBSize, x.m.DBSizeInUse, o.Spec.QuotaBytes())
			switch {
			case why == "":
			case o.DefragWindowOpen:
				due[x.n.ID] = why
			default:
				shut++
			}
		}
	}
	if len(due) == 0 && len(cmds) == 0 {
		if shut == 0 {
			return nil
		}
		// Due by the policy while its window is shut: said once, so
		// that a database that keeps its free pages is no mystery.
		return []Action{Report{Level: slog.LevelInfo, Msg: "defragmentation is due and waits for its maintenance window",
			Attrs: []any{"members", shut, "window", policy.Window, "window-duration", policy.WindowDuration}}}
	}
	if len(ms) != len(o.Cluster.Members) {
		return []Action{Report{Level: slog.LevelInfo, Msg: "defragmentation waits: a member's agent is unreachable, or a member is a learner"}}
	}
	if len(due) == 0 {
		return []Action{FinishDefrag{CommandIDs: ids}}
	}
	if wait := healthGate(ms, "defragmentation"); wait != nil {
		return wait
	}
	x := followerFirst(ms, o.Self.ID, func(x memberNode) bool { return due[x.n.ID] != "" })
	if x.n.ID == o.Self.ID && len(ms) > 1 {
		// The health gate passed: every other member can take the lead.
		return []Action{MoveLeader{To: handOnTo(ms, o.Self.ID).m.ID, Reason: "before defragmenting the leader's member"}}
	}
	if len(x.m.ClientURLs) == 0 {
		return []Action{Report{Level: slog.LevelWarn, Msg: "defragmentation waits: a member has no client URL", Attrs: []any{"node", x.n.ID}}}
	}
	var cmdIDs []string
	if commandDue(x.n.ID) {
		cmdIDs = ids
	}
	isolate := len(ms) >= isolatedDefragMinVoters && !o.IsolatedDefragFailed[x.n.ID]
	return []Action{DefragMember{NodeID: x.n.ID, MemberID: x.m.ID, ClientURL: x.m.ClientURLs[0], Reason: due[x.n.ID],
		Isolate: isolate, InUseBytes: x.m.DBSizeInUse, CommandIDs: cmdIDs}}
}
