package controller

import (
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/plan"
)

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
