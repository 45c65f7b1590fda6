package plan

import (
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestPlanDefrag(t *testing.T) {
	const mib = 1 << 20
	// obs is a 3-member cluster led by a; sizes are each member's
	// database and in-use bytes, in MiB.
	obs := func(sizes ...[2]int64) Observed {
		peers := []Node{healthyNode("a"), healthyNode("b"), healthyNode("c")}
		o := leaderObs(3, cluster(member("a", true), member("b", true), member("c", true)), peers...)
		for i := range o.Cluster.Members {
			o.Cluster.Members[i].RaftIndex = 9
			o.Cluster.Members[i].ClientURLs = []string{"https://" + o.Cluster.Members[i].Name + ":4001"}
			o.Cluster.Members[i].DBSize, o.Cluster.Members[i].DBSizeInUse = sizes[i][0]*mib, sizes[i][1]*mib
		}
		o.DefragWindowOpen = true
		return o
	}
	fragmented, compact := [2]int64{500, 100}, [2]int64{100, 90}
	defragCmd := func(done ...string) Command {
		c := cmd("d1", spec.Command{Defrag: &spec.DefragCommand{}}, spec.CommandRunning)
		c.Status.Defragmented = done
		return c
	}
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{"nothing fragmented: nothing", obs(compact, compact, compact), ""},
		{"a fragmented follower", obs(compact, compact, fragmented), "defrag c isolated (419430400 of its 524288000 bytes are free"},
		{"followers first, by name", obs(fragmented, fragmented, fragmented), "defrag b isolated ("},
		{"the leader's member last, after handing leadership on", obs(fragmented, compact, compact),
			"move-leader to=" + hexID(member("b", true).ID) + " (before defragmenting the leader's member)"},
		{"outside the window: said, and nothing done", func() Observed { o := obs(compact, fragmented, compact); o.DefragWindowOpen = false; return o }(),
			"report[INFO] defragmentation is due and waits for its maintenance window"},
		{"outside the window, nothing due: nothing", func() Observed { o := obs(compact, compact, compact); o.DefragWindowOpen = false; return o }(), ""},
		{"outside the window, a command: only the members it asks for", func() Observed {
			o := obs(fragmented, fragmented, fragmented)
			o.DefragWindowOpen = false
			o.Commands = []Command{defragCmd("b", "c")}
			return o
		}(), "move-leader to="},
		{"outside the window, a command done: finished, the policy's due members wait", func() Observed {
			o := obs(fragmented, fragmented, fragmented)
			o.DefragWindowOpen = false
			o.Commands = []Command{defragCmd("a", "b", "c")}
			return o
		}(), "finish-defrag d1"},
		{"the policy off: nothing", func() Observed {
			o := obs(compact, fragmented, compact)
			o.Spec.Defrag = &spec.DefragPolicy{Off: true}
			return o
		}(), ""},
		{"an unhealthy member holds it", func() Observed {
			o := obs(compact, fragmented, compact)
			o.Cluster.Members[2].Healthy = false
			return o
		}(), "report[INFO] a rolling change waits for every member to be healthy"},
		{"a command: every member, whatever the policy and window", func() Observed {
			o := obs(compact, compact, compact)
			o.DefragWindowOpen = false
			o.Commands = []Command{defragCmd()}
			return o
		}(), "defrag b isolated (defrag d1)"},
		{"a command: the members not yet done", func() Observed {
			o := obs(compact, compact, compact)
			o.Commands = []Command{defragCmd("b")}
			return o
		}(), "defrag c isolated (defrag d1)"},
		{"a command: the leader's member last", func() Observed {
			o := obs(compact, compact, compact)
			o.Commands = []Command{defragCmd("b", "c")}
			return o
		}(), "move-leader to="},
		{"one member: defragmented in place, no one to hand leadership to", func() Observed {
			o := obs(compact, compact, compact)
			o.Cluster.Members, o.Peers, o.Spec.MemberCount = o.Cluster.Members[:1], o.Peers[:1], 1
			o.Commands = []Command{defragCmd()}
			return o
		}(), "defrag a in place (defrag d1)"},
		{"a command waits for an unreachable agent rather than finish without it", func() Observed {
			o := obs(compact, compact, compact)
			o.Peers = o.Peers[:2]
			o.Commands = []Command{defragCmd("a", "b")}
			return o
		}(), "report[INFO] defragmentation waits: a member's agent is unreachable"},
		{"two voters: in place, as the other alone has no quorum", func() Observed {
			o := obs(compact, fragmented, compact)
			o.Cluster.Members, o.Peers, o.Spec.MemberCount = o.Cluster.Members[:2], o.Peers[:2], 2
			return o
		}(), "defrag b in place ("},
		{"a member whose isolated defragmentation failed lately: in place", func() Observed {
			o := obs(compact, compact, fragmented)
			o.IsolatedDefragFailed = map[string]bool{"c": true}
			return o
		}(), "defrag c in place ("},
		{"a command: done once every member is", func() Observed {
			o := obs(compact, compact, compact)
			o.Commands = []Command{defragCmd("a", "b", "c")}
			return o
		}(), "finish-defrag d1"},
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
