package plan

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Version changes. When the spec's etcd version differs from what the
// members run, the leader rolls the members over one at a time:
//
//   - a patch change, or an upgrade by one minor, goes straight to the
//     target; an upgrade by several minors steps through the newest
//     installed patch of each minor in between (3.4 -> 3.5.x -> 3.6.x);
//   - every step starts with a full backup;
//   - each member restarts on the new binary with its data, the raft
//     leader last, after handing leadership to another member;
//   - the next member waits until every member is healthy, runs the
//     version it should, and has caught up with the leader's log;
//   - nothing stops before every member's node is known to have the
//     step's binary.
//
// The plan is made afresh from what each member runs, so a new leader
// (say, after the old one's agent was killed mid-roll) carries on.

// SetMemberVersion restarts a member's etcd on another version's binary.
type SetMemberVersion struct {
	NodeID, Version string
	// On is what Plan attached (see Targets).
	On Targets
}

// EnableDowngrade turns on etcd's cluster downgrade to Version (etcd 3.6
// and later): the cluster version drops, and each member rewrites its data
// in the older schema, so the older binary can run on it.
type EnableDowngrade struct{ Version string }

func (a EnableDowngrade) String() string { return "enable-downgrade " + a.Version }
func (EnableDowngrade) Mutates() bool    { return true }

// MoveLeader hands raft leadership to another member.
type MoveLeader struct {
	To     uint64
	Reason string
}

func (a SetMemberVersion) String() string { return "set-member-version " + a.NodeID + " " + a.Version }
func (SetMemberVersion) Mutates() bool    { return true }
func (a MoveLeader) String() string {
	return fmt.Sprintf("move-leader to=%x (%s)", a.To, a.Reason)
}
func (MoveLeader) Mutates() bool { return true }

// caughtUpSlack is how far (raft entries) a restarted member's log may
// trail the leader's, both read in the same pass, before the roll moves
// on.
const caughtUpSlack = 500

// planVersion returns the next step of a version change, or nothing when
// every member runs the spec's version.
func planVersion(o Observed) []Action {
	target, err := spec.ParseSupportedVersion(o.Spec.EtcdVersion)
	if err != nil {
		return nil // the spec was validated when read
	}
	ms, wait := versionMembers(o, target)
	if wait != nil || ms == nil {
		return wait
	}
	if back := callOff(ms, target); back != nil {
		return back
	}
	var nodes []Node
	for _, x := range ms {
		nodes = append(nodes, x.n)
	}
	cur := standing(ms, target)
	step, mode, why := nextVersionStep(cur, target, installedOnAll(nodes), o.Spec.AllowDumpRestore)
	if why != "" {
		return []Action{Report{Level: slog.LevelError, Msg: "cannot change the etcd version: " + why,
			Attrs: []any{"running", cur.String(), "wanted", target.String()}}}
	}
	var missing []string
	for _, x := range ms {
		if !slices.Contains(x.n.Installed, step.String()) {
			missing = append(missing, x.n.ID)
		}
	}
	if len(missing) > 0 {
		return []Action{Report{Level: slog.LevelError, Msg: "cannot change the etcd version: some nodes have no binary for it; nothing was stopped",
			Attrs: []any{"version", step.String(), "nodes", missing}}}
	}
	if mode == stepDumpRestore {
		return planDumpRestore(o, step)
	}
	if wait := v2Gate(ms, step); wait != nil {
		return wait
	}
	if o.VersionBackup != step.String() {
		return []Action{TakeBackup{Reason: "before changing etcd to " + step.String(), Kind: spec.BackupPreChange, ForVersion: step.String()}}
	}
	minor := fmt.Sprintf("%d.%d", step.Major, step.Minor)
	downgrade := mode == stepDowngrade
	if downgrade && !strings.HasPrefix(o.Self.DowngradeTarget, minor+".") && !anyConfiguredAt(ms, step) {
		// etcd's downgrade: enable it once, then a member moves to the older
		// binary only after its data is back in the older schema.
		return []Action{EnableDowngrade{Version: minor}}
	}
	if wait := healthGate(ms, "version change"); wait != nil {
		return wait
	}
	next := nextMember(ms, step, o.Self.ID)
	if next == nil {
		return nil // every member is at the step; the next cycle plans the next step
	}
	if downgrade {
		if wait := downgradeGate(o, next, minor); wait != nil {
			return wait
		}
	}
	if next.n.ID == o.Self.ID && len(ms) > 1 {
		// Hand leadership on first, to a member already on the step if any.
		to := ms[0]
		for _, x := range ms {
			if x.n.ID == o.Self.ID {
				continue
			}
			to = x
			if x.configured.Compare(step) == 0 {
				break
			}
		}
		return []Action{MoveLeader{To: to.m.ID, Reason: "before restarting the leader on etcd " + step.String()}}
	}
	return []Action{SetMemberVersion{NodeID: next.n.ID, Version: step.String()}}
}

