package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestPlanSettings(t *testing.T) {
	old := spec.Settings{"snapshot-count": "10000"}
	want := spec.Settings{"quota-backend-bytes": "4294967296", "snapshot-count": "20000"}
	// with returns a healthy member node on 3.6.16 running settings s.
	with := func(id string, s spec.Settings) Node {
		n := node(id, "member")
		m := *n.Member
		m.EtcdVersion, m.Settings = "3.6.16", s
		n.Member, n.Version, n.RaftIndex = &m, "3.6.16", 9
		return n
	}
	down := func(n Node) Node {
		n.Healthy = false
		return n
	}
	obs := func(settings spec.Settings, peers ...Node) Observed {
		o := leaderObs(int32(len(peers)), cluster(member("a", true), member("b", true), member("c", true)), peers...)
		o.Cluster.Members = o.Cluster.Members[:len(peers)]
		for i := range o.Cluster.Members {
			o.Cluster.Members[i].RaftIndex = peers[i].RaftIndex
			o.Cluster.Members[i].Healthy = peers[i].Healthy
		}
		o.Spec.EtcdVersion, o.Spec.EtcdSettings = "3.6.16", settings
		return o
	}
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{"every member runs the spec's settings: nothing", obs(want, with("a", want), with("b", want), with("c", want)), ""},
		{"none set and none run: nothing", obs(nil, with("a", nil), with("b", spec.Settings{}), with("c", nil)), ""},
		{"followers first, by name", obs(want, with("a", old), with("b", old), with("c", old)),
			"set-member-settings b [quota-backend-bytes=4294967296 snapshot-count=20000]"},
		{"then the next follower", obs(want, with("a", old), with("b", want), with("c", old)),
			"set-member-settings c [quota-backend-bytes=4294967296 snapshot-count=20000]"},
		{"the leader last, after handing leadership on", obs(want, with("a", old), with("b", want), with("c", want)),
			"move-leader to=" + hexID(member("b", true).ID) + " (before restarting the leader with new etcd settings)"},
		{"a single member restarts itself", obs(want, with("a", old)),
			"set-member-settings a [quota-backend-bytes=4294967296 snapshot-count=20000]"},
		{"settings removed from the spec go back to etcd's defaults", obs(nil, with("a", old), with("b", old)),
			"set-member-settings b []"},
		{"an unhealthy member holds the roll", obs(want, with("a", old), with("b", want), down(with("c", want))),
			"report[INFO] a rolling change waits for every member to be healthy"},
		{"a member behind the leader's log holds the roll",
			func() Observed {
				o := obs(want, with("a", old), with("b", want), with("c", old))
				o.Cluster.Members[0].RaftIndex = 9000
				return o
			}(),
			"report[INFO] a rolling change waits for a member to catch up"},
		{"a member down a while with other settings restarts with the spec's at once (a change called off)",
			func() Observed {
				o := obs(old, with("a", old), down(with("b", want)), with("c", old))
				o.Cluster.Members[1].UnhealthyFor = time.Minute
				return o
			}(),
			"set-member-settings b [snapshot-count=10000]"},
		{"a member down a moment waits for the health gate",
			obs(old, with("a", old), down(with("b", want)), with("c", old)),
			"report[INFO] a rolling change waits for every member to be healthy"},
		{"an unreachable agent holds the roll",
			func() Observed {
				o := obs(want, with("a", old), with("b", old), with("c", old))
				o.Peers = o.Peers[:2]
				return o
			}(),
			"report[INFO] etcd settings change waits: a member's agent is unreachable"},
		{"a version change goes first",
			func() Observed {
				o := obs(want, with("a", old), with("b", old), with("c", old))
				o.Spec.EtcdVersion = "3.7.3"
				for i := range o.Peers {
					o.Peers[i].Installed = []string{"3.6.16", "3.7.3"}
				}
				return o
			}(),
			"take-backup (before changing etcd to 3.7.3)"},
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
