package plan

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

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

func urls(id string) []string { return []string{"http://" + id + ":2380"} }

// node returns an agent: "standby", "member" (healthy, with data),
// "stopped" (member with data, etcd not running), "wiped" (member state
// without data), "pending" or "new" (bootstrapping).
func node(id, kind string) Node {
	n := Node{ID: id, Address: id + ":8000", PeerURLs: urls(id), ClientURLs: []string{"http://" + id + ":4001"}, Installed: []string{"3.6.16"}}
	m := &Membership{ClusterToken: "tok", EtcdVersion: "3.6.16"}
	switch kind {
	case "standby":
		return n
	case "member":
		m.HasRun = true
		n.Member, n.HasData, n.EtcdWanted, n.Healthy, n.Version = m, true, true, true, "3.6.16"
	case "stopped":
		m.HasRun = true
		n.Member, n.HasData = m, true
	case "wiped":
		m.HasRun = true
		n.Member = m
	case "pending":
		m.Pending, m.NewCluster = true, true
		n.Member = m
	case "new":
		m.NewCluster = true
		n.Member, n.HasData, n.EtcdWanted, n.Healthy, n.Version = m, true, true, true, "3.6.16"
	default:
		panic(kind)
	}
	return n
}

// member returns an etcd member named after its node.
// healthyNode is a member's agent whose etcd 3.6.16 answers, at raft
// index 9.
func healthyNode(id string) Node {
	n := node(id, "member")
	m := *n.Member
	m.EtcdVersion = "3.6.16"
	n.Member, n.Version, n.RaftIndex = &m, "3.6.16", 9
	return n
}

func member(id string, healthy bool) Member {
	var h uint64
	for _, c := range id {
		h = h*31 + uint64(c)
	}
	return Member{ID: h, Name: id, PeerURLs: urls(id), ClientURLs: []string{"http://" + id + ":4001"}, Healthy: healthy}
}

func specN(n int32) *spec.ClusterSpec {
	return &spec.ClusterSpec{MemberCount: n, EtcdVersion: "3.6.16"}
}

func cluster(members ...Member) *ClusterView { return &ClusterView{Token: "tok", Members: members} }

// leaderObs is an observation by node "a", the raft leader.
func leaderObs(want int32, c *ClusterView, peers ...Node) Observed {
	return Observed{Spec: specN(want), Created: &spec.ClusterCreated{ClusterToken: "tok"}, Self: peers[0], Peers: peers,
		Cluster: c, Grace: time.Minute, PendingTimeout: time.Minute, BackedUpSinceChange: true}
}

// ordinal marks the spec's members as a StatefulSet's ordinals.
func ordinal(o Observed) Observed {
	s := *o.Spec
	s.OrdinalMembers = true
	o.Spec = &s
	return o
}

// ordMembers are members etcd-0 … etcd-(n-1), the unhealthy ones named.
func ordMembers(n int, unhealthy ...string) []Member {
	var out []Member
	for i := range n {
		id := fmt.Sprintf("etcd-%d", i)
		out = append(out, member(id, !slices.Contains(unhealthy, id)))
	}
	return out
}

// ordNodes are the member agents etcd-0 … etcd-(n-1), etcd-0 first.
func ordNodes(n int) []Node {
	var out []Node
	for i := range n {
		out = append(out, node(fmt.Sprintf("etcd-%d", i), "member"))
	}
	return out
}

func standbys(ids ...string) []Node {
	var out []Node
	for _, id := range ids {
		out = append(out, node(id, "standby"))
	}
	return out
}

// withSelf makes node id the observer, the raft leader's agent.
func withSelf(o Observed, id string) Observed {
	for _, n := range o.Peers {
		if n.ID == id {
			o.Self = n
		}
	}
	return o
}

var backupNow = spec.Command{BackupNow: &spec.BackupNowCommand{}}

func cmd(id string, c spec.Command, state string) Command {
	if state == "" {
		state = spec.CommandPending
	}
	return Command{ID: id, Command: c, Status: spec.CommandStatus{State: state}}
}

