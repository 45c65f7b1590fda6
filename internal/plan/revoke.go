package plan

import "log/slog"

// Revoked nodes. etcd-manager-ctl revoke-node lists a node in the store;
// from then on its agent keeps its etcd stopped, whatever else it sees,
// and the leader removes its member, which a standby replaces as for a
// lost member. The node's agent cannot take part in the cluster again
// under its node ID: the others refuse its certificates.

// MsgRevoked is reported, at error level, by the agent of a revoked node.
const MsgRevoked = "this node is revoked (etcd-manager-ctl revoke-node): its etcd stays stopped and the other agents refuse its certificates; to use this machine again, start its agent on an empty --data-dir, which gives it a new node ID"

// StopRevoked stops this node's etcd, keeping its data: the node is
// revoked.
type StopRevoked struct{}

func (StopRevoked) String() string { return "stop-revoked" }
func (StopRevoked) Mutates() bool  { return true }

// planRevokedSelf is the whole plan of a revoked node's agent: its etcd
// stops and stays stopped, and it leads nothing.
func planRevokedSelf(o Observed) []Action {
	report := Report{Level: slog.LevelError, Msg: MsgRevoked, Attrs: []any{"node", o.Self.ID}}
	if o.Self.EtcdWanted {
		return []Action{StopRevoked{}, report}
	}
	return []Action{report}
}

// revoked removes the member of a revoked node while the other voters
// keep a quorum; the node's agent has stopped its etcd, or will.
func (p *membershipPlan) revoked() Action {
	if len(p.o.Revoked) == 0 {
		return nil
	}
	var cands []Action
	for _, m := range sortedMembers(p.c.Members) {
		id := p.nodeIDOf(m)
		if !p.o.Revoked[id] && !p.o.Revoked[m.Name] || id == p.o.Self.ID {
			continue
		}
		if !keepsQuorum(p.c.Members, m) {
			p.actions = append(p.actions, Report{Level: slog.LevelWarn, Msg: "a revoked node's member stays until removing it keeps a quorum of healthy voters",
				Attrs: []any{"node", id}})
			continue
		}
		cands = append(cands, RemoveMember{MemberID: m.ID, NodeID: id, Reason: "its node is revoked"})
	}
	return p.first(cands...)
}
