package plan

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"
)

// recover-quorum rebuilds a cluster that lost a majority of its members
// from one survivor's data, with etcd's --force-new-cluster: nothing the
// survivor holds is lost, writes after the last backup included. The
// other members come back through the usual membership steps, as new
// members, once the command is done.

// RecoverMember has the survivor restart etcd with --force-new-cluster.
type RecoverMember struct{ ID, NodeID, Token string }

// FinishRecover removes the completed recover-quorum command.
type FinishRecover struct{ ID string }

func (a RecoverMember) String() string {
	return fmt.Sprintf("recover-member %s node=%s token=%s", a.ID, a.NodeID, a.Token)
}
func (RecoverMember) Mutates() bool    { return true }
func (a FinishRecover) String() string { return "finish-recover " + a.ID }
func (FinishRecover) Mutates() bool    { return true }

// planRecoverQuorum is the lock holder's next step of recover-quorum c.
func planRecoverQuorum(o Observed, c Command) []Action {
	if id := c.Status.Node; id != "" {
		var n *Node
		for i := range o.Peers {
			if o.Peers[i].ID == id {
				n = &o.Peers[i]
			}
		}
		switch {
		case n == nil:
			return []Action{Report{Level: slog.LevelWarn, Msg: "recover-quorum waits for the survivor's agent to be reachable",
				Attrs: []any{"command", c.ID, "node", id}}}
		case n.Member == nil:
			return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("the survivor %s no longer holds any etcd membership", id)}}
		case n.Member.ForceNewCluster || !n.Healthy || n.RaftLeader == 0:
			return []Action{RecoverMember{ID: c.ID, NodeID: id, Token: n.Member.ClusterToken}}
		}
		return []Action{FinishRecover{ID: c.ID}}
	}

	// A view of quorum may be a cycle old, from just before it was lost:
	// refuse only once the command has waited out a record's freshness.
	refuse := func(reason string) []Action {
		if c.Age < o.RecordFresh {
			return []Action{Report{Level: slog.LevelInfo, Msg: "recover-quorum waits a moment: quorum looks held, which may be a view from before it was lost",
				Attrs: []any{"command", c.ID, "why", reason}}}
		}
		return []Action{FailCommand{ID: c.ID, Reason: reason}}
	}
	var survivors []Node
	healthy := 0
	for _, n := range o.Peers {
		if n.Healthy && n.RaftLeader != 0 {
			return refuse(fmt.Sprintf(
				"quorum is not lost: the etcd of %s follows raft leader %x; recover-quorum is only for a cluster that has lost a majority of its members", n.ID, n.RaftLeader))
		}
		if m := n.Member; m != nil && n.HasData && !m.Pending {
			survivors = append(survivors, n)
			if n.Healthy {
				healthy++
			}
		}
	}
	if len(survivors) == 0 {
		for _, r := range o.Records {
			if r.Age <= o.RecordFresh && r.HasData {
				return []Action{Report{Level: slog.LevelWarn, Msg: "recover-quorum waits: an agent with etcd data cannot be reached",
					Attrs: []any{"command", c.ID, "node", r.NodeID, "record-age", r.Age.Round(time.Second)}}}
			}
		}
		return []Action{FailCommand{ID: c.ID, Reason: "no reachable node holds etcd data; use restore-backup instead"}}
	}
	if quorum := int(o.Spec.MemberCount)/2 + 1; healthy >= quorum {
		return refuse(fmt.Sprintf(
			"quorum is not lost: %d members with data are up, a quorum of the spec's %d; they may still be electing a leader", healthy, o.Spec.MemberCount))
	}
	// The survivor that has seen the most of the log.
	sort.Slice(survivors, func(i, j int) bool {
		if survivors[i].RaftIndex != survivors[j].RaftIndex {
			return survivors[i].RaftIndex > survivors[j].RaftIndex
		}
		return survivors[i].ID < survivors[j].ID
	})
	s := survivors[0]
	if why := noQuorumEvidence(o, c, s); len(why) > 0 {
		return why
	}
	return []Action{RecoverMember{ID: c.ID, NodeID: s.ID, Token: s.Member.ClusterToken}}
}

