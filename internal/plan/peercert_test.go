package plan

import (
	"strings"
	"testing"
	"time"
)

const marker = "node.main.etcd-manager.internal"

// certNode is a healthy member's agent whose certificate carries mark
// ("" for none) and whose etcd requires check of peers.
func certNode(id, mark, check string) Node {
	n := healthyNode(id)
	m := *n.Member
	m.PeerCertHostname = check
	n.Member, n.CertMarker = &m, mark
	return n
}

func TestPlanPeerCertCheck(t *testing.T) {
	down := func(n Node) Node {
		n.Healthy = false
		return n
	}
	optOut := func(n Node) Node {
		n.PeerCertCheckOff = true
		return n
	}
	obs := func(peers ...Node) Observed {
		o := leaderObs(int32(len(peers)), cluster(member("a", true), member("b", true), member("c", true), member("d", true), member("e", true)), peers...)
		o.Cluster.Members = o.Cluster.Members[:len(peers)]
		for i := range o.Cluster.Members {
			o.Cluster.Members[i].RaftIndex = peers[i].RaftIndex
			o.Cluster.Members[i].Healthy = peers[i].Healthy
		}
		return o
	}
	with := func(o Observed, f func(*Observed)) Observed { f(&o); return o }
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{"every member has the check and the marker: nothing",
			obs(certNode("a", marker, marker), certNode("b", marker, marker), certNode("c", marker, marker)), ""},
		{"no member has the marker (older agents, or plain http): the check stays off",
			obs(certNode("a", "", ""), certNode("b", "", ""), certNode("c", "", "")), ""},
		{"one member's certificate still lacks the marker: the check stays off",
			obs(certNode("a", marker, ""), certNode("b", marker, ""), certNode("c", "", "")), ""},
		{"one member's agent asks for it off: it stays off",
			obs(certNode("a", marker, ""), optOut(certNode("b", marker, "")), certNode("c", marker, "")), ""},
		{"every member reports the marker: a follower first, by name",
			obs(certNode("a", marker, ""), certNode("b", marker, ""), certNode("c", marker, "")),
			"set-peer-cert-check b " + marker},
		{"then the next follower",
			obs(certNode("a", marker, ""), certNode("b", marker, marker), certNode("c", marker, "")),
			"set-peer-cert-check c " + marker},
		{"the leader last, after handing leadership on",
			obs(certNode("a", marker, ""), certNode("b", marker, marker), certNode("c", marker, marker)),
			"move-leader to=" + hexID(member("b", true).ID) + " (before restarting the leader with another peer certificate check)"},
		{"then the leader, no longer leading, is restarted by the new one",
			with(obs(certNode("b", marker, marker), certNode("a", marker, ""), certNode("c", marker, marker)), func(o *Observed) {
				o.Cluster.Members[0], o.Cluster.Members[1] = member("b", true), member("a", true)
			}),
			"set-peer-cert-check a " + marker},
		{"a single member restarts itself",
			obs(certNode("a", marker, "")), "set-peer-cert-check a " + marker},
		{"an unhealthy member holds the roll on",
			obs(certNode("a", marker, ""), certNode("b", marker, marker), down(certNode("c", marker, ""))),
			"report[INFO] a rolling change waits for every member to be healthy"},
		{"a member behind the leader's log holds the roll on",
			with(obs(certNode("a", marker, ""), certNode("b", marker, ""), certNode("c", marker, "")), func(o *Observed) {
				o.Cluster.Members[0].RaftIndex = 9000
			}),
			"report[INFO] a rolling change waits for a member to catch up"},
		{"an unreachable agent holds the roll",
			with(obs(certNode("a", marker, ""), certNode("b", marker, ""), certNode("c", marker, "")), func(o *Observed) {
				o.Peers = o.Peers[:2]
			}),
			"report[INFO] the peer certificate check waits: a member's agent is unreachable"},
		{"an agent that asks for it off: turned off again, one member at a time",
			obs(certNode("a", marker, marker), certNode("b", marker, marker), optOut(certNode("c", marker, marker))),
			"set-peer-cert-check b off"},
		{"a member back on an older agent, cut off in a cluster of five: the others turn it off, quorum kept",
			obs(certNode("a", marker, marker), down(certNode("b", "", "")), certNode("c", marker, marker), certNode("d", marker, marker), certNode("e", marker, marker)),
			"set-peer-cert-check c off"},
		{"a member back on an older agent, cut off in a cluster of three: turning the check off would lose quorum",
			obs(certNode("a", marker, marker), certNode("b", marker, marker), down(certNode("c", "", ""))),
			"report[WARN] " + MsgPeerCertCheckStalled},
		{"a member back on an older agent and not cut off (all others already off): nothing left",
			obs(certNode("a", marker, ""), certNode("b", marker, ""), certNode("c", "", "")), ""},
		{"another rolling change goes first",
			with(obs(certNode("a", marker, ""), certNode("b", marker, ""), certNode("c", marker, "")), func(o *Observed) {
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

// The stalled report is a status line that names the member cut off and
// those that refuse it, and says what to do.
func TestPlanPeerCertCheckStalledStatus(t *testing.T) {
	o := leaderObs(3, cluster(member("a", true), member("b", true), member("c", false)),
		certNode("a", marker, marker), certNode("b", marker, marker), certNode("c", "", ""))
	o.Peers[2].Healthy = false
	lines := StatusLines(Plan(o))
	if len(lines) != 1 {
		t.Fatalf("status lines %q, want one", lines)
	}
	for _, want := range []string{"c has no node marker", "a, b refuse its raft traffic", "--etcd-peer-cert-check=false"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("status %q lacks %q", lines[0], want)
		}
	}
}

// A new cluster requires the marker from the start when every node it is
// made of carries it, and not otherwise.
func TestCreateClusterPeerCertHostname(t *testing.T) {
	standby := func(id, mark string) Node {
		n := node(id, "standby")
		n.CertMarker = mark
		return n
	}
	for _, tt := range []struct {
		name  string
		peers []Node
		want  string
	}{
		{"all three carry the marker", []Node{standby("a", marker), standby("b", marker), standby("c", marker)}, marker},
		{"one does not", []Node{standby("a", marker), standby("b", ""), standby("c", marker)}, ""},
		{"one asks for the check off", []Node{standby("a", marker), func() Node { n := standby("b", marker); n.PeerCertCheckOff = true; return n }(), standby("c", marker)}, ""},
		{"the unchosen fourth does not matter", []Node{standby("a", marker), standby("b", marker), standby("c", marker), standby("d", "")}, marker},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := Observed{Spec: specN(3), Self: tt.peers[0], Peers: tt.peers, LockHeld: true, Grace: time.Minute, PendingTimeout: time.Minute}
			acts := Plan(o)
			if len(acts) != 1 {
				t.Fatalf("plan %q", describe(acts))
			}
			c, ok := acts[0].(CreateCluster)
			if !ok || c.PeerCertHostname != tt.want {
				t.Fatalf("plan %q (%+v), want a creation requiring %q", describe(acts), acts[0], tt.want)
			}
		})
	}
}

// While the members require the marker, a standby whose certificate
// lacks it is not added: it could not talk to them.
func TestStandbyWithoutTheMarkerIsNotAdded(t *testing.T) {
	standby := func(id, mark string) Node {
		n := node(id, "standby")
		n.CertMarker = mark
		return n
	}
	members := func(check string) []Node {
		return []Node{certNode("a", marker, check), certNode("b", marker, check)}
	}
	for _, tt := range []struct {
		name    string
		members []Node
		standby Node
		want    string
	}{
		{"the members require it, the standby carries it", members(marker), standby("c", marker), "add-member c"},
		{"the members require it, the standby lacks it", members(marker), standby("c", ""),
			"report[WARN] the spec asks for more members, but the members' etcd requires the node marker"},
		{"the members do not require it", members(""), standby("c", ""), "add-member c"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			peers := append(tt.members, tt.standby)
			o := leaderObs(3, cluster(member("a", true), member("b", true)), peers...)
			if got := describe(Plan(o)); !strings.HasPrefix(got, tt.want) {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}
