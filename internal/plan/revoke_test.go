package plan

import (
	"fmt"
	"testing"
)

func TestPlanRevoked(t *testing.T) {
	revoke := func(o Observed, ids ...string) Observed {
		o.Revoked = map[string]bool{}
		for _, id := range ids {
			o.Revoked[id] = true
		}
		return o
	}
	three := func(peers ...Node) Observed {
		return leaderObs(3, cluster(member("a", true), member("b", true), member("c", true)), peers...)
	}
	stopped := func(id string) Node { n := node(id, "member"); n.EtcdWanted, n.Healthy = false, false; return n }
	tests := []struct {
		name string
		obs  Observed
		want []string
	}{
		{name: "a revoked member's node, unreached, is removed at once",
			obs:  revoke(three(node("a", "member"), node("c", "member"), node("d", "standby")), "b"),
			want: []string{fmt.Sprintf("remove-member %x node=b (its node is revoked)", member("b", true).ID)}},
		{name: "removed even without a standby to replace it",
			obs:  revoke(three(node("a", "member"), node("c", "member")), "b"),
			want: []string{fmt.Sprintf("remove-member %x node=b (its node is revoked)", member("b", true).ID)}},
		{name: "not while removing it would lose quorum",
			obs: revoke(leaderObs(3, cluster(member("a", true), member("b", true), member("c", false)),
				node("a", "member"), node("b", "member")), "b"),
			want: []string{"report[WARN] a revoked node's member stays until removing it keeps a quorum"}},
		{name: "a revoked standby never joins",
			obs:  revoke(leaderObs(3, cluster(member("a", true), member("c", true)), node("a", "member"), node("c", "member"), node("d", "standby")), "d"),
			want: []string{"report[WARN] the spec asks for more members, but no standby agent is available"}},
		{name: "another standby joins in its place",
			obs:  revoke(leaderObs(3, cluster(member("a", true), member("c", true)), node("a", "member"), node("c", "member"), node("d", "standby"), node("e", "standby")), "d"),
			want: []string{"add-member e"}},
		{name: "the revoked node's own agent stops its etcd and leads nothing",
			obs:  revoke(three(node("a", "member"), node("c", "member"), node("d", "standby")), "a"),
			want: []string{"stop-revoked", "report[ERROR] " + MsgRevoked}},
		{name: "and keeps it stopped",
			obs:  revoke(withSelf(three(node("a", "member"), stopped("b")), "b"), "b"),
			want: []string{"report[ERROR] " + MsgRevoked}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assertPlan(t, tt.obs, tt.want) })
	}
}
