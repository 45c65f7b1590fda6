package plan

import (
	"log/slog"
	"sort"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Settings changes. When the spec's etcd settings differ from those a
// member runs with, the leader restarts the members with them one at a
// time, as for a version change: followers first, then itself after
// handing leadership on; each only once every member is healthy and
// caught up. A version change goes first; the settings follow once every
// member runs the spec's version.

// settingsCallOffAfter is how long a member must have been down, with
// other settings than the spec's, before it restarts with the spec's
// without waiting for the health gate: a moment's slow status call is
// not down.
const settingsCallOffAfter = 30 * time.Second

// SetMemberSettings restarts a member's etcd with the spec's settings.
type SetMemberSettings struct {
	NodeID   string
	Settings spec.Settings
	// On is what Plan attached (see Targets).
	On Targets
}

func (a SetMemberSettings) String() string {
	return "set-member-settings " + a.NodeID + " [" + a.Settings.String() + "]"
}
func (SetMemberSettings) Mutates() bool { return true }

// planSettings returns the next step of a settings change, or nothing
// when every member runs with the spec's settings.
func planSettings(o Observed) []Action {
	want := o.Spec.EtcdSettings
	target, err := spec.ParseSupportedVersion(o.Spec.EtcdVersion)
	if err != nil {
		return nil // the spec was validated when read
	}
	var ms []memberNode
	behind := false
	for _, m := range o.Cluster.Members {
		n, ok := nodeOfMember(o, m)
		if !ok || n.Member == nil {
			continue // an unreachable member holds the change up, if there is one
		}
		v, err := spec.ParseVersion(n.Member.EtcdVersion)
		if err != nil || v.Compare(target) != 0 {
			return nil // a version change comes first
		}
		ms = append(ms, memberNode{m, n, v})
		if !n.Member.Settings.Equal(want) {
			behind = true
		}
	}
	if !behind {
		return nil
	}
	if len(ms) != len(o.Cluster.Members) {
		return []Action{Report{Level: slog.LevelInfo, Msg: "etcd settings change waits: a member's agent is unreachable"}}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].m.Name < ms[j].m.Name })
	for _, x := range ms {
		// A member that is down anyway, with other settings, restarts
		// with the spec's at once: this is how a change that keeps a
		// member from starting is called off (set the spec back).
		if !x.m.Healthy && !x.n.Healthy && x.m.UnhealthyFor >= settingsCallOffAfter && x.n.ID != o.Self.ID && !x.n.Member.Settings.Equal(want) {
			return []Action{SetMemberSettings{NodeID: x.n.ID, Settings: want}}
		}
	}
	if wait := healthGate(ms, "etcd settings change"); wait != nil {
		return wait
	}
	next := followerFirst(ms, o.Self.ID, func(x memberNode) bool { return !x.n.Member.Settings.Equal(want) })
	if next.n.ID == o.Self.ID && len(ms) > 1 {
		// The health gate passed: every other member can take the lead.
		return []Action{MoveLeader{To: handOnTo(ms, o.Self.ID).m.ID, Reason: "before restarting the leader with new etcd settings"}}
	}
	return []Action{SetMemberSettings{NodeID: next.n.ID, Settings: want}}
}
