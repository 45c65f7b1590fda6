package plan

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"
)

// Switching peer URLs. When an agent restarts with other --peer-urls than
// its member is registered with (going from --etcd-insecure to TLS turns
// http into https), its etcd keeps serving the registered ones, so the
// cluster keeps talking to it. The leader then switches the members one
// at a time, every member healthy first: it registers the new URLs
// (MemberUpdate) and has the node restart etcd serving them. Members that
// have TLS files dial https peers and serve http ones alike, so a cluster
// part way through keeps its quorum; each member is away only for its own
// restart, and the leader's own member goes last, after it hands
// leadership on. A member that is down, its node back at another address
// (a Kubernetes pod recreated with a new IP), is switched while it is down,
// the others healthy: its etcd cannot serve the old address at all.

// MsgPeerURLSwitchStalled is reported, at warning level and in status,
// when a peer URL switch waits on a member unhealthy past the grace
// period.
const MsgPeerURLSwitchStalled = "peer URL switch stalled: a member has been unhealthy past the grace period"

// SetPeerURLs registers a member's new peer URLs and has its node serve
// them.
type SetPeerURLs struct {
	NodeID   string
	MemberID uint64
	URLs     []string
	// On is what Plan attached (see Targets).
	On Targets
}

func (a SetPeerURLs) String() string {
	return fmt.Sprintf("set-peer-urls %s %s", a.NodeID, strings.Join(a.URLs, ","))
}
func (SetPeerURLs) Mutates() bool { return true }

// planPeerURLs returns the next step of a peer URL switch, or nothing.
func planPeerURLs(o Observed) []Action {
	type cand struct {
		m Member
		n Node
	}
	var todo []cand
	for _, m := range o.Cluster.Members {
		n, ok := nodeOfMember(o, m)
		if !ok || n.Member == nil || n.Member.ClusterToken != o.Cluster.Token || len(n.PeerURLs) == 0 || m.IsLearner {
			continue
		}
		if !SameURLs(m.PeerURLs, n.PeerURLs) {
			todo = append(todo, cand{m, n})
		}
	}
	if len(todo) == 0 {
		return nil
	}
	// A member that is down with other URLs than its registered ones goes
	// first: its node may be unable to serve the old ones at all (a pod
	// back with a new address), and the switch is what brings it back.
	sort.Slice(todo, func(i, j int) bool {
		if todo[i].m.Healthy != todo[j].m.Healthy {
			return !todo[i].m.Healthy
		}
		return todo[i].n.ID < todo[j].n.ID
	})
	next := todo[0]
	if i := slices.IndexFunc(todo, func(c cand) bool { return c.n.ID != o.Self.ID }); i >= 0 {
		next = todo[i]
	}
	// Every other member must be healthy: the switch restarts the member's
	// etcd, and must not cost the quorum. A member that stays unhealthy
	// past the grace period stalls the switch: the others keep their old
	// URLs, plain http in a move to TLS, until it is back or replaced.
	for _, m := range o.Cluster.Members {
		if !m.Healthy && m.ID != next.m.ID {
			if m.UnhealthyFor < o.Grace {
				return []Action{Report{Level: slog.LevelInfo, Msg: "peer URL switch waits for every member to be healthy", Attrs: []any{"member", m.Name}}}
			}
			var waiting, old []string
			toTLS := false
			for _, c := range todo {
				waiting = append(waiting, c.m.Name)
				old = append(old, c.m.PeerURLs...)
				toTLS = toTLS || (hasScheme(c.m.PeerURLs, "http") && hasScheme(c.n.PeerURLs, "https"))
			}
			keep := "keeps"
			if len(waiting) > 1 {
				keep = "keep"
			}
			status := fmt.Sprintf("peer URL switch stalled: member %s has been unhealthy for %s; until it is healthy or replaced, %s %s the old peer URLs %s",
				m.Name, m.UnhealthyFor.Round(time.Second), strings.Join(waiting, ", "), keep, strings.Join(old, ","))
			if toTLS {
				status += ", so raft traffic to them is still plain http"
			}
			return []Action{Report{Level: slog.LevelWarn, Msg: MsgPeerURLSwitchStalled, Status: status,
				Attrs: []any{"member", m.Name, "unhealthy-for", m.UnhealthyFor, "waiting", waiting, "old-peer-urls", old}}}
		}
	}
	if next.n.ID == o.Self.ID && len(o.Cluster.Members) > 1 {
		for _, m := range o.Cluster.Members {
			if m.ID != next.m.ID {
				return []Action{MoveLeader{To: m.ID, Reason: "before switching the leader's own peer URLs"}}
			}
		}
	}
	return []Action{SetPeerURLs{NodeID: next.n.ID, MemberID: next.m.ID, URLs: next.n.PeerURLs}}
}

// hasScheme reports whether any of the URLs has the scheme.
func hasScheme(urls []string, scheme string) bool {
	return slices.ContainsFunc(urls, func(u string) bool { return strings.HasPrefix(u, scheme+"://") })
}
