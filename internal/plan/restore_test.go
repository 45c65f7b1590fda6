package plan

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestPlanRestore(t *testing.T) {
	restoreCmd := func(p *spec.RestoreProgress) Command {
		c := cmd("r1", spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b1"}}, "")
		if p != nil {
			c.Status = spec.CommandStatus{State: spec.CommandRunning, Restore: p}
		}
		return c
	}
	progress := func(phase string) *spec.RestoreProgress {
		return &spec.RestoreProgress{Phase: phase, Token: "new", Members: []string{"a", "b", "c"}, EtcdVersion: "3.6.16"}
	}
	restored := func(id string, healthy, quarantined bool) Node {
		n := node(id, "member")
		m := *n.Member
		m.ClusterToken, m.Quarantined = "new", quarantined
		n.Member, n.Healthy = &m, healthy
		return n
	}
	dataLost := func(n Node) Node { n.HasData, n.DataLost = false, true; return n }
	// silent gives node id a record last published age ago.
	silent := func(o Observed, id string, age time.Duration) Observed {
		o.RecordFresh = 20 * time.Second
		o.Records = append(o.Records, Record{NodeID: id, Age: age, ClusterToken: "new", HasData: true})
		return o
	}
	// lockObs is the lock holder "a" with the given peers and restore.
	lockObs := func(p *spec.RestoreProgress, peers ...Node) Observed {
		return Observed{Spec: specN(3), Created: &spec.ClusterCreated{ClusterToken: "tok"}, Self: peers[0], Peers: peers,
			LockHeld: true, Commands: []Command{restoreCmd(p)}}
	}
	tests := []struct {
		name string
		obs  Observed
		want []string
	}{
		{name: "total loss: validate, choose the first N agents by ID",
			obs:  lockObs(nil, node("c", "standby"), node("a", "standby"), node("d", "standby"), node("b", "standby")),
			want: []string{"prepare-restore r1 backup=b1 members=[a b c]"}},
		{name: "too few agents: wait",
			obs:  lockObs(nil, node("a", "standby"), node("b", "standby")),
			want: []string{"report[WARN] restore waits for enough agents"}},
		{name: "not the lock holder: wait, even as etcd leader",
			obs: func() Observed {
				o := leaderObs(3, cluster(member("a", true)), node("a", "member"))
				o.Commands = []Command{restoreCmd(nil)}
				return o
			}(),
			want: []string{"report[INFO] a restore-backup is in progress"}},
		{name: "stopping: every old member at once",
			obs:  lockObs(progress(spec.RestoreStopping), node("a", "member"), node("c", "standby"), node("b", "member")),
			want: []string{"stop-for-restore r1 nodes=[a b]"}},
		{name: "stopping done",
			obs:  lockObs(progress(spec.RestoreStopping), node("a", "standby"), node("b", "standby"), node("c", "standby")),
			want: []string{"set-restore-phase r1 restoring"}},
		{name: "restoring: every chosen node not yet restored, at once",
			obs:  lockObs(progress(spec.RestoreRestoring), node("a", "standby"), restored("b", true, true), node("c", "wiped")),
			want: []string{"restore-nodes r1 [a c]"}},
		{name: "restoring: a chosen node is unreachable",
			obs:  lockObs(progress(spec.RestoreRestoring), node("a", "standby"), node("b", "standby")),
			want: []string{"report[WARN] restore waits for a chosen member's agent to be reachable"}},
		{name: "restoring: wait for the members to start",
			obs:  lockObs(progress(spec.RestoreRestoring), restored("a", true, true), restored("b", false, true), restored("c", true, true)),
			want: []string{"report[INFO] restore waits for the restored members to start"}},
		{name: "restoring done",
			obs:  lockObs(progress(spec.RestoreRestoring), restored("a", true, true), restored("b", true, true), restored("c", true, true), node("d", "standby")),
			want: []string{"set-restore-phase r1 verifying"}},
		{name: "verifying", obs: lockObs(progress(spec.RestoreVerifying), restored("a", true, true), restored("b", true, true), restored("c", true, true)),
			want: []string{"verify-restore r1"}},
		{name: "verifying: a chosen agent silent for a while: wait",
			obs:  silent(lockObs(progress(spec.RestoreVerifying), restored("a", true, true), restored("b", true, true)), "c", time.Minute),
			want: []string{"report[WARN] restore waits for a chosen member's agent to be reachable"}},
		{name: "verifying: a chosen agent gone for good: fail, held quarantined",
			obs:  silent(lockObs(progress(spec.RestoreVerifying), restored("a", true, true), restored("b", true, true)), "c", 3*time.Minute),
			want: []string{"fail-command r1 (the agent of chosen member c has been silent for 3m0s, before the quarantine was lifted. The restored cluster stays quarantined"}},
		{name: "restoring: a chosen agent with no record, silent since the last step: fail",
			obs: func() Observed {
				o := silent(lockObs(progress(spec.RestoreRestoring), restored("a", true, true), node("b", "standby")), "zz", 0)
				o.Commands[0].Age = 3 * time.Minute
				return o
			}(),
			want: []string{"fail-command r1 (the agent of chosen member c has been silent for 3m0s"}},
		{name: "restoring: records unreadable prove nothing: wait",
			obs: func() Observed {
				o := silent(lockObs(progress(spec.RestoreRestoring), restored("a", true, true), node("b", "standby")), "zz", 0)
				o.Commands[0].Age, o.RecordsErr = time.Hour, errors.New("store timeout")
				return o
			}(),
			want: []string{"report[WARN] restore waits for a chosen member's agent to be reachable"}},
		{name: "restoring: a restored member lost its data: fail, never restored again",
			obs:  lockObs(progress(spec.RestoreRestoring), restored("a", true, true), dataLost(restored("b", false, true)), node("c", "standby")),
			want: []string{"fail-command r1 (chosen member b lost its restored data before the quarantine was lifted; it may not be restored again under the same member ID"}},
		{name: "lifting: a chosen member gone, a quorum serves: go on",
			obs:  lockObs(progress(spec.RestoreLifting), restored("a", true, false), restored("b", true, false)),
			want: []string{"report[WARN] restore goes on without the chosen members that are missing; membership repair replaces them once it is complete", "set-restore-phase r1 backing-up"}},
		{name: "lifting: a chosen member gone, lift the rest first",
			obs:  lockObs(progress(spec.RestoreLifting), restored("a", true, false), restored("b", true, true)),
			want: []string{"lift-quarantine r1 nodes=[b]"}},
		{name: "lifting: a chosen member lost its data, a quorum serves: go on",
			obs:  lockObs(progress(spec.RestoreLifting), restored("a", true, false), restored("b", true, false), dataLost(restored("c", false, false))),
			want: []string{"report[WARN] restore goes on without the chosen members that are missing; membership repair replaces them once it is complete", "set-restore-phase r1 backing-up"}},
		{name: "lifting: a chosen member gone, too few serve: wait",
			obs:  lockObs(progress(spec.RestoreLifting), restored("a", true, false), restored("b", false, false)),
			want: []string{"report[WARN] restore waits: chosen members are missing, and too few of the others serve for a quorum"}},
		{name: "backing up without a gone member",
			obs:  lockObs(progress(spec.RestoreBackingUp), restored("a", true, false), restored("c", true, false)),
			want: []string{"report[WARN] restore goes on without the chosen members that are missing; membership repair replaces them once it is complete", "backup-restored r1"}},
		{name: "backed up without a gone member: finish",
			obs: func() Observed {
				o := lockObs(progress(spec.RestoreBackingUp), restored("a", true, false), restored("c", true, false))
				o.Commands[0].Status.Restore.Fresh = "2026-11-24T09:00:00Z-000001"
				return o
			}(),
			want: []string{"report[WARN] restore goes on without the chosen members that are missing; membership repair replaces them once it is complete", "finish-restore r1"}},
		{name: "lifting: every quarantined member at once",
			obs:  lockObs(progress(spec.RestoreLifting), restored("a", true, false), restored("b", true, true), restored("c", true, true)),
			want: []string{"lift-quarantine r1 nodes=[b c]"}},
		{name: "lifted: back up next",
			obs:  lockObs(progress(spec.RestoreLifting), restored("a", true, false), restored("b", true, false), restored("c", true, false)),
			want: []string{"set-restore-phase r1 backing-up"}},
		{name: "backing up, clients back",
			obs:  lockObs(progress(spec.RestoreBackingUp), restored("a", true, false), restored("b", true, false), restored("c", true, false)),
			want: []string{"backup-restored r1"}},
		{name: "backing up, recorded by an older agent that backed up before lifting: lift first",
			obs:  lockObs(progress(spec.RestoreBackingUp), restored("a", true, true), restored("b", true, false), restored("c", true, true)),
			want: []string{"lift-quarantine r1 nodes=[a c]"}},
		{name: "backed up: finish",
			obs: func() Observed {
				o := lockObs(progress(spec.RestoreBackingUp), restored("a", true, false), restored("b", true, false), restored("c", true, false))
				o.Commands[0].Status.Restore.Fresh = "2026-11-24T09:00:00Z-000001"
				return o
			}(),
			want: []string{"finish-restore r1"}},
		{name: "unknown phase fails the command",
			obs:  lockObs(progress("dancing"), restored("a", true, false)),
			want: []string{"fail-command r1 (restore is in an unknown phase \"dancing\""}},
		{name: "a failed restore is not active",
			obs: func() Observed {
				o := lockObs(nil, node("a", "standby"), node("b", "standby"), node("c", "standby"))
				o.Commands[0].Status.State = spec.CommandFailed
				return o
			}(),
			want: []string{"report[ERROR] " + MsgNoMembers}},
		{name: "junk is not a restore",
			obs: func() Observed {
				o := lockObs(nil, node("a", "standby"), node("b", "standby"), node("c", "standby"))
				o.Commands[0].Err = errors.New("junk")
				return o
			}(),
			want: []string{"fail-command r1 (junk)", "report[ERROR] " + MsgNoMembers}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := describe(Plan(tt.obs))
			want := ""
			for i, w := range tt.want {
				if i > 0 {
					want += "; "
				}
				want += w
			}
			if len(got) < len(want) || got[:len(want)] != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
		})
	}
}

