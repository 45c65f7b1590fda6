package plan

import (
	"fmt"
	"slices"
	"strings"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// SpecChange is one difference between the spec a cluster runs and a new
// one, and how the leader carries it out: what configure-cluster
// --dry-run shows.
type SpecChange struct {
	Field string `json:"field"`
	From  string `json:"from"`
	To    string `json:"to"`
	// How says what the leader does to make the change, or, when
	// Refused, why the agents refuse it and change nothing.
	How     string `json:"how"`
	Refused bool   `json:"refused,omitempty"`
}

// Rolled out one member at a time: how settings and versions move.
const oneAtATime = "one member at a time, followers first, leadership handed off each member before its etcd restarts; each waits until every member is healthy"

// SpecChanges lists what changes from cur (nil: no spec yet, a new
// cluster) to next, field by field, and how each is carried out.
// installed are the etcd versions every node has, when the nodes have
// said: a version change of more than one minor steps through the minor
// between.
func SpecChanges(cur *spec.ClusterSpec, next spec.ClusterSpec, installed []spec.Version) []SpecChange {
	if cur == nil {
		return []SpecChange{{Field: "cluster", To: next.String(),
			How: fmt.Sprintf("a new cluster: the agents create %d member(s) of etcd %s, from nothing, once enough agents run", next.MemberCount, next.EtcdVersion)}}
	}
	var out []SpecChange
	if cur.MemberCount != next.MemberCount {
		c := SpecChange{Field: "memberCount", From: fmt.Sprint(cur.MemberCount), To: fmt.Sprint(next.MemberCount)}
		n := next.MemberCount - cur.MemberCount
		which := "a standby agent's node"
		if next.OrdinalMembers {
			which = "the lowest ordinal not yet a member"
		}
		if n > 0 {
			c.How = fmt.Sprintf("the leader adds %d member(s) one at a time, on %s each, taking a full backup before each change; each waits until the cluster is healthy", n, which)
		} else {
			which = "an unhealthy member or a learner first, then the highest name, never the leader's own"
			if next.OrdinalMembers {
				which = "the highest ordinal first"
			}
			c.How = fmt.Sprintf("the leader removes %d member(s) one at a time (%s), taking a full backup before each change, and never below quorum", -n, which)
		}
		out = append(out, c)
	}
	if cur.EtcdVersion != next.EtcdVersion {
		out = append(out, versionChange(cur.EtcdVersion, next.EtcdVersion, installed, next.AllowDumpRestore))
	}
	if cur.OrdinalMembers != next.OrdinalMembers {
		out = append(out, SpecChange{Field: "ordinalMembers", From: fmt.Sprint(cur.OrdinalMembers), To: fmt.Sprint(next.OrdinalMembers),
			How: "which nodes may be members changes; members outside it are replaced one at a time as for a resize"})
	}
	keys := map[string]bool{}
	for k := range cur.EtcdSettings {
		keys[k] = true
	}
	for k := range next.EtcdSettings {
		keys[k] = true
	}
	var names []string
	for k := range keys {
		if cur.EtcdSettings[k] != next.EtcdSettings[k] {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		out = append(out, SpecChange{Field: "etcdSettings." + k, From: orDefault(cur.EtcdSettings[k]), To: orDefault(next.EtcdSettings[k]),
			How: "each member's etcd restarts with it, " + oneAtATime})
	}
	if a, b := compactionOf(*cur), compactionOf(next); a != b {
		out = append(out, SpecChange{Field: "compaction", From: a, To: b, How: "the leader compacts by it from its next cycle; nothing restarts"})
	}
	if a, b := cur.Defrag.Effective(), next.Defrag.Effective(); a != b {
		out = append(out, SpecChange{Field: "defrag", From: a.String(), To: b.String(), How: "the leader defragments by it from its next cycle; nothing restarts"})
	}
	return out
}

// versionChange says how the members move from version from to to.
func versionChange(from, to string, installed []spec.Version, allowDump bool) SpecChange {
	c := SpecChange{Field: "etcdVersion", From: from, To: to}
	cur, err1 := spec.ParseVersion(from)
	target, err2 := spec.ParseVersion(to)
	if err1 != nil || err2 != nil {
		c.How = "the new spec replaces an unreadable version; the agents run the new one as for a new cluster's members, one at a time"
		return c
	}
	var steps []string
	for range 8 {
		if cur.Compare(target) == 0 {
			break
		}
		step, mode, why := nextVersionStep(cur, target, installed, allowDump)
		if why != "" {
			c.How, c.Refused = why, true
			return c
		}
		switch mode {
		case stepRolling:
			steps = append(steps, "each member restarts on etcd "+step.String()+", "+oneAtATime)
		case stepDowngrade:
			steps = append(steps, "etcd's downgrade to "+fmt.Sprintf("%d.%d", step.Major, step.Minor)+" is enabled, then each member restarts on etcd "+step.String()+", "+oneAtATime)
		case stepDumpRestore:
			steps = append(steps, "the cluster is quarantined and backed up, and replaced by a new cluster of etcd "+step.String()+
				" restored from that backup: clients are cut off until it serves, and the cluster ID changes")
		}
		cur = step
	}
	c.How = strings.Join(steps, "; then ")
	return c
}

func orDefault(v string) string {
	if v == "" {
		return "(etcd's default)"
	}
	return v
}

func compactionOf(cs spec.ClusterSpec) string {
	p, err := cs.Compaction()
	if err != nil {
		return fmt.Sprintf("invalid (%v)", err)
	}
	return p.String()
}
