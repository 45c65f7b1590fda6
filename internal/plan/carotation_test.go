package plan

import (
	"errors"
	"strings"
	"testing"
)

const (
	oldCA = "AA:01"
	newCA = "BB:02"
)

// caNode is a healthy member's agent that trusts trust in its files and
// etcd trusts etcd, with a certificate from issuer.
func caNode(id string, trust, etcd []string, issuer string) Node {
	n := healthyNode(id)
	n.Trust, n.EtcdTrust, n.CertCA = trust, etcd, issuer
	return n
}

func TestPlanCARotation(t *testing.T) {
	old, both, fresh := []string{oldCA}, []string{oldCA, newCA}, []string{newCA}
	trustBoth := &CARotation{Phase: "trust-both", Trust: both, Issuer: oldCA, RollEtcd: true, Next: "trusted"}
	reissue := &CARotation{Phase: "reissue", Trust: both, Issuer: newCA, Next: "reissued"}
	dropOld := &CARotation{Phase: "drop-old", Trust: fresh, Issuer: newCA, RollEtcd: true}
	obs := func(r *CARotation, peers ...Node) Observed {
		o := leaderObs(int32(len(peers)), cluster(member("a", true), member("b", true), member("c", true)), peers...)
		o.Cluster.Members = o.Cluster.Members[:len(peers)]
		for i := range o.Cluster.Members {
			o.Cluster.Members[i].RaftIndex = peers[i].RaftIndex
			o.Cluster.Members[i].Healthy = peers[i].Healthy
		}
		o.CARotation = r
		return o
	}
	with := func(o Observed, f func(*Observed)) Observed { f(&o); return o }
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{"no rotation: nothing",
			obs(nil, caNode("a", old, old, oldCA), caNode("b", old, old, oldCA), caNode("c", old, old, oldCA)), ""},
		{"an unusable record: reported, nothing done",
			with(obs(nil, caNode("a", old, old, oldCA), caNode("b", old, old, oldCA), caNode("c", old, old, oldCA)), func(o *Observed) {
				o.CARotationErr = errors.New("pki: invalid CA rotation record")
			}),
			"report[WARN] the CA rotation record cannot be read or used"},
		{"trust-both: the files first, node by node in ID order, no restart",
			obs(trustBoth, caNode("a", old, old, oldCA), caNode("b", old, old, oldCA), caNode("c", old, old, oldCA)),
			"sync-ca a"},
		{"trust-both: then the next node's files",
			obs(trustBoth, caNode("a", both, old, oldCA), caNode("b", old, old, oldCA), caNode("c", old, old, oldCA)),
			"sync-ca b"},
		{"trust-both: every file done, etcd restarts a follower first",
			obs(trustBoth, caNode("a", both, old, oldCA), caNode("b", both, old, oldCA), caNode("c", both, old, oldCA)),
			"sync-ca b restart-etcd"},
		{"trust-both: the leader last, after handing leadership on",
			obs(trustBoth, caNode("a", both, old, oldCA), caNode("b", both, both, oldCA), caNode("c", both, both, oldCA)),
			"move-leader to=" + hexID(member("b", true).ID) + " (before restarting the leader to trust other CAs)"},
		{"trust-both: an unhealthy member holds the restarts",
			with(obs(trustBoth, caNode("a", both, old, oldCA), caNode("b", both, old, oldCA), caNode("c", both, old, oldCA)), func(o *Observed) {
				o.Cluster.Members[2].Healthy = false
			}),
			"report[INFO] a rolling change waits for every member to be healthy"},
		{"trust-both: every node there: the phase is recorded",
			obs(trustBoth, caNode("a", both, both, oldCA), caNode("b", both, both, oldCA), caNode("c", both, both, oldCA)),
			"advance-ca-rotation trust-both trusted"},
		{"a gate: only a report, and maintenance goes on",
			obs(&CARotation{Phase: "trusted", Trust: both, Issuer: oldCA, Gate: "rotate-ca continue"},
				caNode("a", both, both, oldCA), caNode("b", both, both, oldCA), caNode("c", both, both, oldCA)),
			"report[INFO] " + MsgCARotationGate},
		{"reissue: each node takes a certificate from the new CA, no restart",
			obs(reissue, caNode("a", both, both, newCA), caNode("b", both, both, oldCA), caNode("c", both, both, oldCA)),
			"sync-ca b"},
		{"reissue: every node there",
			obs(reissue, caNode("a", both, both, newCA), caNode("b", both, both, newCA), caNode("c", both, both, newCA)),
			"advance-ca-rotation reissue reissued"},
		{"drop-old: files, then etcd, as for trust-both",
			obs(dropOld, caNode("a", fresh, both, newCA), caNode("b", fresh, both, newCA), caNode("c", fresh, both, newCA)),
			"sync-ca b restart-etcd"},
		{"drop-old: every node there: the rotation ends",
			obs(dropOld, caNode("a", fresh, fresh, newCA), caNode("b", fresh, fresh, newCA), caNode("c", fresh, fresh, newCA)),
			"finish-ca-rotation drop-old"},
		{"an unreachable member's agent holds the rotation",
			with(obs(trustBoth, caNode("a", old, old, oldCA), caNode("b", old, old, oldCA), caNode("c", old, old, oldCA)), func(o *Observed) {
				o.Peers = o.Peers[:2]
			}),
			"report[INFO] the CA rotation waits: a member's agent is unreachable"},
		{"a standby agent's files are synced too",
			with(obs(reissue, caNode("a", both, both, newCA), caNode("b", both, both, newCA), caNode("c", both, both, newCA)), func(o *Observed) {
				s := node("d", "standby")
				s.Trust, s.CertCA = both, oldCA
				o.Peers = append(o.Peers, s)
			}),
			"sync-ca d"},
		{"an agent on --pki-dir stalls it, saying so",
			with(obs(trustBoth, caNode("a", old, old, oldCA), caNode("b", old, old, oldCA), caNode("c", old, old, oldCA)), func(o *Observed) {
				o.Peers[1].CAFromDir = true
			}),
			"report[WARN] the CA rotation stalls: an agent does not use the store's CA"},
		{"an agent without TLS stalls it",
			with(obs(trustBoth, caNode("a", old, old, oldCA), caNode("b", old, old, oldCA), caNode("c", old, old, oldCA)), func(o *Observed) {
				o.Peers[2].Trust = nil
			}),
			"report[WARN] the CA rotation stalls"},
		{"a member whose etcd runs without TLS (--etcd-insecure) is not restarted",
			obs(trustBoth, caNode("a", both, both, oldCA), caNode("b", both, nil, oldCA), caNode("c", both, both, oldCA)),
			"advance-ca-rotation trust-both trusted"},
		{"another rolling change goes first",
			with(obs(trustBoth, caNode("a", old, old, oldCA), caNode("b", old, old, oldCA), caNode("c", old, old, oldCA)), func(o *Observed) {
				o.Spec.EtcdSettings = map[string]string{"snapshot-count": "20000"}
			}),
			"set-member-settings b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := describe(Plan(tt.obs))
			if (tt.want == "" && got != "") || !strings.HasPrefix(got, tt.want) {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

// A stalled rotation is a status line naming the agents that hold it.
func TestPlanCARotationStalledStatus(t *testing.T) {
	both := []string{oldCA, newCA}
	o := leaderObs(3, cluster(member("a", true), member("b", true), member("c", true)),
		caNode("a", both, both, oldCA), caNode("b", both, both, oldCA), caNode("c", both, both, oldCA))
	o.Peers[1].CAFromDir = true
	o.CARotation = &CARotation{Phase: "trust-both", Trust: both, Issuer: oldCA, RollEtcd: true, Next: "trusted"}
	lines := StatusLines(Plan(o))
	if len(lines) != 1 || !strings.Contains(lines[0], "b takes its CA from --pki-dir") || !strings.Contains(lines[0], "phase trust-both") {
		t.Fatalf("status lines %q", lines)
	}
}
