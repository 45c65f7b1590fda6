package operator

import (
	"testing"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/cli"
)

func TestRestoreOutcome(t *testing.T) {
	member := func(id, cluster string, healthy bool) cli.AgentStatus {
		return cli.AgentStatus{ID: id, Role: cli.RoleMember, Healthy: healthy, ClusterID: cluster}
	}
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
			ended, failed, msg := restoreOutcome(tc.st, "b1", cli.ClusterStatus{Agents: tc.agents})
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
