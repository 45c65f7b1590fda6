package plan

import (
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestPlanSpace(t *testing.T) {
	const mib = 1 << 20
	// obs is a 3-member cluster led by a, with a NOSPACE alarm, a 16 MiB
	// quota and each member's database and in-use MiB.
	obs := func(compacted bool, sizes ...[2]int64) Observed {
		o := leaderObs(3, cluster(member("a", true), member("b", true), member("c", true)), healthyNode("a"), healthyNode("b"), healthyNode("c"))
		quota := spec.Settings{"quota-backend-bytes": "16777216"}
		o.Spec.EtcdSettings = quota
		for i := range o.Peers {
			o.Peers[i].Member.Settings = quota
		}
		for i := range o.Cluster.Members {
			o.Cluster.Members[i].RaftIndex = 9
			o.Cluster.Members[i].ClientURLs = []string{"https://" + o.Cluster.Members[i].Name + ":4001"}
			o.Cluster.Members[i].DBSize, o.Cluster.Members[i].DBSizeInUse = sizes[i][0]*mib, sizes[i][1]*mib
		}
		o.Cluster.NoSpace = []uint64{o.Cluster.Members[1].ID}
		o.SpaceCompacted = compacted
		return o
	}
	full, freed, small, live := [2]int64{16, 15}, [2]int64{16, 2}, [2]int64{2, 2}, [2]int64{16, 15}
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{"no alarm: nothing", func() Observed { o := obs(false, small, small, small); o.Cluster.NoSpace = nil; return o }(), ""},
		{"an alarm: compact to the head first", obs(false, full, full, full), "recover-space (NOSPACE alarm on 1 member(s)"},
		{"then the followers with space to give back", obs(true, freed, freed, freed), "defrag b in place (NOSPACE: 14680064 of its 16777216 bytes are free)"},
		{"the leader's member after handing leadership on", obs(true, freed, small, small), "move-leader to="},
		// etcd refreshes a follower's in-use figure at its next commit,
		// which the alarm holds off: the figure of a member compacted
		// but not defragmented may stay at what it was.
		{"followers whose in-use figure is stale", obs(true, small, full, full), "defrag b in place (NOSPACE: 14680064 of its 16777216 bytes are free)"},
		{"a member that did not answer tells nothing of live data", func() Observed {
			o := obs(true, full, full, small)
			o.Cluster.Members[2].Healthy = false
			return o
		}(), "report[ERROR] NOSPACE: live data fills the backend quota"},
		{"every database well under the quota: disarm", obs(true, small, small, small), "disarm-nospace (every database is at most 2097152 bytes, under 80% of the 16777216-byte quota)"},
		{"live data fills the quota: say which setting to raise", obs(true, live, live, live),
			"report[ERROR] NOSPACE: live data fills the backend quota, and compaction and defragmentation cannot help; etcd takes no writes until the quota is raised with etcd-manager-ctl --quota-backend-bytes=N configure-cluster"},
		{"a raised quota rolls out under the alarm", func() Observed {
			o := obs(true, live, live, live)
			o.Spec.EtcdSettings = spec.Settings{"quota-backend-bytes": "67108864"}
			return o
		}(), "report[INFO] NOSPACE: the alarm stays until every member runs the spec's etcd settings; set-member-settings b"},
		{"and once it has, the alarm is disarmed", func() Observed {
			o := obs(true, live, live, live)
			o.Spec.EtcdSettings = spec.Settings{"quota-backend-bytes": "67108864"}
			for i := range o.Peers {
				o.Peers[i].Member.Settings = o.Spec.EtcdSettings
			}
			return o
		}(), "disarm-nospace"},
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
