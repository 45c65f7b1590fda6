package plan

import (
	"strings"
	"testing"
)

func TestPlanCorruption(t *testing.T) {
	a, b, c := member("a", true), member("b", true), member("c", true)
	// obs is a 3-member cluster led by a.
	obs := func() Observed {
		o := leaderObs(3, cluster(a, b, c), healthyNode("a"), healthyNode("b"), healthyNode("c"))
		for i := range o.Cluster.Members {
			o.Cluster.Members[i].RaftIndex = 9
		}
		return o
	}
	// hashes is a comparison at revision 100 with these hashes of a, b
	// and c (0: no answer).
	hashes := func(ha, hb, hc uint32) *HashCheck {
		r := &HashCheck{Revision: 100, Hashes: map[uint64]MemberHash{}}
		for id, h := range map[uint64]uint32{a.ID: ha, b.ID: hb, c.ID: hc} {
			if h != 0 {
				r.Hashes[id] = MemberHash{Hash: h, CompactRevision: 40}
			}
		}
		return r
	}
	with := func(f func(o *Observed)) Observed { o := obs(); f(&o); return o }
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{"nothing due: nothing", obs(), ""},
		{"due: compare", with(func(o *Observed) { o.HashCheckDue = true }), "check-hashes (periodic)"},
		{"due, but a member is unhealthy: wait", with(func(o *Observed) {
			o.HashCheckDue = true
			o.Cluster.Members[1].Healthy = false
		}), ""},
		{"due, in the middle of a version roll: wait", with(func(o *Observed) {
			o.HashCheckDue = true
			o.Peers[2].Version = "3.7.3"
		}), "take-backup (before changing etcd to 3.6.16)"}, // the roll's step, no comparison
		{"every hash agrees: nothing", with(func(o *Observed) { o.HashCheck = hashes(7, 7, 7) }), ""},
		{"a follower disagrees with the majority: its data is set aside", with(func(o *Observed) { o.HashCheck = hashes(7, 7, 8) }),
			"discard-member-data c member=" + hexID(c.ID) + " (its HashKV at revision 100 differs from that of a majority"},
		{"set aside already: the lost-data rule goes on", with(func(o *Observed) {
			o.HashCheck = hashes(7, 7, 8)
			o.Peers[2].HasData, o.Peers[2].DataLost = false, true
		}), "remove-member"},
		{"the leader disagrees: it hands leadership on first", with(func(o *Observed) { o.HashCheck = hashes(8, 7, 7) }),
			"move-leader to=" + hexID(b.ID) + " (before the leader's own data is set aside"},
		{"no majority: report, rebuild nothing", with(func(o *Observed) {
			o.HashCheck = hashes(7, 8, 9)
		}), "report[ERROR] CORRUPT: the members' data disagree and no copy is held by a majority"},
		// A failed initial check says only that the member differs from a
		// peer: the majority decides whose data is damaged.
		{"a member's initial check failed: compare, its hash read from its data", with(func(o *Observed) {
			o.Cluster.Members[2].Healthy = false
			o.Peers[2].Healthy, o.Peers[2].EtcdWanted, o.Peers[2].InitialCheckFailed = false, false, true
		}), "check-hashes (the initial corruption check of c failed)"},
		{"its data is the majority's, the leader's is not: it starts again without the check first", with(func(o *Observed) {
			o.Cluster.Members[2].Healthy = false
			o.Peers[2].Healthy, o.Peers[2].EtcdWanted, o.Peers[2].InitialCheckFailed = false, false, true
			o.HashCheck = hashes(8, 7, 7)
		}), "resume-member c member=" + hexID(c.ID) + " (its HashKV at revision 100 is the majority's"},
		{"its data is the damaged one: set aside (it serves no one: quorum is kept)", with(func(o *Observed) {
			o.Cluster.Members[2].Healthy = false
			o.Peers[2].Healthy, o.Peers[2].EtcdWanted, o.Peers[2].InitialCheckFailed = false, false, true
			o.HashCheck = hashes(7, 7, 8)
		}), "discard-member-data c member=" + hexID(c.ID)},
		{"a serving minority is not set aside below quorum", with(func(o *Observed) {
			o.Cluster.Members[1].Healthy = false
			o.HashCheck = hashes(7, 8, 7)
			o.HashCheck.Hashes[a.ID] = MemberHash{Hash: 7, CompactRevision: 40}
			o.HashCheck.Hashes[c.ID] = MemberHash{Hash: 8, CompactRevision: 40}
			o.HashCheck.Hashes[b.ID] = MemberHash{Hash: 8, CompactRevision: 40}
		}), "report[ERROR] a member's data disagrees with the majority's, but setting it aside now would leave fewer than a quorum serving"},
		{"a member's initial check failed, another member down: wait", with(func(o *Observed) {
			o.Cluster.Members[2].Healthy = false
			o.Peers[2].Healthy, o.Peers[2].EtcdWanted, o.Peers[2].InitialCheckFailed = false, false, true
			o.Cluster.Members[1].Healthy = false
		}), "report[ERROR] a member's initial corruption check failed; its data is judged once"},
		{"a member did not answer: inconclusive, nothing", with(func(o *Observed) { o.HashCheck = hashes(7, 8, 0) }), ""},
		{"different compaction revisions: inconclusive, nothing", with(func(o *Observed) {
			o.HashCheck = hashes(7, 7, 8)
			o.HashCheck.Hashes[c.ID] = MemberHash{Hash: 8, CompactRevision: 41}
		}), ""},
		{"a CORRUPT alarm: compare at once", with(func(o *Observed) { o.Cluster.Corrupt = []uint64{c.ID} }),
			"check-hashes (etcd's CORRUPT alarm is raised for member(s) " + hexID(c.ID) + ")"},
		{"a CORRUPT alarm, and the hashes agree: disarm", with(func(o *Observed) {
			o.Cluster.Corrupt = []uint64{c.ID}
			o.HashCheck = hashes(7, 7, 7)
		}), "disarm-corrupt " + hexID(c.ID) + " (every voting member's HashKV agrees at revision 100)"},
		{"a CORRUPT alarm of a member since removed: disarm", with(func(o *Observed) {
			o.Cluster.Corrupt = []uint64{0xdead}
		}), "disarm-corrupt dead (the members it names were removed)"},
		{"a CORRUPT alarm with a member unhealthy: report", with(func(o *Observed) {
			o.Cluster.Corrupt = []uint64{c.ID}
			o.Cluster.Members[1].Healthy = false
		}), "report[ERROR] etcd's CORRUPT alarm is raised"},
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