// versionMembers pairs every member with its agent and the version it is
// set to run, sorted by name; nil when no member needs to change, and a
// wait when one's agent is unreachable or its record unreadable.
func versionMembers(o Observed, target spec.Version) ([]memberNode, []Action) {
	var ms []memberNode
	needed := false
	for _, m := range o.Cluster.Members {
		n, ok := nodeOfMember(o, m)
		if !ok || n.Member == nil {
			continue // an unreachable member holds the change up, if there is one
		}
		v, err := spec.ParseVersion(n.Member.EtcdVersion)
		if err != nil {
			return nil, []Action{Report{Level: slog.LevelError, Msg: "a member's recorded etcd version is unreadable", Attrs: []any{"node", n.ID, "error", err}}}
		}
		ms = append(ms, memberNode{m, n, v})
		if v.Compare(target) != 0 || (n.Version != "" && n.Version != target.String()) {
			needed = true
		}
	}
	if !needed {
		return nil, nil
	}
	if len(ms) != len(o.Cluster.Members) {
		return nil, []Action{Report{Level: slog.LevelInfo, Msg: "version change waits: a member's agent is unreachable"}}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].m.Name < ms[j].m.Name })
	return ms, nil
}

// standing is where the members stand: the oldest when going up, the
// newest when some are above the target (going down), so that a change
// half done is seen as the same change.
func standing(ms []memberNode, target spec.Version) spec.Version {
	cur := ms[0].configured
	for _, x := range ms[1:] {
		if x.configured.Compare(cur) < 0 {
			cur = x.configured
		}
	}
	for _, x := range ms {
		if x.configured.Compare(target) > 0 && x.configured.Compare(cur) > 0 {
			cur = x.configured
		}
	}
	return cur
}

// v2Gate holds a step into 3.7 until every member's log has been
// snapshotted past the v2 entries etcd 3.5 left in it, which 3.7 cannot
// replay.
func v2Gate(ms []memberNode, step spec.Version) []Action {
	if step.Minor < 7 {
		return nil
	}
	var until uint64
	for _, x := range ms {
		until = max(until, x.n.Member.V2Until)
	}
	for _, x := range ms {
		if x.n.SnapIndex < until {
			return []Action{Report{Level: slog.LevelInfo, Msg: "version change waits until every member has taken a raft snapshot past the v2 entries etcd 3.5 left in its log (every --etcd-snapshot-count entries)",
				Attrs: []any{"node", x.n.ID, "snapshot-index", x.n.SnapIndex, "needed", until}}}
		}
	}
	return nil
}

