package plan

import (
	"fmt"
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestPlanVersion(t *testing.T) {
	all := []string{"3.4.23", "3.5.35", "3.6.16", "3.7.3"}
	// at returns a healthy member node configured and running version v.
	at := func(id, v string, index uint64) Node {
		n := node(id, "member")
		m := *n.Member
		m.EtcdVersion = v
		n.Member, n.Version, n.RaftIndex, n.Installed = &m, v, index, all
		return n
	}
	// v2 is a member on 3.6 that came from 3.5 at raft index until, with
	// its newest raft snapshot at snap.
	v2 := func(id string, until, snap uint64) Node {
		n := at(id, "3.6.16", 90)
		n.Member.V2Until, n.SnapIndex = until, snap
		return n
	}
	// downgrading is a 3.6 member of a cluster whose downgrade to 3.5 is
	// enabled, with its data in storage version sv.
	downgrading := func(id, sv string) Node {
		n := at(id, "3.6.16", 9)
		n.StorageVersion, n.DowngradeTarget, n.ClusterVersion = sv, "3.5.0", "3.5.0"
		return n
	}
	obs := func(target, backup string, peers ...Node) Observed {
		o := leaderObs(int32(len(peers)), cluster(member("a", true), member("b", true), member("c", true)), peers...)
		o.Cluster.Members = o.Cluster.Members[:len(peers)]
		for i := range o.Cluster.Members {
			o.Cluster.Members[i].RaftIndex = peers[i].RaftIndex // as the leader read them
		}
		o.Spec.EtcdVersion = target
		o.VersionBackup = backup
		return o
	}
	// allowDump is o with dump-and-restore allowed in its spec.
	allowDump := func(o Observed) Observed {
		o.Spec.AllowDumpRestore = true
		return o
	}
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{"at the target: nothing", obs("3.6.16", "", at("a", "3.6.16", 9), at("b", "3.6.16", 9), at("c", "3.6.16", 9)), ""},
		{"a backup first", obs("3.7.3", "", at("a", "3.6.16", 9), at("b", "3.6.16", 9), at("c", "3.6.16", 9)),
			"take-backup (before changing etcd to 3.7.3)"},
		{"followers first, by name", obs("3.7.3", "3.7.3", at("a", "3.6.16", 9), at("b", "3.6.16", 9), at("c", "3.6.16", 9)),
			"set-member-version b 3.7.3"},
		{"then the next follower", obs("3.7.3", "3.7.3", at("a", "3.6.16", 9), at("b", "3.7.3", 9), at("c", "3.6.16", 9)),
			"set-member-version c 3.7.3"},
		{"the leader last, after handing leadership to an upgraded member",
			obs("3.7.3", "3.7.3", at("a", "3.6.16", 9), at("b", "3.7.3", 9), at("c", "3.7.3", 9)),
			"move-leader to=" + hexID(member("b", true).ID)},
		{"a member still starting on its new version holds the roll",
			obs("3.7.3", "3.7.3", at("a", "3.6.16", 9), func() Node { n := at("b", "3.7.3", 9); n.Version = "3.6.16"; return n }(), at("c", "3.6.16", 9)),
			"report[INFO] a rolling change waits for a member to run its new version"},
		{"a member behind the leader's log holds the roll",
			obs("3.7.3", "3.7.3", at("a", "3.6.16", 900), at("b", "3.7.3", 10), at("c", "3.6.16", 900)),
			"report[INFO] a rolling change waits for a member to catch up"},
		{"an agent's own stale index does not hold the roll; the leader's reading counts",
			func() Observed {
				o := obs("3.7.3", "3.7.3", at("a", "3.6.16", 24416), at("b", "3.7.3", 24415), at("c", "3.6.16", 24416))
				o.Peers[1].RaftIndex = 24000 // b's agent reported a cycle ago
				return o
			}(),
			"set-member-version c 3.7.3"},
		{"an unhealthy member holds the roll",
			obs("3.7.3", "3.7.3", at("a", "3.6.16", 9), func() Node { n := at("b", "3.6.16", 9); n.Healthy = false; return n }(), at("c", "3.6.16", 9)),
			"report[INFO] a rolling change waits for every member to be healthy"},
		{"3.4 to 3.6 steps through the newest installed 3.5",
			obs("3.6.16", "", at("a", "3.4.23", 9), at("b", "3.4.23", 9), at("c", "3.4.23", 9)),
			"take-backup (before changing etcd to 3.5.35)"},
		{"halfway through a jump, the next step",
			obs("3.6.16", "3.5.35", at("a", "3.5.35", 9), at("b", "3.5.35", 9), at("c", "3.5.35", 9)),
			"take-backup (before changing etcd to 3.6.16)"},
		{"a node without the binary: refused before anything stops",
			obs("3.7.3", "", at("a", "3.6.16", 9), func() Node { n := at("b", "3.6.16", 9); n.Installed = []string{"3.6.16"}; return n }(), at("c", "3.6.16", 9)),
			"report[ERROR] cannot change the etcd version: some nodes have no binary for it; nothing was stopped"},
		{"no intermediate version installed everywhere",
			obs("3.6.16", "", func() Node { n := at("a", "3.4.23", 9); n.Installed = []string{"3.4.23", "3.6.16"}; return n }(), at("b", "3.4.23", 9)),
			"report[ERROR] cannot change the etcd version: going from 3.4.23 to 3.6.16 steps through 3.5"},
		{"a patch downgrade rolls",
			obs("3.6.15", "3.6.15", func() Node { n := at("a", "3.6.16", 9); n.Installed = append(all, "3.6.15"); return n }(),
				func() Node { n := at("b", "3.6.16", 9); n.Installed = append(all, "3.6.15"); return n }()),
			"set-member-version b 3.6.15"},
		{"a single member restarts itself", obs("3.7.3", "3.7.3", at("a", "3.6.16", 9)), "set-member-version a 3.7.3"},
		{"downgrade 3.6 -> 3.5: a backup first", obs("3.5.35", "", at("a", "3.6.16", 9), at("b", "3.6.16", 9)),
			"take-backup (before changing etcd to 3.5.35)"},
		{"downgrade: enable etcd's downgrade", obs("3.5.35", "3.5.35", at("a", "3.6.16", 9), at("b", "3.6.16", 9)),
			"enable-downgrade 3.5"},
		{"downgrade: a member waits for its data in the older schema",
			obs("3.5.35", "3.5.35", downgrading("a", "3.6.0"), downgrading("b", "3.6.0")),
			"report[INFO] downgrade waits for a member's data to be rewritten in the older schema"},
		{"downgrade: a member whose storage version is not known yet waits",
			obs("3.5.35", "3.5.35", downgrading("a", ""), downgrading("b", "")),
			"report[INFO] downgrade waits for a member's data to be rewritten in the older schema"},
		{"downgrade: a fresh cluster's data reads as 3.5 at once, but etcd has not lowered the cluster version yet",
			obs("3.5.35", "3.5.35", func() Node { n := downgrading("a", "3.5.0"); n.ClusterVersion = "3.6.0"; return n }(), downgrading("b", "3.5.0")),
			"report[INFO] downgrade waits for etcd to lower the cluster version"},
		{"downgrade: then it restarts on the older binary",
			obs("3.5.35", "3.5.35", downgrading("a", "3.5.0"), downgrading("b", "3.5.0")),
			"set-member-version b 3.5.35"},
		{"downgrade: the leader last, handing leadership to a 3.5 member",
			obs("3.5.35", "3.5.35", downgrading("a", "3.5.0"), at("b", "3.5.35", 9)),
			"move-leader to=" + hexID(member("b", true).ID)},
		{"downgrade: half done, a 3.5 leader does not enable it again",
			obs("3.5.35", "3.5.35", at("a", "3.5.35", 9), downgrading("b", "3.6.0"), at("c", "3.5.35", 9)),
			"report[INFO] downgrade waits for a member's data to be rewritten"},
		{"into 3.7, a member whose log may hold 3.5's v2 entries waits for a snapshot",
			obs("3.7.3", "", v2("a", 50, 60), v2("b", 40, 30), v2("c", 45, 70)),
			"report[INFO] version change waits until every member has taken a raft snapshot"},
		{"3.5 -> 3.4 without --allow-dump-restore: refused, saying how to allow it",
			obs("3.4.23", "", at("a", "3.5.35", 9), at("b", "3.5.35", 9)),
			"report[ERROR] cannot change the etcd version: going from 3.5.35 down to 3.4.23 needs dump and restore (a new cluster of 3.4.23 made from a backup, " +
				"with clients cut off until it serves); allow it with configure-cluster --etcd-version=3.4.23 --allow-dump-restore, or set the spec back to 3.5.35"},
		{"3.5 -> 3.4 allowed: queue a dump-restore",
			allowDump(obs("3.4.23", "", at("a", "3.5.35", 9), at("b", "3.5.35", 9))),
			"queue-dump-restore 3.4.23"},
		{"3.6 -> 3.4 allowed: one dump-restore, no stop at 3.5",
			allowDump(obs("3.4.23", "", at("a", "3.6.16", 9), at("b", "3.6.16", 9))),
			"queue-dump-restore 3.4.23"},
		{"one minor down from 3.6 rolls even when dump-restore is allowed",
			allowDump(obs("3.5.35", "", at("a", "3.6.16", 9), at("b", "3.6.16", 9))),
			"take-backup (before changing etcd to 3.5.35)"},
		{"dump-restore to a version a node has no binary for: refused before anything stops",
			allowDump(obs("3.4.23", "", at("a", "3.5.35", 9), func() Node { n := at("b", "3.5.35", 9); n.Installed = []string{"3.5.35"}; return n }())),
			"report[ERROR] cannot change the etcd version: some nodes have no binary for it; nothing was stopped"},
		{"a failed dump-restore is not queued again",
			func() Observed {
				o := obs("3.4.23", "", at("a", "3.5.35", 9), at("b", "3.5.35", 9))
				o.Spec.AllowDumpRestore = true
				o.Commands = []Command{cmd("d1", spec.Command{DumpRestore: &spec.DumpRestoreCommand{EtcdVersion: "3.4.23"}}, spec.CommandFailed)}
				return o
			}(),
			"report[ERROR] cannot change the etcd version: its dump-restore failed; read why with list-commands, then delete the command to try again"},
		{"a step that failed is called off by setting the spec back: no health gate for the failed member",
			func() Observed {
				o := obs("3.6.16", "3.7.3", at("a", "3.6.16", 9), func() Node { n := at("b", "3.7.3", 9); n.Healthy, n.Version = false, ""; return n }(), at("c", "3.6.16", 9))
				o.Cluster.Members[1].Healthy = false
				return o
			}(),
			"report[WARN] calling off a version step that failed: the member goes back to the spec's version; set-member-version b 3.6.16"},
		{"not while a member runs another version: the roll back goes its usual way",
			func() Observed {
				o := obs("3.6.16", "3.7.3", at("a", "3.6.16", 9), at("b", "3.7.3", 9), func() Node { n := at("c", "3.7.3", 9); n.Healthy = false; return n }())
				o.Cluster.Members[2].Healthy = false
				return o
			}(),
			"take-backup (before changing etcd to 3.6.16)"},
		{"into 3.7, once every member snapshotted past them",
			obs("3.7.3", "", v2("a", 50, 60), v2("b", 40, 55), v2("c", 45, 70)),
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

func hexID(id uint64) string { return fmt.Sprintf("%x", id) }
