package status

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// The leader exports the cluster as it sees it; another agent exports
// nothing of it, and a raft leader change is counted.
func TestClusterFigures(t *testing.T) {
	g := NewGauges(prometheus.NewRegistry())
	obs := plan.Observed{Self: plan.Node{RaftLeader: 1}, Cluster: &plan.ClusterView{
		Members: []plan.Member{
			{ID: 1, Name: "a", Healthy: true, RaftIndex: 100, DBSize: 4096, DBSizeInUse: 1024},
			{ID: 2, Name: "b", Healthy: true, RaftIndex: 90, DBSize: 8192, DBSizeInUse: 2048},
			{ID: 3, Name: "c", Healthy: true, IsLearner: true, RaftIndex: 10},
			{ID: 4, Name: "d"},
		},
		AlarmsKnown: true, NoSpace: []uint64{2},
	}}
	g.Set(obs)
	m := g.met
	for _, c := range []struct {
		got  float64
		want float64
		what string
	}{
		{testutil.ToFloat64(m.clusterMembers.WithLabelValues("voter")), 2, "voters"},
		{testutil.ToFloat64(m.clusterMembers.WithLabelValues("learner")), 1, "learners"},
		{testutil.ToFloat64(m.clusterMembers.WithLabelValues("unhealthy")), 1, "unhealthy"},
		{testutil.ToFloat64(m.memberLag.WithLabelValues("b")), 10, "b's lag"},
		{testutil.ToFloat64(m.memberLag.WithLabelValues("c")), 90, "c's lag"},
		{testutil.ToFloat64(m.memberDBSize.WithLabelValues("b", "in_use")), 2048, "b in use"},
		{testutil.ToFloat64(m.alarms.WithLabelValues("NOSPACE")), 1, "NOSPACE"},
		{testutil.ToFloat64(m.leaderChanges), 0, "leader changes"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	// Not leading any more: the cluster's figures go; a new raft leader
	// is counted.
	g.Set(plan.Observed{Self: plan.Node{RaftLeader: 2}})
	if n := testutil.CollectAndCount(m.clusterMembers) + testutil.CollectAndCount(m.memberLag) + testutil.CollectAndCount(m.alarms); n != 0 {
		t.Errorf("%d cluster series on an agent that does not lead", n)
	}
	if got := testutil.ToFloat64(m.leaderChanges); got != 1 {
		t.Errorf("leader changes = %v, want 1", got)
	}
}