// healthGate holds the roll until every member is up, on the version it
// should run, and caught up. The indexes compared were read by the
// leader in one pass; an agent's own figure can be a cycle old, which
// under load never catches up.
func healthGate(ms []memberNode, what string) []Action {
	var leaderIndex uint64
	for _, x := range ms {
		leaderIndex = max(leaderIndex, x.m.RaftIndex)
	}
	for _, x := range ms {
		switch {
		case !x.m.Healthy || !x.n.Healthy || x.m.IsLearner:
			return []Action{Report{Level: slog.LevelInfo, Msg: "a rolling change waits for every member to be healthy", Attrs: []any{"change", what, "node", x.n.ID}}}
		case x.n.Version != x.configured.String():
			return []Action{Report{Level: slog.LevelInfo, Msg: "a rolling change waits for a member to run its new version", Attrs: []any{"change", what, "node", x.n.ID, "running", x.n.Version, "wanted", x.configured.String()}}}
		case leaderIndex > x.m.RaftIndex+caughtUpSlack:
			return []Action{Report{Level: slog.LevelInfo, Msg: "a rolling change waits for a member to catch up", Attrs: []any{"change", what, "node", x.n.ID, "behind", leaderIndex - x.m.RaftIndex}}}
		}
	}
	return nil
}

// nextMember is the next member to move to step: a follower first, the
// leader (self) last; nil when all are there.
func nextMember(ms []memberNode, step spec.Version, self string) *memberNode {
	return followerFirst(ms, self, func(x memberNode) bool { return x.configured.Compare(step) != 0 })
}

// followerFirst is the next of ms, in their order, that pending says is
// still to go through a rolling change: a follower first, the leader
// (self) last; nil when none is.
func followerFirst(ms []memberNode, self string, pending func(memberNode) bool) *memberNode {
	var next *memberNode
	for i, x := range ms {
		if !pending(x) {
			continue
		}
		if x.n.ID != self {
			return &ms[i]
		}
		next = &ms[i]
	}
	return next
}

// downgradeGate holds a member's move to the older minor until etcd has
// lowered the cluster version and rewritten the member's data in the
// older schema.
func downgradeGate(o Observed, next *memberNode, minor string) []Action {
	if !strings.HasPrefix(o.Self.Version, minor+".") && !strings.HasPrefix(o.Self.ClusterVersion, minor+".") {
		// etcd lowers the cluster version a few seconds after the
		// downgrade is enabled; an older binary that joins before then
		// leaves the downgrade stuck and never serves. (A leader already
		// on the older minor shows it was lowered.) A fresh cluster's
		// storage version reads as the older one at once, so that alone
		// does not tell.
		return []Action{Report{Level: slog.LevelInfo, Msg: "downgrade waits for etcd to lower the cluster version",
			Attrs: []any{"cluster-version", o.Self.ClusterVersion, "wanted", minor}}}
	}
	if !strings.HasPrefix(next.n.StorageVersion, minor+".") {
		// An empty storage version is not yet known (etcd sets it a moment
		// after the cluster version), not "already older".
		return []Action{Report{Level: slog.LevelInfo, Msg: "downgrade waits for a member's data to be rewritten in the older schema",
			Attrs: []any{"node", next.n.ID, "storage-version", next.n.StorageVersion, "wanted", minor}}}
	}
	return nil
}

// How the members move to a version step.
type stepMode int

const (
	stepRolling     stepMode = iota // restart each member on the new binary
	stepDowngrade                   // the same, after enabling etcd's downgrade
	stepDumpRestore                 // a new cluster of the version, from a backup
)

// nextVersionStep is the version the members move to next on the way
// from cur to target, given the versions installed on every node, and how
// they get there; or why there is no way.
func nextVersionStep(cur, target spec.Version, installed []spec.Version, allowDump bool) (spec.Version, stepMode, string) {
	switch {
	case cur.Major != target.Major:
		return spec.Version{}, 0, fmt.Sprintf("a change of major version (%s to %s) is not supported", cur, target)
	case cur.Minor == target.Minor, target.Minor == cur.Minor+1:
		return target, stepRolling, "" // a patch change, up or down, or one minor up
	case target.Minor > cur.Minor+1:
		var best *spec.Version
		for i, v := range installed {
			if v.Major == cur.Major && v.Minor == cur.Minor+1 && v.Pre == "" && (best == nil || v.Compare(*best) > 0) {
				best = &installed[i]
			}
		}
		if best == nil {
			return spec.Version{}, 0, fmt.Sprintf("going from %s to %s steps through 3.%d, but no 3.%d.x is installed on every node",
				cur, target, cur.Minor+1, cur.Minor+1)
		}
		return *best, stepRolling, ""
	case target.Minor == cur.Minor-1 && cur.Minor >= 6:
		return target, stepDowngrade, "" // etcd 3.6 and later downgrade one minor in place
	case allowDump:
		return target, stepDumpRestore, ""
	default:
		return spec.Version{}, 0, fmt.Sprintf("going from %s down to %s needs dump and restore (a new cluster of %s made from a backup, "+
			"with clients cut off until it serves); allow it with configure-cluster --etcd-version=%s --allow-dump-restore, or set the spec back to %s",
			cur, target, target, target, cur)
	}
}