// noQuorumEvidence returns what to do instead of forcing a new cluster
// from survivor s while there is no positive evidence that the other
// members have no quorum; nothing when there is. Not reaching a member is
// no evidence: an agent cut off from its peers, but not from the store,
// must never fork a cluster that still serves. Each other member (as the
// survivor's etcd lists them) must be reachable and outside any quorum,
// or have a fresh record in the store that shows no raft leader, or be
// named lost by the operator and silent (no fresh record).
func noQuorumEvidence(o Observed, c Command, s Node) []Action {
	if len(s.LocalMembers) == 0 {
		return []Action{Report{Level: slog.LevelInfo, Msg: "recover-quorum waits for the survivor's etcd to report its members",
			Attrs: []any{"command", c.ID, "node", s.ID}}}
	}
	var lost []string
	if rq := c.Command.RecoverQuorum; rq != nil {
		lost = rq.Lost
	}
	var names []string
	for _, m := range s.LocalMembers {
		names = append(names, m.Name)
	}
	for _, name := range lost {
		if !slices.Contains(names, name) {
			return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("--lost names %s, which is not a member of the cluster (its members: %s)",
				name, strings.Join(names, ", "))}}
		}
	}
	token := s.Member.ClusterToken
	var silent, inQuorum []string
	for _, m := range s.LocalMembers {
		name := m.Name
		if name == s.ID {
			continue
		}
		// Its agent, by name or, if its node came back wiped under a new
		// ID, on the member's own peer URLs.
		n, err := FindNode(o.Peers, name)
		if err != nil {
			for _, p := range o.Peers {
				if SameURLs(p.PeerURLs, m.PeerURLs) {
					n, err = p, nil
				}
			}
		}
		if err == nil {
			if n.Member != nil && n.Member.ClusterToken == token && n.Healthy && n.RaftLeader != 0 {
				inQuorum = append(inQuorum, name) // caught above; kept for safety
			}
			continue // reachable, and in no quorum: evidence
		}
		r, ok := findRecord(o.Records, name)
		switch {
		case ok && r.Age <= o.RecordFresh && r.ClusterToken == token && r.Healthy && r.RaftLeader != 0:
			inQuorum = append(inQuorum, fmt.Sprintf("%s (reported leader %x %s ago)", name, r.RaftLeader, r.Age.Round(time.Second)))
		case ok && r.Age <= o.RecordFresh:
			// It reports no leader, or no membership: evidence.
		case slices.Contains(lost, name):
			// Named lost, and silent: evidence.
		default:
			silent = append(silent, name)
		}
	}
	switch {
	case len(inQuorum) > 0:
		return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits: agents this one cannot reach report a raft leader; this agent may be cut off from a cluster that still has quorum, which must not be forked",
			Attrs: []any{"command", c.ID, "members", inQuorum}},
			fmt.Sprintf("waiting: members %s report a raft leader but cannot be reached; the survivor %s may be cut off from a cluster that still has quorum", strings.Join(inQuorum, ", "), s.ID))
	case len(silent) > 0:
		return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits for evidence that the other members have no quorum: their agents are silent; if their nodes are gone for good, delete this command and queue recover-quorum --lost with their names",
			Attrs: []any{"command", c.ID, "silent", silent}},
			fmt.Sprintf("waiting for evidence that the other members have no quorum: the agents of %s are silent; if those nodes are gone for good, delete this command and run recover-quorum --lost=%s",
				strings.Join(silent, ", "), strings.Join(silent, ",")))
	}
	return nil
}

// waitNoted reports a wait, and notes it in the command's status (once)
// for the operator's ctl to show.
func waitNoted(c Command, r Report, note string) []Action {
	if c.Status.Message == note {
		return []Action{r}
	}
	return []Action{r, NoteCommand{ID: c.ID, Message: note}}
}

func findRecord(recs []Record, id string) (Record, bool) {
	for _, r := range recs {
		if r.NodeID == id {
			return r, true
		}
	}
	return Record{}, false
}
