package controller

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func member(token string, newCluster, pending bool) *etcdproc.MemberState {
	return &etcdproc.MemberState{ClusterToken: token, EtcdVersion: "3.6.16", NewCluster: newCluster, Pending: pending}
}

// describe renders actions compactly for comparison.
func describe(actions []Action) string {
	var parts []string
	for _, a := range actions {
		if r, ok := a.(Report); ok {
			parts = append(parts, fmt.Sprintf("report[%s] %s", r.Level, r.Msg))
			continue
		}
		parts = append(parts, a.String())
	}
	return strings.Join(parts, "; ")
}

func TestPlan(t *testing.T) {
	spec1 := &spec.ClusterSpec{MemberCount: 1, EtcdVersion: "3.6.16"}
	spec3 := &spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"}
	created := &spec.ClusterCreated{Timestamp: 1}
	bare := Node{ID: "a"}
	running := Node{ID: "a", Member: member("tok", false, false), HasData: true, EtcdWanted: true, Healthy: true, Version: "3.6.16"}
	stopped := Node{ID: "a", Member: member("tok", false, false), HasData: true}

	tests := []struct {
		name string
		obs  Observed
		// want lists the actions, rendered by describe, as a substring
		// match per action in order.
		want []string
	}{
		{
			name: "no spec yet",
			obs:  Observed{Leader: true, Self: bare, Peers: []Node{bare}},
			want: []string{"report[INFO] waiting for a cluster spec"},
		},
		{
			name: "store unreachable, member not running: start etcd anyway",
			obs:  Observed{Leader: true, StoreErr: errors.New("down"), Self: stopped, Peers: []Node{stopped}},
			want: []string{"start-etcd", "report[ERROR] backup store unreachable"},
		},
		{
			name: "store unreachable, etcd running: leave it alone",
			obs:  Observed{Leader: true, StoreErr: errors.New("down"), Self: running, Peers: []Node{running}},
			want: []string{"report[ERROR] backup store unreachable"},
		},
		{
			name: "invalid spec keeps etcd running",
			obs:  Observed{Leader: true, SpecErr: errors.New("junk"), Self: running, Peers: []Node{running}},
			want: []string{"report[ERROR] cluster spec is invalid"},
		},
		{
			name: "invalid spec still re-adopts local etcd",
			obs:  Observed{Leader: true, SpecErr: errors.New("junk"), Self: stopped, Peers: []Node{stopped}},
			want: []string{"start-etcd", "report[ERROR] cluster spec is invalid"},
		},
		{
			name: "create single-member cluster",
			obs:  Observed{Leader: true, Spec: spec1, Self: bare, Peers: []Node{bare}},
			want: []string{"create-cluster [a] 3.6.16"},
		},
		{
			name: "create picks the lowest IDs among enough agents",
			obs: Observed{Leader: true, Spec: spec3, Self: Node{ID: "c"},
				Peers: []Node{{ID: "d"}, {ID: "c"}, {ID: "a"}, {ID: "b"}}},
			want: []string{"create-cluster [a b c] 3.6.16"},
		},
		{
			name: "too few agents to create",
			obs:  Observed{Leader: true, Spec: spec3, Self: bare, Peers: []Node{bare}},
			want: []string{"report[INFO] waiting for enough agents"},
		},
		{
			name: "no binary for the spec version",
			obs:  Observed{Leader: true, Spec: spec1, SpecBinaryErr: errors.New("no etcd binary in /opt"), Self: bare, Peers: []Node{bare}},
			want: []string{"report[ERROR] cannot create the cluster: no etcd binary"},
		},
		{
			name: "created marker without members: never create, ask for restore",
			obs:  Observed{Leader: true, Spec: spec1, Created: created, Self: bare, Peers: []Node{bare}},
			want: []string{"report[ERROR] " + MsgNoMembers},
		},
		{
			name: "not leader: no cluster action",
			obs:  Observed{Leader: false, Spec: spec1, Self: bare, Peers: []Node{bare}},
			want: nil,
		},
		{
			name: "pending creation is confirmed before anything else",
			obs: Observed{Leader: true, Spec: spec1, Created: created,
				Self: Node{ID: "a", Member: member("tok", true, true)}, Peers: []Node{{ID: "a", Member: member("tok", true, true)}}},
			want: []string{"confirm-create tok"},
		},
		{
			name: "restart re-adopts local member",
			obs:  Observed{Leader: true, Spec: spec1, Created: created, Self: stopped, Peers: []Node{stopped}},
			want: []string{"start-etcd"},
		},
		{
			name: "healthy member in spec: nothing to do",
			obs:  Observed{Leader: true, Spec: spec1, Created: created, Self: running, Peers: []Node{running}},
			want: nil,
		},
		{
			name: "new cluster becomes bootstrapped once healthy",
			obs: func() Observed {
				n := running
				n.Member = member("tok", true, false)
				return Observed{Leader: true, Spec: spec1, Created: created, Self: n, Peers: []Node{n}}
			}(),
			want: []string{"mark-bootstrapped"},
		},
		{
			name: "new cluster not yet healthy: wait",
			obs: func() Observed {
				n := running
				n.Member = member("tok", true, false)
				n.Healthy = false
				return Observed{Leader: true, Spec: spec1, Created: created, Self: n, Peers: []Node{n}}
			}(),
			want: nil,
		},
		{
			name: "data wiped under a bootstrapped member: do not start, report loss",
			obs: func() Observed {
				n := stopped
				n.HasData = false
				return Observed{Leader: true, Spec: spec1, Created: created, Self: n, Peers: []Node{n}}
			}(),
			want: []string{"report[ERROR] this node's etcd data is missing", "report[ERROR] " + MsgNoMembers},
		},
		{
			name: "version differs from spec: reported, not acted on",
			obs: Observed{Leader: true, Spec: &spec.ClusterSpec{MemberCount: 1, EtcdVersion: "3.5.35"}, Created: created,
				Self: running, Peers: []Node{running}},
			want: []string{"report[WARN] spec asks for another etcd version"},
		},
		{
			name: "member count differs: reported, not acted on",
			obs:  Observed{Leader: true, Spec: spec3, Created: created, Self: running, Peers: []Node{running}},
			want: []string{"report[WARN] spec asks for another member count"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Plan(tt.obs)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d actions (%s), want %d (%s)", len(got), describe(got), len(tt.want), strings.Join(tt.want, "; "))
			}
			for i, w := range tt.want {
				if d := describe(got[i : i+1]); !strings.Contains(d, w) {
					t.Errorf("action %d = %q, want %q", i, d, w)
				}
			}
		})
	}
}

// Plan is pure: the same observation always gives the same plan.
func TestPlanIsDeterministic(t *testing.T) {
	obs := Observed{Leader: true, Spec: &spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"},
		Peers: []Node{{ID: "e"}, {ID: "b"}, {ID: "d"}, {ID: "a"}, {ID: "c"}}}
	first := describe(Plan(obs))
	for range 50 {
		if got := describe(Plan(obs)); got != first {
			t.Fatalf("plan changed: %q vs %q", got, first)
		}
	}
	if first != "create-cluster [a b c] 3.6.16" {
		t.Errorf("plan = %q", first)
	}
}
