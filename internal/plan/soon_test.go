package plan

import (
	"testing"
)

// The loop looks again soon while an election is under way or a learner
// waits for its promotion, and not otherwise.
func TestLooksAgainSoon(t *testing.T) {
	member := &Membership{ClusterToken: "tok"}
	self := func(leader uint64) Node {
		return Node{ID: "a", Member: member, HasData: true, Healthy: true, MemberID: 1, RaftLeader: leader}
	}
	peer := func(id uint64, healthy bool) Node {
		return Node{ID: "p", Member: member, HasData: true, Healthy: healthy, MemberID: id, RaftLeader: id}
	}
	tests := []struct {
		name string
		obs  Observed
		want bool
	}{
		{"a standby", Observed{Self: Node{ID: "a"}}, false},
		{"no raft leader", Observed{Self: self(0)}, true},
		{"this node leads", Observed{Self: self(1)}, false},
		{"a healthy leader's agent answers", Observed{Self: self(2), Peers: []Node{self(2), peer(2, true)}}, false},
		{"the leader's etcd does not answer its agent", Observed{Self: self(2), Peers: []Node{self(2), peer(2, false)}}, true},
		{"the leader's agent is not reached", Observed{Self: self(2), Peers: []Node{self(2)}}, true},
		{"a learner to promote", Observed{Self: self(1), Cluster: &ClusterView{Members: []Member{{ID: 1}, {ID: 2, IsLearner: true}}}}, true},
		{"voters only", Observed{Self: self(1), Cluster: &ClusterView{Members: []Member{{ID: 1}, {ID: 2}}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := LookAgainSoon(tt.obs); got != tt.want {
				t.Errorf("looks again soon = %v, want %v", got, tt.want)
			}
		})
	}
}
