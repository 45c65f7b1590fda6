package plan

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Requiring node certificates on etcd's peer port. Every node
// certificate carries the cluster's node marker, a name no operator's
// certificate can carry; a member's etcd that requires it
// (--peer-cert-allowed-hostname) takes raft traffic from node
// certificates only, and dials only peers that serve one. A member that
// required it while a peer's certificate lacked it would cut that peer
// off, and two such could cost the quorum. So the leader turns the check
// on only once every member's agent reports a certificate with the
// marker, one member at a time as for a settings change: followers
// first, itself last after handing leadership on, every member healthy
// and caught up first. A cluster created or restored by nodes that all
// report it has the check on from the start (PeerCertHostname).
//
// Should a member's agent report a certificate without the marker (an
// older etcd-manager, after a downgrade) or ask for the check off
// (--etcd-peer-cert-check=false), the leader turns it off again, one
// member at a time. A member cut off by the check is not waited for, but
// a member is restarted only while the others keep a quorum.

// MsgPeerCertCheckStalled is reported, at warning level and in status,
// when members require the node marker of a member whose certificate
// lacks it, and turning their check off would cost the quorum.
const MsgPeerCertCheckStalled = "a member's certificate lacks the node marker that other members require on their peer port; turning their check off now would lose quorum"

// SetPeerCertCheck restarts a member's etcd requiring Hostname of peer
// certificates; an empty Hostname takes any certificate from the CA.
type SetPeerCertCheck struct {
	NodeID   string
	Hostname string
	// On is what Plan attached (see Targets).
	On Targets
}

func (a SetPeerCertCheck) String() string {
	if a.Hostname == "" {
		return "set-peer-cert-check " + a.NodeID + " off"
	}
	return "set-peer-cert-check " + a.NodeID + " " + a.Hostname
}
func (SetPeerCertCheck) Mutates() bool { return true }

// PeerCertHostname is the name a cluster of nodes can require of peer
// certificates: the node marker each of them reports, or "" when one
// reports none, another, or asks for the check off.
func PeerCertHostname(nodes []Node) string {
	want := ""
	for _, n := range nodes {
		if n.CertMarker == "" || n.PeerCertCheckOff || (want != "" && n.CertMarker != want) {
			return ""
		}
		want = n.CertMarker
	}
	return want
}

// planPeerCertCheck returns the next step of turning the peer
// certificate check on or off, or nothing when every member has it as
// it should.
func planPeerCertCheck(o Observed) []Action {
	var ms []memberNode
	var nodes []Node
	for _, m := range o.Cluster.Members {
		n, ok := nodeOfMember(o, m)
		if !ok || n.Member == nil || n.Member.ClusterToken != o.Cluster.Token {
			continue // unreachable: it holds the change up below
		}
		v, err := spec.ParseVersion(n.Member.EtcdVersion)
		if err != nil {
			continue
		}
		ms = append(ms, memberNode{m, n, v})
		nodes = append(nodes, n)
	}
	want := PeerCertHostname(nodes)
	pending := func(x memberNode) bool { return x.n.Member.PeerCertHostname != want }
	if !slices.ContainsFunc(ms, pending) {
		return nil
	}
	if len(ms) != len(o.Cluster.Members) {
		return []Action{Report{Level: slog.LevelInfo, Msg: "the peer certificate check waits: a member's agent is unreachable"}}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].m.Name < ms[j].m.Name })
	const what = "peer certificate check"
	gated := ms
	var cutOff []string
	if want == "" {
		// A member whose certificate lacks the marker may be cut off by
		// the very check being turned off: it is not waited for.
		gated = nil
		for _, x := range ms {
			if x.n.CertMarker == "" && !x.m.Healthy {
				cutOff = append(cutOff, x.m.Name)
				continue
			}
			gated = append(gated, x)
		}
	}
	if wait := healthGate(gated, what); wait != nil {
		return wait
	}
	next := followerFirst(ms, o.Self.ID, pending)
	if len(cutOff) > 0 && !upThroughRestart(o.Cluster.Members, next.m) {
		var requiring []string
		for _, x := range ms {
			if x.n.Member.PeerCertHostname != "" {
				requiring = append(requiring, x.m.Name)
			}
		}
		status := fmt.Sprintf("peer certificate check: %s %s no node marker on its certificate (an etcd-manager older than the others?), and %s refuse its raft traffic; "+
			"turning their check off one at a time would lose quorum: run the same etcd-manager on %s again (to downgrade, first set --etcd-peer-cert-check=false on every agent)",
			strings.Join(cutOff, ", "), pluralVerb(cutOff, "has", "have"), strings.Join(requiring, ", "), strings.Join(cutOff, ", "))
		return []Action{Report{Level: slog.LevelWarn, Msg: MsgPeerCertCheckStalled, Status: status,
			Attrs: []any{"cut-off", cutOff, "requiring", requiring}}}
	}
	if next.n.ID == o.Self.ID && len(ms) > 1 {
		to := handOnTo(ms, o.Self.ID)
		if to == nil {
			return []Action{Report{Level: slog.LevelInfo, Msg: "the peer certificate check waits for a healthy member to hand leadership to"}}
		}
		return []Action{MoveLeader{To: to.m.ID, Reason: "before restarting the leader with another peer certificate check"}}
	}
	return []Action{SetPeerCertCheck{NodeID: next.n.ID, Hostname: want}}
}

// upThroughRestart reports whether the voters other than victim that
// are healthy make a quorum of all voters: restarting victim then keeps
// the cluster writable.
func upThroughRestart(members []Member, victim Member) bool {
	voters, up := 0, 0
	for _, m := range members {
		if m.IsLearner {
			continue
		}
		voters++
		if m.Healthy && m.ID != victim.ID {
			up++
		}
	}
	return up >= quorum(voters)
}

func pluralVerb(names []string, one, many string) string {
	if len(names) == 1 {
		return one
	}
	return many
}