func TestPlan(t *testing.T) {
	created := &spec.ClusterCreated{Timestamp: 1, ClusterToken: "tok"}
	lockObs := func(want int32, peers ...Node) Observed {
		return Observed{Spec: specN(want), Self: peers[0], Peers: peers, LockHeld: true, Grace: time.Minute, PendingTimeout: time.Minute}
	}
	with := func(o Observed, f func(*Observed)) Observed { f(&o); return o }

	tests := []struct {
		name string
		obs  Observed
		want []string // one substring per action, in order
	}{
		// The local node, whatever the store says.
		{name: "no spec yet", obs: Observed{Self: node("a", "standby"), Peers: []Node{node("a", "standby")}},
			want: []string{"report[INFO] waiting for a cluster spec"}},
		{name: "store unreachable, member stopped: start etcd anyway",
			obs:  Observed{StoreErr: errors.New("down"), Self: node("a", "stopped")},
			want: []string{"start-etcd", "report[ERROR] backup store unreachable"}},
		{name: "store unreachable, etcd running: leave it alone",
			obs:  Observed{StoreErr: errors.New("down"), Self: node("a", "member")},
			want: []string{"report[ERROR] backup store unreachable"}},
		{name: "invalid spec keeps etcd running", obs: Observed{SpecErr: errors.New("junk"), Self: node("a", "member")},
			want: []string{"report[ERROR] cluster spec is invalid"}},
		{name: "invalid spec still re-adopts local etcd", obs: Observed{SpecErr: errors.New("junk"), Self: node("a", "stopped")},
			want: []string{"start-etcd", "report[ERROR] cluster spec is invalid"}},
		{name: "wiped data: do not start etcd", obs: Observed{Spec: specN(3), Created: created, Self: node("a", "wiped")},
			want: []string{"report[ERROR] this node's etcd data is missing"}},
		{name: "new cluster healthy: mark bootstrapped",
			obs:  leaderObs(1, cluster(member("a", true)), node("a", "new")),
			want: []string{"mark-bootstrapped"}},

		// A creation this node was told about.
		{name: "pending confirmed by the marker", obs: Observed{Spec: specN(3), Created: created, Self: node("a", "pending")},
			want: []string{"confirm-create tok"}},
		{name: "pending lost to another creation",
			obs:  Observed{Spec: specN(3), Created: &spec.ClusterCreated{ClusterToken: "other"}, Self: node("a", "pending")},
			want: []string{"abandon-pending tok (another creation won)"}},
		{name: "pending never confirmed: give up",
			obs: with(Observed{Spec: specN(3), Self: node("a", "pending"), PendingTimeout: time.Minute},
				func(o *Observed) { o.Self.PendingFor = 2 * time.Minute }),
			want: []string{"abandon-pending tok (the creation was never confirmed)"}},
		{name: "pending within timeout: wait",
			obs:  Observed{Spec: specN(3), Self: node("a", "pending"), PendingTimeout: time.Minute},
			want: []string{"report[INFO] waiting for the cluster creation to be confirmed"}},

		// No cluster anywhere: the lock holder decides.
		{name: "create single-member cluster", obs: lockObs(1, node("a", "standby")),
			want: []string{"create-cluster [a] 3.6.16"}},
		{name: "create picks the lowest IDs among enough agents",
			obs:  lockObs(3, node("c", "standby"), node("d", "standby"), node("a", "standby"), node("b", "standby")),
			want: []string{"create-cluster [a b c] 3.6.16"}},
		{name: "too few agents to create", obs: lockObs(3, node("a", "standby"), node("b", "standby")),
			want: []string{"report[INFO] waiting for enough agents"}},
		{name: "no binary for the spec version",
			obs:  with(lockObs(1, node("a", "standby")), func(o *Observed) { o.SpecBinaryErr = errors.New("no etcd binary in /opt") }),
			want: []string{"report[ERROR] cannot create the cluster: no etcd binary"}},
		{name: "created marker without members: never create, ask for restore",
			obs:  with(lockObs(3, node("a", "standby"), node("b", "standby"), node("c", "standby")), func(o *Observed) { o.Created = created }),
			want: []string{"report[ERROR] " + MsgNoMembers}},
		{name: "only wiped members left: ask for restore",
			obs:  with(lockObs(1, node("a", "wiped")), func(o *Observed) { o.Created = created }),
			want: []string{"report[ERROR] this node's etcd data is missing", "report[ERROR] " + MsgNoMembers}},
		{name: "creation in progress elsewhere: wait",
			obs:  lockObs(3, node("a", "standby"), node("b", "pending"), node("c", "standby")),
			want: []string{"report[INFO] waiting for a cluster creation in progress"}},
		{name: "no lock, no membership: standby", obs: Observed{Spec: specN(3), Self: node("a", "standby"), Peers: []Node{node("a", "standby")}},
			want: []string{"report[INFO] standby: not an etcd member"}},
		{name: "member that is not the leader: nothing", obs: Observed{Spec: specN(3), Created: created, Self: node("b", "member")},
			want: nil},

		// The raft leader's view.
		{name: "settled cluster: nothing to do",
			obs: leaderObs(3, cluster(member("a", true), member("b", true), member("c", true)),
				node("a", "member"), node("b", "member"), node("c", "member")),
			want: nil},
		{name: "grow: add the lowest standby once all are healthy",
			obs: leaderObs(3, cluster(member("a", true)),
				node("a", "member"), node("e", "standby"), node("d", "standby")),
			want: []string{"add-member d"}},
		{name: "grow: wait while a member is unhealthy",
			obs: leaderObs(5, cluster(member("a", true), member("b", false), member("c", true)),
				node("a", "member"), node("c", "member"), node("d", "standby")),
			want: []string{"report[INFO] waiting for every member to be healthy"}},
		{name: "grow: no standby available",
			obs:  leaderObs(3, cluster(member("a", true)), node("a", "member")),
			want: []string{"report[WARN] the spec asks for more members, but no standby"}},
		{name: "promote a healthy learner",
			obs: leaderObs(3, cluster(member("a", true), func() Member { m := member("b", true); m.IsLearner = true; return m }()),
				node("a", "member"), node("b", "member")),
			want: []string{fmt.Sprintf("promote-member %x", member("b", true).ID)}},
		{name: "a learner still starting: wait before adding more",
			obs: leaderObs(3, cluster(member("a", true), func() Member { m := member("b", false); m.IsLearner = true; return m }()),
				node("a", "member"), node("b", "member"), node("c", "standby")),
			want: []string{"report[INFO] waiting for every member to be healthy"}},
		{name: "shrink: remove the highest name, never the leader",
			obs: leaderObs(1, cluster(member("a", true), member("b", true), member("c", true)),
				node("a", "member"), node("b", "member"), node("c", "member")),
			want: []string{fmt.Sprintf("remove-member %x node=c", member("c", true).ID)}},
		{name: "shrink: leader with the highest name stays",
			obs: leaderObs(1, cluster(member("z", true), member("b", true)),
				node("z", "member"), node("b", "member")),
			want: []string{fmt.Sprintf("remove-member %x node=b", member("b", true).ID)}},
		{name: "shrink: unhealthy first",
			obs: leaderObs(3, cluster(member("a", true), member("b", false), member("c", true), member("d", true)),
				node("a", "member"), node("c", "member"), node("d", "member")),
			want: []string{fmt.Sprintf("remove-member %x node=b", member("b", true).ID)}},
		// On Kubernetes the members are a StatefulSet's ordinals: the
		// highest goes, as a number, whatever its health.
		{name: "ordinal shrink: etcd-10 goes before etcd-9, healthy or not",
			obs:  ordinal(leaderObs(9, cluster(ordMembers(11, "etcd-3")...), ordNodes(11)...)),
			want: []string{fmt.Sprintf("remove-member %x node=etcd-10", member("etcd-10", true).ID)}},
		{name: "ordinal shrink: the leader's own member hands leadership over first",
			obs:  ordinal(withSelf(leaderObs(2, cluster(ordMembers(3)...), ordNodes(3)...), "etcd-2")),
			want: []string{fmt.Sprintf("move-leader to=%x", member("etcd-0", true).ID)}},
		{name: "ordinal shrink: never below quorum",
			obs:  ordinal(leaderObs(2, cluster(ordMembers(3, "etcd-0", "etcd-1")...), ordNodes(3)...)),
			want: []string{"report[WARN] not shrinking the cluster: removing a member now would lose quorum"}},
		{name: "ordinal grow: a pod above the count is no standby",
			obs:  ordinal(leaderObs(3, cluster(ordMembers(2)...), append(ordNodes(2), node("etcd-3", "standby"))...)),
			want: []string{"report[WARN] the spec asks for more members, but no standby agent is available"}},
		{name: "ordinal grow: the pod of the next ordinal joins",
			obs:  ordinal(leaderObs(3, cluster(ordMembers(2)...), append(ordNodes(2), node("etcd-3", "standby"), node("etcd-2", "standby"))...)),
			want: []string{"add-member etcd-2"}},
		{name: "ordinal create: the lowest ordinals, as numbers",
			obs:  ordinal(lockObs(3, standbys("etcd-10", "etcd-2", "etcd-1", "etcd-0", "x")...)),
			want: []string{"create-cluster [etcd-0 etcd-1 etcd-2]"}},
		{name: "wiped member is removed at once",
			obs: leaderObs(3, cluster(member("a", true), member("b", false), member("c", true)),
				node("a", "member"), node("b", "wiped"), node("c", "member")),
			want: []string{fmt.Sprintf("remove-member %x node=b (its data dir was wiped)", member("b", true).ID)}},
		{name: "member that just joined, with a stale report of no data, is left alone",
			obs: leaderObs(3, cluster(member("a", true), member("b", true), member("c", true)),
				node("a", "member"), func() Node { n := node("b", "wiped"); n.EtcdWanted = true; return n }(), node("c", "member")),
			want: nil},
		{name: "member wiped right after creation crash-loops as new: removed",
			obs: leaderObs(3, cluster(member("a", true), member("b", false), member("c", true)),
				node("a", "member"), func() Node { n := node("b", "wiped"); n.Member.NewCluster = true; n.EtcdWanted = true; return n }(), node("c", "member")),
			want: []string{fmt.Sprintf("remove-member %x node=b (its data dir was wiped)", member("b", true).ID)}},
		{name: "node back with a new identity on a member's URLs is removed at once",
			obs: leaderObs(3, cluster(member("a", true), member("b", false), member("c", true)),
				node("a", "member"), func() Node { n := node("b2", "standby"); n.PeerURLs = urls("b"); return n }(), node("c", "member")),
			want: []string{fmt.Sprintf("remove-member %x node=b2 (its node came back without its data)", member("b", true).ID)}},
		{name: "node that believes it is a member but is not: evict",
			obs: leaderObs(1, cluster(member("a", true)),
				node("a", "member"), node("b", "member")),
			want: []string{"evict-node b (not a member of the running cluster)"}},
		{name: "node of another cluster token: evict",
			obs: leaderObs(2, cluster(member("a", true), member("b", true)),
				node("a", "member"), node("b", "member"), func() Node { n := node("c", "member"); n.Member.ClusterToken = "old"; return n }()),
			want: []string{"evict-node c"}},
		{name: "member added but its node missed the join: join again",
			obs: leaderObs(2, cluster(member("a", true), func() Member { m := member("b", false); m.Name = ""; m.IsLearner = true; return m }()),
				node("a", "member"), node("b", "standby")),
			want: []string{"add-member b"}},
		{name: "unhealthy past grace with a standby: replace",
			obs: leaderObs(3, cluster(member("a", true), func() Member { m := member("b", false); m.UnhealthyFor = 2 * time.Minute; return m }(), member("c", true)),
				node("a", "member"), node("c", "member"), node("d", "standby")),
			want: []string{fmt.Sprintf("remove-member %x node=b (unhealthy for 2m0s)", member("b", true).ID)}},
		{name: "unhealthy past grace without a standby: keep it",
			obs: leaderObs(3, cluster(member("a", true), func() Member { m := member("b", false); m.UnhealthyFor = 2 * time.Minute; return m }(), member("c", true)),
				node("a", "member"), node("c", "member")),
			want: nil},
		{name: "unhealthy within grace: wait",
			obs: leaderObs(3, cluster(member("a", true), func() Member { m := member("b", false); m.UnhealthyFor = 10 * time.Second; return m }(), member("c", true)),
				node("a", "member"), node("c", "member"), node("d", "standby")),
			want: nil},
		{name: "zero grace replaces at once",
			obs: with(leaderObs(3, cluster(member("a", true), member("b", false), member("c", true)),
				node("a", "member"), node("c", "member"), node("d", "standby")), func(o *Observed) { o.Grace = 0 }),
			want: []string{fmt.Sprintf("remove-member %x node=b", member("b", true).ID)}},
		{name: "a membership change waits for a backup",
			obs: with(leaderObs(3, cluster(member("a", true)), node("a", "member"), node("d", "standby")),
				func(o *Observed) { o.BackedUpSinceChange = false }),
			want: []string{"take-backup (before add-member d)"}},
		{name: "a removal waits for a backup too",
			obs: with(leaderObs(1, cluster(member("a", true), member("b", true)), node("a", "member"), node("b", "member")),
				func(o *Observed) { o.BackedUpSinceChange = false }),
			want: []string{"take-backup (before remove-member"}},
		{name: "a failed backup does not block healing",
			obs: with(leaderObs(3, cluster(member("a", true)), node("a", "member"), node("d", "standby")),
				func(o *Observed) { o.BackedUpSinceChange, o.BackupFailedRecently = false, true }),
			want: []string{"report[WARN] changing membership without a fresh backup", "add-member d"}},
		{name: "promotion needs no backup",
			obs: with(leaderObs(3, cluster(member("a", true), func() Member { m := member("b", true); m.IsLearner = true; return m }()),
				node("a", "member"), node("b", "member")), func(o *Observed) { o.BackedUpSinceChange = false }),
			want: []string{"promote-member"}},
		{name: "periodic backup when due and nothing else to do",
			obs:  with(leaderObs(1, cluster(member("a", true)), node("a", "member")), func(o *Observed) { o.BackupDue = true }),
			want: []string{"take-backup (periodic)"}},
		{name: "periodic backup waits for a change in progress",
			obs:  with(leaderObs(3, cluster(member("a", true)), node("a", "member"), node("d", "standby")), func(o *Observed) { o.BackupDue = true }),
			want: []string{"add-member d"}},
		{name: "one backup answers every queued backup-now, and counts as the periodic one",
			obs: with(leaderObs(1, cluster(member("a", true)), node("a", "member")), func(o *Observed) {
				o.BackupDue = true
				o.Commands = []Command{cmd("c1", backupNow, ""), cmd("c2", backupNow, spec.CommandRunning)}
			}),
			want: []string{"take-backup (backup-now c1 c2)"}},
		{name: "backup-now waits for a membership change",
			obs: with(leaderObs(3, cluster(member("a", true)), node("a", "member"), node("d", "standby")),
				func(o *Observed) { o.Commands = []Command{cmd("c1", backupNow, "")} }),
			want: []string{"add-member d"}},
		{name: "backup-now backs off after a failure",
			obs: with(leaderObs(1, cluster(member("a", true)), node("a", "member")), func(o *Observed) {
				o.BackupFailedRecently = true
				o.Commands = []Command{cmd("c1", backupNow, spec.CommandRunning)}
			}),
			want: []string{"report[INFO] backup-now waits"}},
		{name: "junk command is failed once, and the queue goes on",
			obs: with(leaderObs(1, cluster(member("a", true)), node("a", "member")), func(o *Observed) {
				junk := cmd("c1", spec.Command{}, "")
				junk.Err = errors.New("not valid JSON")
				failed := cmd("c0", spec.Command{}, spec.CommandFailed)
				failed.Err = errors.New("not valid JSON")
				o.Commands = []Command{failed, junk, cmd("c2", backupNow, "")}
			}),
			want: []string{"fail-command c1 (not valid JSON)", "take-backup (backup-now c2)"}},
		{name: "done commands are forgotten after an hour, failed ones kept",
			obs: with(leaderObs(1, cluster(member("a", true)), node("a", "member")), func(o *Observed) {
				old := cmd("c1", backupNow, spec.CommandDone)
				old.Age = 2 * time.Hour
				oldFailed := cmd("c2", backupNow, spec.CommandFailed)
				oldFailed.Age = 2 * time.Hour
				o.Commands = []Command{old, oldFailed, cmd("c3", backupNow, spec.CommandDone)}
			}),
			want: []string{"forget-command c1"}},
		{name: "a restore is left to the store lock's holder",
			obs: with(leaderObs(1, cluster(member("a", true)), node("a", "member")), func(o *Observed) {
				o.BackupDue = true
				o.Commands = []Command{cmd("c1", backupNow, ""), cmd("c2", spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b"}}, "")}
			}),
			want: []string{"report[INFO] a restore-backup is in progress"}},
		{name: "a downgrade by two minors needs dump and restore, refused for now",
			obs: with(leaderObs(1, cluster(member("a", true)), node("a", "member")),
				func(o *Observed) { o.Spec = &spec.ClusterSpec{MemberCount: 1, EtcdVersion: "3.4.23"} }),
			want: []string{"report[ERROR] cannot change the etcd version: going from 3.6.16 down to 3.4.23 needs dump and restore"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.obs.Peers == nil {
				tt.obs.Peers = []Node{tt.obs.Self}
			}
			got := Plan(tt.obs)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d actions (%s), want %d (%s)", len(got), describe(got), len(tt.want), strings.Join(tt.want, "; "))
			}
			for i, w := range tt.want {
				if d := describe(got[i : i+1]); !strings.HasPrefix(d, w) {
					t.Errorf("action %d = %q, want %q", i, d, w)
				}
			}
			mutating := 0
			for _, a := range got {
				if a.Mutates() {
					mutating++
				}
			}
			if mutating > 2 {
				t.Errorf("plan has %d mutating actions; the executor takes them one at a time", mutating)
			}
		})
	}
}

// Plan is pure: the same observation always gives the same plan.
func TestPlanIsDeterministic(t *testing.T) {
	obs := Observed{Spec: specN(3), LockHeld: true, Self: node("e", "standby"),
		Peers: []Node{node("e", "standby"), node("b", "standby"), node("d", "standby"), node("a", "standby"), node("c", "standby")}}
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

func TestPlanMarksBootstrappedOnceDataExists(t *testing.T) {
	n := node("a", "new")
	n.Healthy = false
	got := describe(Plan(Observed{Spec: specN(1), Created: &spec.ClusterCreated{ClusterToken: "tok"}, Self: n, Peers: []Node{n}}))
	if got != "mark-bootstrapped" {
		t.Errorf("plan = %q, want mark-bootstrapped even before etcd is healthy", got)
	}
	n.HasData = false
	n.EtcdWanted = false
	if got := describe(Plan(Observed{Spec: specN(1), Self: n, Peers: []Node{n}})); got != "start-etcd" {
		t.Errorf("new member without data: plan = %q, want start-etcd", got)
	}
}

func TestPlanPeerURLSwitch(t *testing.T) {
	// secure is a member node whose agent now wants https peer URLs.
	secure := func(id string) Node {
		n := node(id, "member")
		n.PeerURLs = []string{"https://" + id + ":2380"}
		return n
	}
	obs := func(members []Member, peers ...Node) Observed {
		return leaderObs(3, cluster(members...), peers...)
	}
	healthy := []Member{member("a", true), member("b", true), member("c", true)}
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{"nothing to switch", obs(healthy, node("a", "member"), node("b", "member"), node("c", "member")), ""},
		{"another member first, by ID", obs(healthy, secure("a"), secure("b"), secure("c")), "set-peer-urls b https://b:2380"},
		{"an unhealthy member holds the switch",
			obs([]Member{member("a", true), member("b", true), member("c", false)}, secure("a"), secure("b"), node("c", "member")),
			"report[INFO] peer URL switch waits for every member to be healthy"},
		{"a member down with new URLs goes first, the others healthy (a pod back at a new IP)",
			obs([]Member{member("a", true), member("b", true), member("c", false)}, secure("a"), secure("b"), secure("c")),
			"set-peer-urls c https://c:2380"},
		{"a member down with new URLs waits while another is down too",
			obs([]Member{member("a", true), member("b", false), member("c", false)}, node("a", "member"), node("b", "member"), secure("c")),
			"report[INFO] peer URL switch waits for every member to be healthy"},
		{"the leader's own member last, after handing leadership on",
			func() Observed {
				ms := slices.Clone(healthy)
				ms[1].PeerURLs, ms[2].PeerURLs = []string{"https://b:2380"}, []string{"https://c:2380"}
				return obs(ms, secure("a"), secure("b"), secure("c"))
			}(),
			"move-leader to=" + hexID(member("b", true).ID)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := describe(Plan(tt.obs)); !strings.HasPrefix(got, tt.want) || (tt.want == "" && got != "") {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

// A switch held up by a member unhealthy past the grace period is
// stalled: a warning, with a line for status that says which members keep
// which old URLs, and that raft traffic is still plain http; within the
// grace, a member restarting is routine and only noted.
func TestPlanPeerURLSwitchStalled(t *testing.T) {
	secure := func(id string) Node {
		n := node(id, "member")
		n.PeerURLs = []string{"https://" + id + ":2380"}
		return n
	}
	down := func(d time.Duration) Member {
		m := member("c", false)
		m.UnhealthyFor = d
		return m
	}
	tests := []struct {
		name       string
		c          Member
		peers      []Node
		wantLevel  slog.Level
		wantStatus string
	}{
		{"within the grace", down(59 * time.Second), []Node{secure("a"), secure("b"), node("c", "member")}, slog.LevelInfo, ""},
		{"past the grace, from http", down(5 * time.Minute), []Node{secure("a"), secure("b"), node("c", "member")}, slog.LevelWarn,
			"peer URL switch stalled: member c has been unhealthy for 5m0s; until it is healthy or replaced, a, b keep the old peer URLs " +
				"http://a:2380,http://b:2380, so raft traffic to them is still plain http"},
		{"past the grace, another port", down(time.Hour), func() []Node {
			b := node("b", "member")
			b.PeerURLs = []string{"http://b:2390"}
			return []Node{node("a", "member"), b, node("c", "member")}
		}(), slog.LevelWarn,
			"peer URL switch stalled: member c has been unhealthy for 1h0m0s; until it is healthy or replaced, b keeps the old peer URLs http://b:2380"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Plan(leaderObs(3, cluster(member("a", true), member("b", true), tt.c), tt.peers...))
			if len(got) != 1 {
				t.Fatalf("plan %s, want one report", describe(got))
			}
			r, ok := got[0].(Report)
			if !ok || r.Level != tt.wantLevel || r.Status != tt.wantStatus {
				t.Fatalf("plan %s (status %q), want a report at %s with status\n%q", describe(got), r.Status, tt.wantLevel, tt.wantStatus)
			}
			if lines := StatusLines(got); (tt.wantStatus == "") != (len(lines) == 0) {
				t.Errorf("StatusLines = %q", lines)
			}
			if tt.wantLevel == slog.LevelWarn && r.Msg != MsgPeerURLSwitchStalled {
				t.Errorf("message %q, want %q", r.Msg, MsgPeerURLSwitchStalled)
			}
		})
	}
}

func TestPlanNewerFormat(t *testing.T) {
	newer := errors.New("spec: written by a newer etcd-manager")
	settled := func() Observed {
		return leaderObs(3, cluster(member("a", true), member("b", true), member("c", true)),
			node("a", "member"), node("b", "member"), node("c", "member"))
	}
	with := func(o Observed, f func(*Observed)) Observed { f(&o); return o }
	tests := []struct {
		name string
		obs  Observed
		want []string
	}{
		{name: "a newer restore command: wait, do nothing else",
			obs: with(settled(), func(o *Observed) {
				c := cmd("r1", spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b"}}, spec.CommandRunning)
				c.Newer = newer
				o.Commands = []Command{c}
				o.BackupDue = true
			}),
			want: []string{"report[WARN] a record in the store was written by a newer etcd-manager; this agent waits"}},
		{name: "a newer command of an unknown kind: wait",
			obs: with(settled(), func(o *Observed) {
				c := cmd("x1", spec.Command{}, spec.CommandPending)
				c.Newer = newer
				o.Commands = []Command{c}
			}),
			want: []string{"report[WARN] a record in the store was written by a newer etcd-manager; this agent waits"}},
		{name: "a newer backup-now is left alone; the periodic backup goes on",
			obs: with(settled(), func(o *Observed) {
				c := cmd("n1", backupNow, spec.CommandPending)
				c.Newer = newer
				o.Commands = []Command{c}
				o.BackupDue = true
			}),
			want: []string{"report[WARN] a command in the store was written by a newer etcd-manager; leaving it alone", "take-backup (periodic)"}},
		{name: "a newer store lock: wait",
			obs: with(Observed{Spec: specN(1), Self: node("a", "standby"), Peers: []Node{node("a", "standby")}},
				func(o *Observed) { o.NewerFormat = newer }),
			want: []string{"report[WARN] a record in the store was written by a newer etcd-manager; this agent waits"}},
		{name: "a newer lock still lets the local etcd start",
			obs: with(Observed{Spec: specN(1), Self: node("a", "stopped"), Peers: []Node{node("a", "stopped")}},
				func(o *Observed) { o.NewerFormat = newer }),
			want: []string{"start-etcd", "report[WARN] a record in the store was written by a newer etcd-manager"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assertPlan(t, tt.obs, tt.want) })
	}
}

// One failing step must not starve the loop: a change that keeps failing
// is passed over for the next candidate, and backups and commands go on.
func TestPlanKeepsGoingPastFailures(t *testing.T) {
	dead := func(id string) Member { m := member(id, false); m.UnhealthyFor = 2 * time.Minute; return m }
	learner := func(id string, healthy bool, for_ time.Duration) Member {
		m := member(id, healthy)
		m.IsLearner, m.LearnerFor = true, for_
		return m
	}
	noBinary := func(id string) Node { n := node(id, "standby"); n.Installed = nil; return n }
	with := func(o Observed, f func(*Observed)) Observed { f(&o); return o }
	tests := []struct {
		name string
		obs  Observed
		want []string
	}{
		{name: "a dead member and the only standby lacks the binary: keep the member, back up",
			obs: with(leaderObs(3, cluster(member("a", true), dead("b"), member("c", true)),
				node("a", "member"), node("c", "member"), noBinary("d")),
				func(o *Observed) { o.BackupDue = true; o.Commands = []Command{cmd("c1", backupNow, "")} }),
			want: []string{"take-backup (backup-now c1)"}},
		{name: "too few members and the only standby lacks the binary: say so",
			obs:  leaderObs(3, cluster(member("a", true), member("c", true)), node("a", "member"), node("c", "member"), noBinary("d")),
			want: []string{"report[WARN] the spec asks for more members, but no standby agent has the etcd binaries to join"}},
		{name: "a standby with the spec's binary but not the members' running version is unfit",
			obs: with(leaderObs(3, cluster(member("a", true), member("c", true)), node("a", "member"), node("c", "member"),
				func() Node { n := node("d", "standby"); n.Installed = []string{"3.7.3"}; return n }()),
				func(o *Observed) { o.Spec.EtcdVersion = "3.7.3" }),
			want: []string{"report[WARN] the spec asks for more members, but no standby agent has the etcd binaries to join",
				"report[ERROR] cannot change the etcd version: some nodes have no binary for it"}},
		{name: "an add that keeps failing is passed over; backup-now is served",
			obs: with(leaderObs(3, cluster(member("a", true), member("c", true)), node("a", "member"), node("c", "member"), node("d", "standby")),
				func(o *Observed) {
					o.Backoff = map[string]string{"add-member d": "no etcd binary for etcd 3.6.16"}
					o.Commands = []Command{cmd("c1", backupNow, "")}
				}),
			want: []string{"report[INFO] an action keeps failing", "take-backup (backup-now c1)"}},
		{name: "the next standby is tried when one keeps failing",
			obs: with(leaderObs(3, cluster(member("a", true), member("c", true)), node("a", "member"), node("c", "member"), node("d", "standby"), node("e", "standby")),
				func(o *Observed) { o.Backoff = map[string]string{"add-member d": "join refused"} }),
			want: []string{"report[INFO] an action keeps failing", "add-member e"}},
		{name: "etcd refuses to remove one unhealthy member: the next is tried",
			obs: with(leaderObs(3, cluster(member("a", true), dead("b"), dead("c")), node("a", "member"), node("d", "standby"), node("e", "standby")),
				func(o *Observed) {
					o.Backoff = map[string]string{fmt.Sprintf("remove-member %x", member("b", true).ID): "etcdserver: re-configuration failed due to not enough started members"}
				}),
			want: []string{"report[INFO] an action keeps failing", fmt.Sprintf("remove-member %x node=c", member("c", true).ID)}},
		{name: "a shrink candidate that keeps failing: the next one",
			obs: with(leaderObs(1, cluster(member("a", true), member("b", true), member("c", true)), node("a", "member"), node("b", "member"), node("c", "member")),
				func(o *Observed) {
					o.Backoff = map[string]string{fmt.Sprintf("remove-member %x", member("c", true).ID): "refused"}
				}),
			want: []string{"report[INFO] an action keeps failing", fmt.Sprintf("remove-member %x node=b", member("b", true).ID)}},
		{name: "a learner that never caught up is removed again",
			obs: with(leaderObs(3, cluster(member("a", true), member("c", true), learner("b", false, 11*time.Minute)), node("a", "member"), node("b", "member"), node("c", "member")),
				func(o *Observed) { o.LearnerTimeout = 10 * time.Minute }),
			want: []string{fmt.Sprintf("remove-member %x node=b (the learner did not start and catch up within 10m0s)", member("b", true).ID)}},
		{name: "a member added but never started is removed again",
			obs: with(leaderObs(3, cluster(member("a", true), member("c", true), func() Member {
				m := member("b", false)
				m.Name, m.IsLearner, m.LearnerFor = "", true, time.Hour
				return m
			}()),
				node("a", "member"), node("c", "member")),
				func(o *Observed) { o.LearnerTimeout = 10 * time.Minute }),
			want: []string{fmt.Sprintf("remove-member %x node= (the learner did not start and catch up", member("b", true).ID)}},
		{name: "a learner within its bound is left to catch up",
			obs: with(leaderObs(3, cluster(member("a", true), member("c", true), learner("b", false, time.Minute)), node("a", "member"), node("b", "member"), node("c", "member")),
				func(o *Observed) { o.LearnerTimeout = 10 * time.Minute }),
			want: nil},
		{name: "a version step that keeps failing: backups go on",
			obs: with(leaderObs(2, cluster(member("a", true), member("b", true)),
				func() Node { n := node("a", "member"); n.Installed = []string{"3.6.16", "3.7.3"}; return n }(),
				func() Node { n := node("b", "member"); n.Installed = []string{"3.6.16", "3.7.3"}; return n }()),
				func(o *Observed) {
					o.Spec.EtcdVersion, o.VersionBackup = "3.7.3", "3.7.3"
					o.Backoff = map[string]string{"set-member-version b 3.7.3": "etcd exited"}
					o.BackupDue = true
				}),
			want: []string{"report[INFO] an action keeps failing", "take-backup (periodic)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assertPlan(t, tt.obs, tt.want) })
	}
}

// No amnesia: etcd never starts as an existing member on an empty data
// dir, and a node whose data is gone is replaced by a new member.
func TestPlanLostData(t *testing.T) {
	with := func(o Observed, f func(*Observed)) Observed { f(&o); return o }
	lost := func(id string) Node { n := node(id, "member"); n.HasData, n.DataLost = false, true; return n }
	tests := []struct {
		name string
		obs  Observed
		want []string
	}{
		{name: "a member whose data is gone is not started",
			obs:  Observed{Spec: specN(3), Created: &spec.ClusterCreated{ClusterToken: "tok"}, Self: node("a", "wiped")},
			want: []string{"report[ERROR] this node's etcd data is missing; not starting etcd"}},
		{name: "a joiner that never ran starts on its empty data dir",
			obs: with(Observed{Spec: specN(3), Created: &spec.ClusterCreated{ClusterToken: "tok"}}, func(o *Observed) {
				n := node("a", "wiped")
				n.Member.HasRun = false
				o.Self = n
			}),
			want: []string{"start-etcd"}},
		{name: "data that vanished under a running etcd: the member is replaced",
			obs: leaderObs(3, cluster(member("a", true), member("b", true), member("c", true)),
				node("a", "member"), lost("b"), node("c", "member")),
			want: []string{fmt.Sprintf("remove-member %x node=b (its data dir vanished while etcd ran)", member("b", true).ID)}},
		{name: "not while removing it would lose quorum",
			obs: leaderObs(3, cluster(member("a", true), member("b", true), member("c", false)),
				node("a", "member"), lost("b")),
			want: nil},
		{name: "a node back under its own name without its membership record: the member is replaced",
			obs: leaderObs(3, cluster(member("a", true), member("b", false), member("c", true)),
				node("a", "member"), node("b", "standby"), node("c", "member")),
			want: []string{fmt.Sprintf("remove-member %x node=b (its node lost its membership record)", member("b", true).ID)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assertPlan(t, tt.obs, tt.want) })
	}
}

// An isolated standby does not ask for a restore while the cluster's
// members still publish their data; only a cluster with no member does.
func TestPlanNoMembersNeedsEvidence(t *testing.T) {
	created := &spec.ClusterCreated{ClusterToken: "tok"}
	obs := func(recs ...Record) Observed {
		return Observed{Spec: specN(3), Created: created, Self: node("z", "standby"), Peers: []Node{node("z", "standby")},
			LockHeld: true, Records: recs, RecordFresh: 10 * time.Second}
	}
	tests := []struct {
		name string
		obs  Observed
		want string
	}{
		{"members publish their data: cut off, not lost", obs(Record{NodeID: "a", Age: time.Second, ClusterToken: "tok", HasData: true, Healthy: true, RaftLeader: 7}),
			"report[WARN] cannot reach any member of the cluster"},
		{"their records are old: the cluster is lost", obs(Record{NodeID: "a", Age: time.Hour, ClusterToken: "tok", HasData: true}),
			"report[ERROR] " + MsgNoMembers},
		{"no records at all", obs(), "report[ERROR] " + MsgNoMembers},
		{"only standbys publish", obs(Record{NodeID: "b", Age: time.Second}), "report[ERROR] " + MsgNoMembers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := describe(Plan(tt.obs)); !strings.HasPrefix(got, tt.want) {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
		})
	}
}

// assertPlan checks that the plan for obs is the actions want, one
// prefix of each action's description apiece, in order.
func assertPlan(t *testing.T, obs Observed, want []string) {
	t.Helper()
	got := Plan(obs)
	if len(got) != len(want) {
		t.Fatalf("got %d actions (%s), want %d (%s)", len(got), describe(got), len(want), strings.Join(want, "; "))
	}
	for i, w := range want {
		if d := describe(got[i : i+1]); !strings.HasPrefix(d, w) {
			t.Errorf("action %d: %s, want %s", i, d, w)
		}
	}
}

// A command whose status is damaged is failed under that status's term,
// so that the failure is what readers see, once.
func TestPlanFailsUnderTheStatusTerm(t *testing.T) {
	c := cmd("r1", spec.Command{RestoreBackup: &spec.RestoreBackupCommand{Backup: "b"}}, spec.CommandPending)
	c.Err, c.StatusTerm = errors.New("control/r1/_status-00000000000000000005.json: truncated"), 5
	for _, o := range []Observed{
		{Spec: specN(1), Self: node("a", "standby"), Peers: []Node{node("a", "standby")}, LockHeld: true, Commands: []Command{c}},
		func() Observed {
			o := leaderObs(1, cluster(member("a", true)), node("a", "member"))
			o.Commands = []Command{c}
			return o
		}(),
	} {
		var fail *FailCommand
		for _, a := range Plan(o) {
			if f, ok := a.(FailCommand); ok {
				fail = &f
			}
		}
		if fail == nil || fail.ID != "r1" || fail.Term != 5 {
			t.Errorf("plan %s: want fail-command r1 under term 5, got %+v", describe(Plan(o)), fail)
		}
	}
}

func TestActivity(t *testing.T) {
	for _, c := range []struct {
		actions     []Action
		proc, phase string
	}{
		{nil, "", ""},
		{[]Action{MoveLeader{To: 1}}, "", ""},
		{[]Action{Report{Msg: "x"}, MoveLeader{To: 1}, SetMemberVersion{NodeID: "a", Version: "3.6.16"}}, "roll", "version"},
		{[]Action{SetMemberSettings{NodeID: "a"}}, "roll", "settings"},
		{[]Action{SyncCA{NodeID: "a"}}, "roll", "ca"},
		{[]Action{AdvanceCARotation{From: "trust-both", To: "trusted"}}, "roll", "ca"},
		{[]Action{DefragMember{NodeID: "a"}}, "defrag", "defragment"},
		{[]Action{RecoverSpace{}}, "defrag", "nospace"},
		{[]Action{TakeBackup{Kind: spec.BackupPeriodic}}, "", ""},
	} {
		proc, phase := Activity(c.actions)
		if proc != c.proc || phase != c.phase {
			t.Errorf("Activity(%v) = %q %q, want %q %q", c.actions, proc, phase, c.proc, c.phase)
		}
	}
}