// QueueDumpRestore queues the dump-restore command that moves the cluster
// to Version.
type QueueDumpRestore struct{ Version string }

func (a QueueDumpRestore) String() string { return "queue-dump-restore " + a.Version }
func (QueueDumpRestore) Mutates() bool    { return true }

// planDumpRestore starts a dump-restore to v, unless one failed: that
// waits for the operator, who reads why in list-commands.
func planDumpRestore(o Observed, v spec.Version) []Action {
	for _, c := range o.Commands {
		if d := c.Command.DumpRestore; d != nil && d.EtcdVersion == v.String() && c.Status.State == spec.CommandFailed {
			return []Action{Report{Level: slog.LevelError, Msg: "cannot change the etcd version: its dump-restore failed; read why with list-commands, then delete the command to try again",
				Attrs: []any{"command", c.ID, "version", v.String(), "error", c.Status.Message}}}
		}
	}
	return []Action{QueueDumpRestore{Version: v.String()}}
}

// memberNode is an etcd member with its agent and the version it is set
// to run.
type memberNode struct {
	m          Member
	n          Node
	configured spec.Version
}

// anyConfiguredAt reports whether some member is set to run v already.
func anyConfiguredAt(ms []memberNode, v spec.Version) bool {
	for _, x := range ms {
		if x.configured.Compare(v) == 0 {
			return true
		}
	}
	return false
}

// installedOnAll returns the versions installed on every one of nodes.
func installedOnAll(nodes []Node) []spec.Version {
	count := map[string]int{}
	for _, n := range nodes {
		for _, v := range n.Installed {
			count[v]++
		}
	}
	var out []spec.Version
	for s, c := range count {
		if c != len(nodes) {
			continue
		}
		if v, err := spec.ParseVersion(s); err == nil {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Compare(out[j]) < 0 })
	return out
}

// nodeOfMember finds the agent of an etcd member: by name, else by peer
// URLs.
func nodeOfMember(o Observed, m Member) (Node, bool) {
	for _, p := range o.Peers {
		if p.ID == m.Name && m.Name != "" {
			return p, true
		}
	}
	for _, p := range o.Peers {
		if SameURLs(p.PeerURLs, m.PeerURLs) {
			return p, true
		}
	}
	return Node{}, false
}

// callOff calls off a version step that failed: a member set to run
// another version than the target, whose etcd does not run, while every
// member that runs runs the target (the spec was set back after the step
// failed). It goes back to the target at once, without the health gate
// (it serves nothing, and would never pass it), a backup or a leadership
// move: the others never left the target, so neither did the cluster
// version or the data's schema.
func callOff(ms []memberNode, target spec.Version) []Action {
	var failed *memberNode
	for i, x := range ms {
		running := x.m.Healthy && x.n.Healthy
		switch {
		case running && (x.n.Version != target.String() || x.configured.Compare(target) != 0):
			return nil // a roll in progress, not one called off
		case !running && x.configured.Compare(target) != 0 && failed == nil:
			failed = &ms[i]
		}
	}
	if failed == nil || !slices.Contains(failed.n.Installed, target.String()) {
		return nil
	}
	return []Action{
		Report{Level: slog.LevelWarn, Msg: "calling off a version step that failed: the member goes back to the spec's version",
			Attrs: []any{"node", failed.n.ID, "from", failed.configured.String(), "to", target.String()}},
		SetMemberVersion{NodeID: failed.n.ID, Version: target.String()},
	}
}
