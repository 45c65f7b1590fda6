package plan

import (
	"fmt"
	"log/slog"
	"sort"
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

	var survivors []Node
	healthy := 0
	for _, n := range o.Peers {
		if n.Healthy && n.RaftLeader != 0 {
			return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf(
				"quorum is not lost: the etcd of %s follows raft leader %x; recover-quorum is only for a cluster that has lost a majority of its members", n.ID, n.RaftLeader)}}
		}
		if m := n.Member; m != nil && n.HasData && !m.Pending {
			survivors = append(survivors, n)
			if n.Healthy {
				healthy++
			}
		}
	}
	if len(survivors) == 0 {
		return []Action{FailCommand{ID: c.ID, Reason: "no reachable node holds etcd data; use restore-backup instead"}}
	}
	if quorum := int(o.Spec.MemberCount)/2 + 1; healthy >= quorum {
		return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf(
			"quorum is not lost: %d members with data are up, a quorum of the spec's %d; they may still be electing a leader", healthy, o.Spec.MemberCount)}}
	}
	// The survivor that has seen the most of the log.
	sort.Slice(survivors, func(i, j int) bool {
		if survivors[i].RaftIndex != survivors[j].RaftIndex {
			return survivors[i].RaftIndex > survivors[j].RaftIndex
		}
		return survivors[i].ID < survivors[j].ID
	})
	s := survivors[0]
	return []Action{RecoverMember{ID: c.ID, NodeID: s.ID, Token: s.Member.ClusterToken}}
}