func TestPlanRecoverQuorum(t *testing.T) {
	recoverCmd := func(survivor string) Command {
		c := cmd("q1", spec.Command{RecoverQuorum: &spec.RecoverQuorumCommand{}}, "")
		c.Age = time.Minute // long enough that a view of quorum is settled
		if survivor != "" {
			c.Status = spec.CommandStatus{State: spec.CommandRunning, Node: survivor}
		}
		return c
	}
	// noQuorum is a member whose etcd runs without a leader; its etcd
	// lists the members a, b and c.
	noQuorum := func(id string, index uint64) Node {
		n := node(id, "member")
		n.RaftIndex, n.LocalMembers = index, []Member{member("a", false), member("b", true), member("c", false)}
		return n
	}
	// held is a member whose etcd a driver holds down: its position and
	// members read from its database.
	held := func(id string, index uint64) Node {
		n := node(id, "stopped")
		n.HeldBy, n.DataIndex, n.LocalMembers = 5, index, []Member{member("a", false), member("b", true), member("c", false)}
		return n
	}
	leading := func(id string) Node {
		n := node(id, "member")
		n.RaftLeader = 7
		return n
	}
	lockObs := func(c Command, peers ...Node) Observed {
		return Observed{Spec: specN(3), Created: &spec.ClusterCreated{ClusterToken: "tok"}, Self: peers[0], Peers: peers,
			LockHeld: true, Commands: []Command{c}, RecordFresh: 10 * time.Second}
	}
	recoverLost := func(lost ...string) Command {
		c := cmd("q1", spec.Command{RecoverQuorum: &spec.RecoverQuorumCommand{Lost: lost}}, "")
		c.Age = time.Minute
		return c
	}
	record := func(id string, age time.Duration, token string, healthy bool, leader uint64) Record {
		return Record{NodeID: id, Age: age, ClusterToken: token, HasData: token != "", Healthy: healthy, RaftLeader: leader}
	}
	withRecords := func(o Observed, recs ...Record) Observed { o.Records = recs; return o }
	atRev := func(n Node, rev int64) Node { n.Revision = rev; return n }
	withBackups := func(o Observed, b map[string]BackupPoint, err error) Observed {
		o.NewestBackups, o.NewestBackupsErr = b, err
		return o
	}
	newest := map[string]BackupPoint{"tok": {Name: "2026-11-23T10:00:00Z", Revision: 500}, "other": {Name: "x", Revision: 9000}}
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{"one survivor, two wiped: held down first", lockObs(recoverCmd(""), node("a", "standby"), noQuorum("b", 40), node("c", "standby")),
			"report[WARN] recover-quorum holds the etcd of every member with data down; note-command q1; hold-nodes q1 b"},
		{"one survivor, two wiped, held: forced", lockObs(recoverCmd(""), node("a", "standby"), held("b", 40), node("c", "standby")),
			"recover-member q1 node=b token=tok"},
		{"the survivor with the longest log", lockObs(recoverCmd(""), noQuorum("a", 40), noQuorum("b", 41), node("c", "wiped")),
			"fail-command q1 (quorum is not lost: 2 members with data are up"},
		{"refused while a leader is seen", lockObs(recoverCmd(""), leading("a"), node("b", "standby")),
			"fail-command q1 (quorum is not lost: the etcd of a follows raft leader 7"},
		{"a command newer than the views of quorum waits before refusing",
			lockObs(func() Command { c := recoverCmd(""); c.Age = time.Second; return c }(), leading("a"), node("b", "standby")),
			"report[INFO] recover-quorum waits a moment: quorum looks held"},
		{"no data anywhere", lockObs(recoverCmd(""), node("a", "standby"), node("b", "wiped")),
			"fail-command q1 (no reachable node holds etcd data; use restore-backup instead)"},
		// Stalled is not lost: a holder whose etcd does not serve would
		// serve again, and with another holder makes a quorum.
		{"a holder stopped or stalled counts as a voter", lockObs(recoverCmd(""), node("c", "standby"), node("a", "stopped"), noQuorum("b", 9)),
			"report[WARN] recover-quorum waits: a quorum of members hold the cluster's data"},
		{"two holders frozen and reachable, of three: never forced", lockObs(recoverCmd(""), noQuorum("a", 9),
			func() Node { n := node("b", "member"); n.Healthy = false; return n }(), func() Node { n := node("c", "member"); n.Healthy = false; return n }()),
			"report[WARN] recover-quorum waits: a quorum of members hold the cluster's data"},
		// Five members, three lost: a stale one that serves and an
		// up-to-date one restarting are both held, and the data on their
		// disks decides.
		{"of five, the holders are held down before any is chosen",
			func() Observed {
				five := func(n Node) Node {
					n.LocalMembers = []Member{member("a", false), member("b", false), member("c", false), member("d", false), member("e", false)}
					return n
				}
				stale := five(noQuorum("a", 90))
				restarting := five(node("b", "stopped"))
				o := lockObs(recoverLost("c", "d", "e"), stale, restarting)
				o.Spec.MemberCount = 5
				return o
			}(),
			"report[WARN] recover-quorum holds the etcd of every member with data down; note-command q1; hold-nodes q1 a,b"},
		{"of five, held: the data that goes furthest wins, whichever served",
			func() Observed {
				five := func(n Node) Node {
					n.LocalMembers = []Member{member("a", false), member("b", false), member("c", false), member("d", false), member("e", false)}
					return n
				}
				stale, upToDate := five(held("a", 90)), five(held("b", 120))
				o := lockObs(recoverLost("c", "d", "e"), node("x", "standby"), stale, upToDate)
				o.Spec.MemberCount = 5
				return o
			}(),
			"recover-member q1 node=b token=tok"},
		{"of five, a held member's position unknown: wait",
			func() Observed {
				five := func(n Node) Node {
					n.LocalMembers = []Member{member("a", false), member("b", false), member("c", false), member("d", false), member("e", false)}
					return n
				}
				o := lockObs(recoverLost("c", "d", "e"), node("x", "standby"), five(held("a", 90)), five(held("b", 0)))
				o.Spec.MemberCount = 5
				return o
			}(),
			"report[WARN] recover-quorum waits to know where each held member's data stands"},
		{"in progress: the survivor does not lead yet", lockObs(recoverCmd("b"), node("a", "standby"), noQuorum("b", 50), node("c", "standby")),
			"recover-member q1 node=b token=tok"},
		{"in progress, but the evidence is gone: wait",
			withRecords(lockObs(recoverCmd("b"), node("a", "standby"), noQuorum("b", 50)), record("c", time.Second, "tok", true, 7)),
			"report[WARN] recover-quorum waits: agents this one cannot reach report a raft leader"},
		{"in progress, but the survivor runs another cluster now",
			lockObs(func() Command { c := recoverCmd("b"); c.Status.NodeToken = "old"; return c }(), node("a", "standby"), noQuorum("b", 50)),
			"fail-command q1 (the survivor b now runs cluster tok, not old"},
		{"survivors of two clusters, as many of each: no telling which",
			lockObs(recoverCmd(""), node("a", "standby"), noQuorum("b", 9), func() Node { n := noQuorum("c", 90); n.Member.ClusterToken = "stale"; return n }()),
			"fail-command q1 (the reachable nodes hold data of different clusters"},
		{"a leftover of an older cluster with a longer log is not the survivor",
			func() Observed {
				five := func(n Node) Node {
					n.LocalMembers = []Member{member("a", false), member("b", false), member("c", false), member("d", false), member("e", false)}
					return n
				}
				o := lockObs(recoverLost("d", "e"), node("c", "standby"), func() Node { n := five(held("x", 900)); n.Member.ClusterToken = "stale"; return n }(),
					five(held("a", 9)), five(held("b", 8)))
				o.Spec.MemberCount = 5
				return o
			}(),
			"recover-member q1 node=a token=tok"},
		{"quorum counts the members etcd lists, not the spec's count",
			func() Observed {
				o := lockObs(recoverCmd(""), noQuorum("a", 9), noQuorum("b", 8), node("c", "standby"))
				o.Spec.MemberCount = 5 // the spec asks for more than the cluster has
				return o
			}(),
			"fail-command q1 (quorum is not lost: 2 members with data are up, a quorum of the cluster's 3"},
		{"a survivor that lost its leader a moment ago may be in an election",
			func() Observed {
				o := lockObs(recoverCmd(""), node("a", "standby"), noQuorum("b", 9), node("c", "standby"))
				o.NoLeaderSettle = 3 * time.Second
				return o
			}(),
			"report[INFO] recover-quorum waits: members lost their leader only moments ago"},
		{"a member's fresh record shows it lost its leader a moment ago",
			func() Observed {
				o := withRecords(lockObs(recoverCmd(""), node("a", "standby"), func() Node { n := noQuorum("b", 9); n.NoLeaderFor = time.Minute; return n }()),
					Record{NodeID: "c", Age: time.Second, ClusterToken: "tok", HasData: true, Healthy: true, NoLeaderFor: time.Second})
				o.NoLeaderSettle = 3 * time.Second
				return o
			}(),
			"report[INFO] recover-quorum waits: members lost their leader only moments ago"},
		{"done once the survivor leads", lockObs(recoverCmd("b"), node("a", "standby"), func() Node { n := leading("b"); n.MemberID = 7; return n }()),
			"finish-recover q1"},
		{"chosen, not forced, and the majority is back with a leader: the decision is void",
			lockObs(recoverCmd("b"), leading("a"), held("b", 9), leading("c")),
			"fail-command q1 (quorum came back before the survivor b was forced"},
		{"chosen, unreachable, and the majority is back: void too",
			lockObs(recoverCmd("b"), leading("a"), leading("c")),
			"fail-command q1 (quorum came back before the survivor b was forced"},
		{"the survivor is unreachable", lockObs(recoverCmd("b"), node("a", "standby")),
			"report[WARN] recover-quorum waits for the survivor's agent"},

		// Positive evidence that the others have no quorum.
		{"a member's agent is silent: wait, and say how to name it lost", lockObs(recoverCmd(""), node("a", "standby"), noQuorum("b", 9)),
			"report[WARN] recover-quorum waits for evidence that the other members have no quorum: their agents are silent"},
		{"the silent member is named lost: recover",
			withRecords(lockObs(recoverLost("c"), node("a", "standby"), held("b", 9)), record("c", time.Minute, "tok", true, 7)),
			"recover-member q1 node=b token=tok"},
		{"named lost, but its record is fresh and shows a leader: wait",
			withRecords(lockObs(recoverLost("c"), node("a", "standby"), noQuorum("b", 9)), record("c", time.Second, "tok", true, 7)),
			"report[WARN] recover-quorum waits: agents this one cannot reach report a raft leader"},
		{"cut off from peers, not from the store: the others' fresh records show a leader; never fork",
			withRecords(lockObs(recoverCmd(""), noQuorum("b", 9)), record("a", time.Second, "tok", true, 7), record("c", 2*time.Second, "tok", true, 7)),
			"report[WARN] recover-quorum waits: agents this one cannot reach report a raft leader"},
		// A record vetoes, never proves.
		{"fresh records of the others show no leader: no proof, wait",
			withRecords(lockObs(recoverCmd(""), noQuorum("b", 9)), record("a", time.Second, "tok", true, 0), record("c", time.Second, "", false, 0)),
			"report[WARN] recover-quorum waits for evidence that the other members have no quorum: their agents are silent"},
		{"--lost names a node that is no member", lockObs(recoverLost("z"), node("a", "standby"), noQuorum("b", 9), node("c", "standby")),
			"fail-command q1 (--lost names z, which is not a member of the cluster"},
		{"a wiped node back under a new ID, on the member's peer URLs: evidence",
			lockObs(recoverCmd(""), func() Node { n := node("a2", "standby"); n.PeerURLs = urls("a"); return n }(), held("b", 9),
				func() Node { n := node("c2", "standby"); n.PeerURLs = urls("c"); return n }()),
			"recover-member q1 node=b token=tok"},
		{"the survivor has not listed its members yet: held, to read them from its data", lockObs(recoverCmd(""), node("a", "standby"), node("b", "member"), node("c", "standby")),
			"report[WARN] recover-quorum holds the etcd of every member with data down; note-command q1; hold-nodes q1 b"},
		{"no reachable data, but a fresh record shows an agent with data: wait",
			withRecords(lockObs(recoverCmd(""), node("a", "standby"), node("c", "standby")), record("b", time.Second, "tok", true, 0)),
			"report[WARN] recover-quorum waits: an agent with etcd data cannot be reached"},
		// Paused or rebooting, not gone: failing would make the operator
		// queue the command again for nothing.
		{"the only agent with data is silent for a minute: wait",
			withRecords(lockObs(recoverCmd(""), node("a", "standby"), node("c", "standby")), record("b", time.Minute, "tok", true, 0)),
			"report[WARN] recover-quorum waits: an agent with etcd data cannot be reached"},
		{"no reachable data, and the records cannot all be read: wait",
			func() Observed {
				o := lockObs(recoverCmd(""), node("a", "standby"), node("c", "standby"))
				o.RecordsErr = errors.New("store: unreachable")
				return o
			}(),
			"report[WARN] recover-quorum waits: no reachable node holds etcd data, and the agents' records cannot all be read"},
		{"the record with data is of a node that came back wiped under a new ID: fail",
			withRecords(lockObs(recoverCmd(""), node("a", "standby"), func() Node { n := node("b2", "standby"); n.Address = "b:8000"; return n }()),
				func() Record { r := record("b", time.Second, "tok", true, 0); r.Address = "b:8000"; return r }()),
			"fail-command q1 (no reachable node holds etcd data; use restore-backup instead)"},
		// The survivor seeds the cluster: it must not be behind a backup.
		{"the survivor is at the newest backup's revision: recover",
			withBackups(lockObs(recoverCmd(""), node("a", "standby"), atRev(held("b", 9), 500), node("c", "standby")), newest, nil),
			"recover-member q1 node=b token=tok"},
		{"the survivor is behind the newest backup of its cluster: fail, naming the backup",
			withBackups(lockObs(recoverCmd(""), node("a", "standby"), atRev(held("b", 9), 499), node("c", "standby")), newest, nil),
			"fail-command q1 (the survivor b holds revision 499, behind backup 2026-11-23T10:00:00Z of the same cluster at revision 500"},
		{"a chosen survivor found behind before it is forced: fail",
			withBackups(lockObs(recoverCmd("b"), node("a", "standby"), atRev(noQuorum("b", 9), 10), node("c", "standby")), newest, nil),
			"fail-command q1 (the survivor b holds revision 10, behind backup"},
		{"backups of another cluster do not count",
			withBackups(lockObs(recoverCmd(""), node("a", "standby"), atRev(held("b", 9), 20), node("c", "standby")),
				map[string]BackupPoint{"other": {Name: "x", Revision: 9000}}, nil),
			"recover-member q1 node=b token=tok"},
		{"the backups cannot be read: wait",
			withBackups(lockObs(recoverCmd(""), node("a", "standby"), atRev(held("b", 9), 20), node("c", "standby")), nil, errors.New("store: unreachable")),
			"report[WARN] recover-quorum waits: the backups cannot be read"},
		{"the chosen survivor's data is gone: fail",
			lockObs(recoverCmd("b"), node("a", "standby"), func() Node { n := noQuorum("b", 9); n.HasData, n.DataLost = false, true; return n }()),
			"fail-command q1 (the survivor b no longer holds the cluster's data"},
		{"the only agent with data is silent for longer than a reboot: fail, naming it",
			withRecords(lockObs(recoverCmd(""), node("a", "standby"), node("c", "standby")), record("b", 10*time.Minute, "tok", true, 0)),
			"fail-command q1 (no reachable node holds etcd data; the agents that had some are gone (b, silent for 10m0s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := describe(Plan(tt.obs))
			if !strings.HasPrefix(got, tt.want) {
				t.Fatalf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestPlanDumpRestore(t *testing.T) {
	dumpCmd := func(p *spec.RestoreProgress, state string) Command {
		c := cmd("d1", spec.Command{DumpRestore: &spec.DumpRestoreCommand{EtcdVersion: "3.4.23"}}, state)
		if p != nil {
			c.Status.Restore = p
		}
		return c
	}
	progress := func(phase string) *spec.RestoreProgress {
		return &spec.RestoreProgress{Phase: phase, Token: "new", OldToken: "tok", Members: []string{"a", "b", "c"}, EtcdVersion: "3.4.23"}
	}
	// old is a member of the running cluster "tok" on 3.5.
	old := func(id string, healthy, quarantined bool) Node {
		n := node(id, "member")
		m := *n.Member
		m.EtcdVersion, m.Quarantined = "3.5.35", quarantined
		n.Member, n.Healthy = &m, healthy
		return n
	}
	lockObs := func(c Command, peers ...Node) Observed {
		s := specN(3)
		s.EtcdVersion, s.AllowDumpRestore = "3.4.23", true
		return Observed{Spec: s, Created: &spec.ClusterCreated{ClusterToken: "tok"}, Self: peers[0], Peers: peers,
			LockHeld: true, Commands: []Command{c}}
	}
	running := spec.CommandRunning
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{name: "prepare: the running cluster's nodes become the new members",
			obs:  lockObs(dumpCmd(nil, ""), node("0", "standby"), old("c", true, false), old("a", true, false), old("b", true, false)),
			want: "prepare-dump-restore d1 old=tok members=[a b c]"},
		{name: "prepare waits for a healthy member to back up",
			obs:  lockObs(dumpCmd(nil, ""), old("a", false, false), old("b", false, false), old("c", false, false)),
			want: "report[WARN] dump-restore waits for a healthy member of the running cluster to back up"},
		{name: "quarantining: every old member at once",
			obs:  lockObs(dumpCmd(progress(spec.RestoreQuarantining), running), old("a", true, true), old("b", true, false), old("c", true, false)),
			want: "quarantine d1 nodes=[b c]"},
		{name: "quarantining: wait for the quarantined members to start",
			obs:  lockObs(dumpCmd(progress(spec.RestoreQuarantining), running), old("a", true, true), old("b", false, true), old("c", true, true)),
			want: "report[INFO] dump-restore waits for the quarantined members to start"},
		{name: "quarantined: dump",
			obs:  lockObs(dumpCmd(progress(spec.RestoreQuarantining), running), old("a", true, true), old("b", true, true), old("c", true, true)),
			want: "set-restore-phase d1 dumping"},
		{name: "a member whose agent is not reached may still serve clients: wait",
			obs: lockObs(dumpCmd(progress(spec.RestoreQuarantining), running),
				func() Node {
					n := old("a", true, true)
					n.LocalMembers = []Member{member("a", true), member("b", true), member("c", true)}
					return n
				}(),
				old("b", true, true)),
			want: "report[WARN] dump-restore waits: a member of the cluster is not known to be quarantined"},
		{name: "dumping", obs: lockObs(dumpCmd(progress(spec.RestoreDumping), running), old("a", true, true)), want: "dump-backup d1"},
		{name: "then it stops the old cluster, as a restore does",
			obs:  lockObs(dumpCmd(progress(spec.RestoreStopping), running), old("a", true, true), old("b", true, true), old("c", true, true)),
			want: "stop-for-restore d1 nodes=[a b c]"},
		{name: "the spec set back before the old cluster stops: called off",
			obs: func() Observed {
				o := lockObs(dumpCmd(progress(spec.RestoreDumping), running), old("a", true, true))
				o.Spec.EtcdVersion = "3.5.35"
				return o
			}(),
			want: "fail-command d1 (called off before the old cluster was stopped: the spec now asks for etcd 3.5.35; the quarantine is lifted)"},
		{name: "the spec set back once the old cluster is stopped: the restore goes on",
			obs: func() Observed {
				o := lockObs(dumpCmd(progress(spec.RestoreStopping), running), old("a", true, true))
				o.Spec.EtcdVersion = "3.5.35"
				return o
			}(),
			want: "stop-for-restore d1 nodes=[a]"},
		{name: "a called-off dump-restore's quarantine is lifted by etcd's leader",
			obs: func() Observed {
				o := leaderObs(3, cluster(member("a", true), member("b", true), member("c", true)), old("a", true, true), old("b", true, true), old("c", true, false))
				o.Commands = []Command{dumpCmd(progress(spec.RestoreDumping), spec.CommandFailed)}
				return o
			}(),
			want: "lift-quarantine nodes=[a b]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := describe(Plan(tt.obs)); !strings.HasPrefix(got, tt.want) {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

// A restore whose recorded progress is damaged fails, naming what is
// wrong, instead of acting on it (or panicking).
func TestPlanRestoreDamagedProgress(t *testing.T) {
	base := func() *spec.RestoreProgress {
		return &spec.RestoreProgress{Phase: spec.RestoreRestoring, Token: "new", Members: []string{"a", "b"}, InitialCluster: "a=http://a:2380,b=http://b:2380", EtcdVersion: "3.6.16"}
	}
	tests := []struct {
		name   string
		damage func(*spec.RestoreProgress)
		want   string
	}{
		{"no members", func(p *spec.RestoreProgress) { p.Members = nil }, "no members"},
		{"no token", func(p *spec.RestoreProgress) { p.Token = "" }, "no cluster token"},
		{"a member twice", func(p *spec.RestoreProgress) { p.Members = []string{"a", "a"} }, "member list"},
		{"an unsupported version", func(p *spec.RestoreProgress) { p.EtcdVersion = "2.3.8" }, "etcd v2 is not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := base()
			tt.damage(p)
			c := cmd("r1", spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b1"}}, spec.CommandRunning)
			c.Status.Restore = p
			o := Observed{Spec: specN(2), Self: node("a", "standby"), Peers: []Node{node("a", "standby"), node("b", "standby")},
				LockHeld: true, Commands: []Command{c}}
			got := describe(Plan(o))
			if !strings.HasPrefix(got, "fail-command r1 (the restore's recorded progress is damaged (") || !strings.Contains(got, tt.want) {
				t.Fatalf("got %s, want a failed command naming %q", got, tt.want)
			}
		})
	}
}

// A restore does not move on from stopping while a member of the old
// cluster it cannot reach reports that it still serves.
func TestPlanRestoreWaitsForUnreachableServers(t *testing.T) {
	p := &spec.RestoreProgress{Phase: spec.RestoreStopping, Token: "new", Members: []string{"a", "b"}, EtcdVersion: "3.6.16"}
	c := cmd("r1", spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b1"}}, spec.CommandRunning)
	c.Status.Restore = p
	o := Observed{Spec: specN(2), Self: node("a", "standby"), Peers: []Node{node("a", "standby"), node("b", "standby")},
		LockHeld: true, Commands: []Command{c}, RecordFresh: 10 * time.Second,
		Records: []Record{{NodeID: "z", Age: time.Second, ClusterToken: "tok", HasData: true, Healthy: true, RaftLeader: 7}}}
	assertPlan(t, o, []string{"report[WARN] restore waits: members of the old cluster cannot be reached, but report that they still serve"})
	o.Records[0].Age = time.Minute // silent: a dead machine does not block
	assertPlan(t, o, []string{"set-restore-phase r1 restoring"})
}

// A stray quarantine whose lift keeps failing backs off; backups go on.
func TestPlanStrayQuarantineBacksOff(t *testing.T) {
	o := leaderObs(3, cluster(member("a", true), member("b", true), member("c", true)),
		func() Node { n := node("a", "member"); n.Member.Quarantined = true; return n }(), node("b", "member"), node("c", "member"))
	assertPlan(t, o, []string{"lift-quarantine nodes=[a]"})
	o.Backoff = map[string]string{"set-quarantine tok": "peer unreachable"}
	o.BackupDue = true
	assertPlan(t, o, []string{"report[INFO] an action keeps failing", "take-backup (periodic)"})
}

// A restore that failed before its lift holds the restored cluster
// quarantined, doing nothing else to it, for as long as its command is
// kept; one that failed after, or for another cluster, holds nothing.
func TestPlanFailedRestoreHoldsQuarantine(t *testing.T) {
	quarantined := func(id string) Node { n := node(id, "member"); n.Member.Quarantined = true; return n }
	failed := func(phase, token string) Command {
		c := cmd("r1", spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b1"}}, spec.CommandFailed)
		c.Status.Message = "the agent of chosen member c has been silent for 3m0s"
		c.Status.Restore = &spec.RestoreProgress{Phase: phase, Token: token, Members: []string{"a", "b", "c"}, EtcdVersion: "3.6.16"}
		return c
	}
	tests := []struct {
		name string
		cmd  Command
		want []string
	}{
		{name: "failed verifying", cmd: failed(spec.RestoreVerifying, "tok"),
			want: []string{"report[WARN] the cluster stays quarantined: a restore failed before its quarantine was lifted"}},
		{name: "failed restoring", cmd: failed(spec.RestoreRestoring, "tok"),
			want: []string{"report[WARN] the cluster stays quarantined: a restore failed before its quarantine was lifted"}},
		{name: "failed for another cluster", cmd: failed(spec.RestoreVerifying, "other"), want: []string{"lift-quarantine nodes=[a b]"}},
		{name: "failed after its lift", cmd: failed(spec.RestoreLifting, "tok"), want: []string{"lift-quarantine nodes=[a b]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := leaderObs(3, cluster(member("a", true), member("b", true), member("c", false)), quarantined("a"), quarantined("b"))
			o.Commands = []Command{tt.cmd}
			o.BackupDue = true
			assertPlan(t, o, tt.want)
		})
	}
}
