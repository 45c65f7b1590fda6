package plan

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Rotating the cluster's CA. The store's rotation record (see package
// pki) says, for its phase, which CAs every node is to trust and which
// CA is to have issued every node's certificate. The leader brings the
// nodes there:
//
//  1. the files, node by node: each agent takes up the store's CA and
//     trust (SyncCA), which its peer API and etcd clients read at each
//     handshake, and gets a new key and certificate when the issuing CA
//     changed, which etcd reads at each handshake too;
//  2. etcd, when the phase changes what it trusts, which etcd reads only
//     at start: members restart one at a time, as for a settings change
//     (followers first, the leader last after handing leadership on,
//     every member healthy and caught up first);
//  3. the record: the next phase, or, after the last, the end of the
//     rotation. A phase that is a gate waits for the operator
//     (rotate-ca continue, rotate-ca finish) instead.
//
// Every member's agent must be reachable throughout: a member left
// behind could be cut off once the others trust only the new CA.

// CARotation is the store's CA rotation as the planner needs it.
type CARotation struct {
	// Phase is the record's phase.
	Phase string
	// Trust are the SHA-256 fingerprints of the CAs every node is to
	// trust in this phase, sorted; Issuer that of the CA that is to have
	// issued every node's certificate.
	Trust  []string
	Issuer string
	// RollEtcd is set when the phase changes what etcd trusts: members
	// restart their etcd, one at a time.
	RollEtcd bool
	// Next is the phase to record once every node is there; empty ends
	// the rotation. Gate, when set, is the command the phase waits for
	// instead.
	Next string
	Gate string
}

// SyncCA has a node take up the store's CA and trust, and, with
// Restart, restart its etcd (a member's) to trust them.
type SyncCA struct {
	NodeID  string
	Restart bool
	Trust   []string
	Issuer  string
	// Phase is the rotation's, for the log.
	Phase string
	// On is what Plan attached (see Targets).
	On Targets
}

func (a SyncCA) String() string {
	if a.Restart {
		return "sync-ca " + a.NodeID + " restart-etcd"
	}
	return "sync-ca " + a.NodeID
}
func (SyncCA) Mutates() bool { return true }

// AdvanceCARotation records the rotation's next phase; with To empty,
// it ends the rotation.
type AdvanceCARotation struct{ From, To string }

func (a AdvanceCARotation) String() string {
	if a.To == "" {
		return "finish-ca-rotation " + a.From
	}
	return "advance-ca-rotation " + a.From + " " + a.To
}
func (AdvanceCARotation) Mutates() bool { return true }

// MsgCARotationGate is reported while a rotation waits for the operator.
const MsgCARotationGate = "a CA rotation waits for the operator"

// planCARotation returns the next step of a CA rotation, or nothing
// without one.
func planCARotation(o Observed) []Action {
	r := o.CARotation
	if r == nil {
		if o.CARotationErr != nil {
			return []Action{Report{Level: slog.LevelWarn, Msg: "the CA rotation record cannot be read or used; the rotation waits",
				Status: "CA rotation: " + o.CARotationErr.Error(), Attrs: []any{"error", o.CARotationErr}}}
		}
		return nil
	}
	if r.Gate != "" {
		return []Action{Report{Level: slog.LevelInfo, Msg: MsgCARotationGate, Attrs: []any{"phase", r.Phase, "next", r.Gate}}}
	}
	var ms []memberNode
	for _, m := range o.Cluster.Members {
		n, ok := nodeOfMember(o, m)
		if !ok || n.Member == nil || n.Member.ClusterToken != o.Cluster.Token {
			return []Action{Report{Level: slog.LevelInfo, Msg: "the CA rotation waits: a member's agent is unreachable, or not on this cluster yet",
				Status: fmt.Sprintf("CA rotation: waiting at phase %s for the agent of member %s, which is unreachable or not on this cluster yet", r.Phase, m.Name),
				Attrs:  []any{"member", m.Name, "phase", r.Phase}}}
		}
		v, _ := spec.ParseVersion(n.Member.EtcdVersion) // the health gate waits on a member not running it
		ms = append(ms, memberNode{m: m, n: n, configured: v})
	}
	nodes := slices.Clone(o.Peers)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	var blocked []string
	for _, n := range nodes {
		switch {
		case n.CAFromDir:
			blocked = append(blocked, n.ID+" takes its CA from --pki-dir")
		case len(n.Trust) == 0:
			blocked = append(blocked, n.ID+" reports no CAs it trusts (it runs without TLS, or an etcd-manager older than CA rotation)")
		}
	}
	if len(blocked) > 0 {
		status := "CA rotation: stalled at phase " + r.Phase + ": " + strings.Join(blocked, "; ") +
			"; the rotation goes through the store's CA, which such agents do not use"
		return []Action{Report{Level: slog.LevelWarn, Msg: "the CA rotation stalls: an agent does not use the store's CA", Status: status,
			Attrs: []any{"nodes", blocked}}}
	}
	// 1. The files, any node, in ID order.
	for _, n := range nodes {
		if !slices.Equal(n.Trust, r.Trust) || n.CertCA != r.Issuer {
			return []Action{SyncCA{NodeID: n.ID, Trust: r.Trust, Issuer: r.Issuer, Phase: r.Phase}}
		}
	}
	// 2. etcd, member by member. A member whose etcd runs without TLS
	// (--etcd-insecure, its agent's peer API on TLS) reports none, and
	// has nothing to restart for.
	if r.RollEtcd {
		pending := func(x memberNode) bool { return x.n.EtcdTrust != nil && !slices.Equal(x.n.EtcdTrust, r.Trust) }
		if slices.ContainsFunc(ms, pending) {
			sort.Slice(ms, func(i, j int) bool { return ms[i].m.Name < ms[j].m.Name })
			if wait := healthGate(ms, "CA rotation"); wait != nil {
				return wait
			}
			next := followerFirst(ms, o.Self.ID, pending)
			if next.n.ID == o.Self.ID && len(ms) > 1 {
				// The health gate passed: every other member can take the lead.
				return []Action{MoveLeader{To: handOnTo(ms, o.Self.ID).m.ID, Reason: "before restarting the leader to trust other CAs"}}
			}
			return []Action{SyncCA{NodeID: next.n.ID, Restart: true, Trust: r.Trust, Issuer: r.Issuer, Phase: r.Phase}}
		}
	}
	// 3. The record.
	return []Action{AdvanceCARotation{From: r.Phase, To: r.Next}}
}
