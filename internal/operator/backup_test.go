package operator

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/cli"
)

func TestRestoreOutcome(t *testing.T) {
	member := func(id, cluster string, healthy bool) cli.AgentStatus {
		return cli.AgentStatus{ID: id, Role: cli.RoleMember, Healthy: healthy, ClusterID: cluster}
	}
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	goneAt := func(ago time.Duration) *metav1.Time { return &metav1.Time{Time: now.Add(-ago)} }
	tests := []struct {
		name          string
		st            v1alpha1.EtcdRestoreStatus
		agents        []cli.AgentStatus
		ended, failed bool
	}{
		{name: "in place: a new etcd cluster is a success",
			st:     v1alpha1.EtcdRestoreStatus{ReplacedClusterID: "c1", Step: "restoring"},
			agents: []cli.AgentStatus{member("a-0", "c2", true), member("a-1", "c2", true)},
			ended:  true},
		{name: "in place: the old cluster still there means the command was deleted by hand",
			st:     v1alpha1.EtcdRestoreStatus{ReplacedClusterID: "c1", Step: "restoring"},
			agents: []cli.AgentStatus{member("a-0", "c1", true), member("a-1", "c1", true)},
			ended:  true, failed: true},
		{name: "in place: an unhealthy member's stale ID does not count",
			st:     v1alpha1.EtcdRestoreStatus{ReplacedClusterID: "c1"},
			agents: []cli.AgentStatus{member("a-0", "c1", false), member("a-1", "c2", true)},
			ended:  true},
		{name: "no member reports yet: wait",
			st:     v1alpha1.EtcdRestoreStatus{ReplacedClusterID: "c1", Step: "lifting"},
			agents: []cli.AgentStatus{member("a-0", "", false), {ID: "a-1", Role: cli.RoleStandby}},
			ended:  false},
		{name: "no member reports long after the command left: fail, and say to check",
			st:     v1alpha1.EtcdRestoreStatus{ReplacedClusterID: "c1", Step: "lifting", CommandEndTime: goneAt(11 * time.Minute)},
			agents: []cli.AgentStatus{member("a-0", "", false)},
			ended:  true, failed: true},
		{name: "no member reports soon after the command left: wait",
			st:     v1alpha1.EtcdRestoreStatus{Step: "lifting", CommandEndTime: goneAt(time.Minute)},
			agents: []cli.AgentStatus{member("a-0", "", false)},
			ended:  false},
		{name: "no cluster before, the engine seen at work: a success",
			st:     v1alpha1.EtcdRestoreStatus{Step: "verifying"},
			agents: []cli.AgentStatus{member("a-0", "c9", true)},
			ended:  true},
		{name: "no cluster before, the engine never seen at work: no success claimed",
			st:     v1alpha1.EtcdRestoreStatus{},
			agents: []cli.AgentStatus{member("a-0", "c9", true)},
			ended:  true, failed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ended, failed, msg := restoreOutcome(tc.st, "b1", cli.ClusterStatus{Agents: tc.agents}, now)
			if ended != tc.ended || failed != tc.failed || msg == "" {
				t.Errorf("ended %v failed %v (%q), want ended %v failed %v", ended, failed, msg, tc.ended, tc.failed)
			}
		})
	}
}

func TestOwnPodAndSameStore(t *testing.T) {
	c := &v1alpha1.EtcdCluster{}
	c.Name = "etcd"
	for id, want := range map[string]bool{"etcd-0": true, "etcd-12": true, "etcd-x": false, "other-0": false, "etcd-a-0": false, "etcd-01": false} {
		if got := ownPod(c, id); got != want {
			t.Errorf("ownPod(%q) = %v, want %v", id, got, want)
		}
	}
	if !sameStore("s3://b/p/", "s3://b/p") || sameStore("s3://b/p", "s3://b/q") {
		t.Errorf("sameStore")
	}
}
