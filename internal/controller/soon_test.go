package controller

import (
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// The loop looks again soon while an election is under way or a learner
// waits for its promotion, and not otherwise.
func TestLooksAgainSoon(t *testing.T) {
	member := &plan.Membership{ClusterToken: "tok"}
	self := func(leader uint64) plan.Node {
		return plan.Node{ID: "a", Member: member, HasData: true, Healthy: true, MemberID: 1, RaftLeader: leader}
	}
	peer := func(id uint64, healthy bool) plan.Node {
		return plan.Node{ID: "p", Member: member, HasData: true, Healthy: healthy, MemberID: id, RaftLeader: id}
	}
	tests := []struct {
		name string
		obs  plan.Observed
		want bool
	}{
		{"a standby", plan.Observed{Self: plan.Node{ID: "a"}}, false},
		{"no raft leader", plan.Observed{Self: self(0)}, true},
		{"this node leads", plan.Observed{Self: self(1)}, false},
		{"a healthy leader's agent answers", plan.Observed{Self: self(2), Peers: []plan.Node{self(2), peer(2, true)}}, false},
		{"the leader's etcd does not answer its agent", plan.Observed{Self: self(2), Peers: []plan.Node{self(2), peer(2, false)}}, true},
		{"the leader's agent is not reached", plan.Observed{Self: self(2), Peers: []plan.Node{self(2)}}, true},
		{"a learner to promote", plan.Observed{Self: self(1), Cluster: &plan.ClusterView{Members: []plan.Member{{ID: 1}, {ID: 2, IsLearner: true}}}}, true},
		{"voters only", plan.Observed{Self: self(1), Cluster: &plan.ClusterView{Members: []plan.Member{{ID: 1}, {ID: 2}}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := leaderInDoubt(tt.obs) || learnerWaiting(tt.obs); got != tt.want {
				t.Errorf("looks again soon = %v, want %v", got, tt.want)
			}
		})
	}
}

// A node announces a change of its own state, and only that.
func TestAnnouncedState(t *testing.T) {
	standby := plan.Node{ID: "a"}
	member := plan.Node{ID: "a", Member: &plan.Membership{ClusterToken: "tok"}, HasData: true}
	healthy := member
	healthy.Healthy = true
	healthy.RaftIndex = 42 // not announced: it changes all the time
	if announcedState(standby) == announcedState(member) {
		t.Error("joining a cluster is not announced")
	}
	if announcedState(member) == announcedState(healthy) {
		t.Error("etcd coming up is not announced")
	}
	again := healthy
	again.RaftIndex = 43
	if announcedState(healthy) != announcedState(again) {
		t.Error("a raft index that moves on is announced")
	}
}
