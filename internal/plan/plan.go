package plan

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// MsgNoMembers is reported, word for word, when the store says a cluster
// was created but no node holds its data. Only a restore may proceed.
const MsgNoMembers = "etcd has 0 members registered; must issue restore-backup command to proceed"

// Observed is what one cycle saw. It is plain data, built by observe.
type Observed struct {
	// StoreErr is set when the backup store could not be read.
	StoreErr error
	// Spec is the desired spec; nil when the store has none.
	Spec *spec.ClusterSpec
	// SpecErr is set when the stored spec is unreadable or invalid.
	SpecErr error
	// CARotation is the store's CA rotation in progress, nil for none;
	// CARotationErr is set when its record cannot be used (leader only).
	CARotation    *CARotation
	CARotationErr error
	// SpecBinaryErr is set when this node has no etcd binary for the
	// spec's version.
	SpecBinaryErr error
	// Created is the store's creation marker; nil when absent.
	Created *spec.ClusterCreated
	// Self is this node; Peers are all agents reached, Self included.
	Self  Node
	Peers []Node
	// Cluster is set when this node's etcd is the raft leader and a
	// linearizable read just succeeded: this agent leads, through etcd.
	Cluster *ClusterView
	// LockHeld is set when no cluster is visible and this node holds the
	// store's leader lock: this agent leads, for creation only.
	LockHeld bool
	// Grace is how long a member may be unhealthy before it is replaced.
	Grace time.Duration
	// LearnerTimeout is how long a member may stay a learner (or added but
	// not started) before it is removed again; 0 waits forever.
	LearnerTimeout time.Duration
	// Backoff holds the actions (by ActionKey) that failed and wait before
	// they are tried again, with the last error: the planner passes them
	// over for other work.
	Backoff map[string]string
	// PendingTimeout is how long a node waits for the creation marker of a
	// creation it was told about before it gives up.
	PendingTimeout time.Duration
	// BackupDue is set when the periodic backup is due (leader only).
	BackupDue bool
	// BackedUpSinceChange is set when a backup was taken after the last
	// membership change; BackupFailedRecently when the last attempt failed
	// moments ago, so that a store outage cannot block self-healing.
	BackedUpSinceChange  bool
	BackupFailedRecently bool
	// VersionBackup is the version a backup was taken for, before the
	// members started moving to it.
	VersionBackup string
	// DefragWindowOpen is set while the spec's defrag window lets
	// defragmentation run.
	DefragWindowOpen bool
	// HashCheckDue is set when the leader's periodic comparison of the
	// members' HashKV is due; HashCheck is the last comparison, nil when
	// none is new since its last step.
	HashCheckDue bool
	HashCheck    *HashCheck
	// HashCheckedAgo is how long ago the leader last compared the
	// members' HashKV (0: never); a comparison asked for by a failed
	// initial check is not repeated sooner than RecheckFailedAfter.
	HashCheckedAgo time.Duration
	// SpaceCompacted is set once the leader compacted etcd to its head
	// since the NOSPACE alarm it last saw was raised.
	SpaceCompacted bool
	// IsolatedDefragFailed holds the nodes whose isolated
	// defragmentation failed lately: they are defragmented in place for
	// a while instead, so that a failure does not restart their etcd
	// again and again.
	IsolatedDefragFailed map[string]bool
	// Commands is the store's command queue, oldest first, as read by an
	// agent that leads or may lead (see observe).
	Commands []Command
	// NewerFormat is set when a record this agent needs (the store lock)
	// was written by a newer etcd-manager.
	NewerFormat error
	// LockRefused is set when this agent may not take the store lock: the
	// store does not honour create-if-absent, or the clocks disagree.
	LockRefused error
	// Revoked are the nodes whose certificates etcd-manager-ctl
	// revoke-node revoked: the last list read from the store.
	Revoked map[string]bool
	// Records are the agents' own records in the store, reachable or not,
	// read when the plan needs evidence about agents it cannot reach; a
	// record is fresh while its Age is at most RecordFresh.
	Records     []Record
	RecordFresh time.Duration
	// RecordsErr is set when the store did not answer for some records:
	// Records may be incomplete, so their absence proves nothing.
	RecordsErr error
	// NoLeaderSettle is how long a member must have seen no raft leader
	// for that to count as lost quorum rather than an election.
	NoLeaderSettle time.Duration
	// NewestBackups is the newest backup of each cluster token, read while
	// a recover-quorum is queued: a survivor behind it must not seed the
	// cluster. NewestBackupsErr is set when they could not be read.
	NewestBackups    map[string]BackupPoint
	NewestBackupsErr error
}

// BackupPoint is a backup and the etcd revision it holds.
type BackupPoint struct {
	Name     string
	Revision int64
}

// Record is what an agent last published about itself in the store.
type Record struct {
	NodeID string
	// Address is its peer API's host:port.
	Address string
	// Age is how long ago it was published, by this agent's clock.
	Age time.Duration
	// ClusterToken is its membership, empty for a standby; HasData, whether
	// it held the member's data.
	ClusterToken string
	HasData      bool
	// Healthy is whether its etcd answered, and RaftLeader the leader its
	// etcd knew (0: none), and NoLeaderFor for how long it had known none.
	Healthy     bool
	RaftLeader  uint64
	NoLeaderFor time.Duration
}

// Command is a queued command as observed.
type Command struct {
	// ID is the command's ID in the queue (control/<ID>/).
	ID      string
	Command spec.Command
	// Err is set when the command object is junk (unparsable or invalid),
	// which the leader marks failed.
	Err error
	// Newer is set when the command or its status was written by a newer
	// etcd-manager: no agent of this version acts on it.
	Newer  error
	Status spec.CommandStatus
	// StatusTerm is the fencing term the status was written under (0
	// outside procedures), known even when the status is damaged.
	StatusTerm int64
	// Age is how long ago its status was last written, or, without a
	// status, how long ago it was queued.
	Age time.Duration
	// Expired is set when the command's expiry (spec.Command.Expires)
	// has passed. One that has not started by then is failed, not
	// started.
	Expired bool
}

// Started reports whether the leader has taken the command up: it runs,
// or has recorded progress. A started command never expires.
func (c Command) Started() bool {
	st := c.Status
	return st.State == spec.CommandRunning || st.Restore != nil || st.Node != "" || len(st.Defragmented) > 0
}

// lapsed reports whether c expired before it started: the leader fails
// it rather than start it, and nothing else plans it.
func (c Command) lapsed() bool {
	return c.Expired && c.Err == nil && c.Newer == nil && !c.Status.Finished() && !c.Started()
}

// Membership is a node's etcd membership, from its local state.
type Membership struct {
	// ClusterToken names the cluster the member belongs to.
	ClusterToken string
	// EtcdVersion is the version the node is set to run.
	EtcdVersion string
	// NewCluster is set until etcd has bootstrapped the new cluster.
	NewCluster bool
	// HasRun is set once etcd has written the member's data: lost data
	// then means a new member, never a restart with an empty log.
	HasRun bool
	// Pending is set while a creation waits for the store's marker.
	Pending bool
	// Quarantined is set while etcd serves on the quarantine URLs only.
	Quarantined bool
	// ForceNewCluster is set while a recover-quorum restarts etcd with
	// --force-new-cluster.
	ForceNewCluster bool
	// V2Until is the raft index up to which the member's log may hold the
	// v2 entries etcd 3.5 writes.
	V2Until uint64
	// Settings are the spec's etcd settings the member runs with.
	Settings spec.Settings
	// PeerCertHostname is the name the member's etcd requires of peer
	// certificates, empty while it takes any from the CA (see
	// planPeerCertCheck).
	PeerCertHostname string
}

// Node is one agent as observed.
type Node struct {
	ID         string
	Address    string
	PeerURLs   []string
	ClientURLs []string
	// QuarantineURLs are where its etcd serves while quarantined.
	QuarantineURLs []string
	// Member is the node's etcd membership from its local state.
	Member *Membership
	// HasData is true when the node's etcd data for Member's token is on
	// disk.
	HasData bool
	// DataLost is true when etcd has run on the member's data and the
	// data is gone.
	DataLost bool
	// PendingFor is how long a pending creation has waited.
	PendingFor time.Duration
	// EtcdWanted is true while the node's supervisor keeps etcd running.
	EtcdWanted bool
	// Healthy is true when the node's etcd answered a status call.
	Healthy bool
	// Version is the server version its etcd reported.
	Version string
	// MemberID is its etcd's member ID, RaftLeader the raft leader its
	// etcd knows (0: none), and RaftIndex how far its log goes.
	MemberID, RaftLeader, RaftIndex uint64
	// SnapIndex is the raft index of its etcd's newest raft snapshot.
	SnapIndex uint64
	// Revision is the etcd revision its etcd has applied or, while its
	// etcd does not serve, that of its data when etcd last started; 0
	// when unknown.
	Revision int64
	// StorageVersion is its etcd's data schema version, and
	// DowngradeTarget the cluster downgrade its etcd reports enabled.
	StorageVersion, DowngradeTarget string
	// ClusterVersion is the cluster version its etcd reports; it is read
	// only while a downgrade is enabled.
	ClusterVersion string
	// Installed are the etcd versions installed on the node.
	Installed []string
	// BackupKeys are the IDs of the encryption keys its agent holds for
	// backups and captured segments.
	BackupKeys []string
	// LocalMembers are the members its etcd knows, from its own copy of
	// the membership (a read that needs no quorum): names and peer URLs.
	LocalMembers []Member
	// NoLeaderFor is how long its etcd, a member, has seen no raft leader
	// without a break.
	NoLeaderFor time.Duration
	// CertMarker is the node marker its certificate carries, which
	// etcd can require of peers; empty when it carries none (an older
	// agent, or etcd without TLS). PeerCertCheckOff is set when its agent
	// asks for etcd to take any certificate from the CA instead
	// (--etcd-peer-cert-check=false).
	CertMarker       string
	PeerCertCheckOff bool
	// Trust are the SHA-256 fingerprints of the CAs its agent trusts,
	// EtcdTrust those its etcd was started with, and CertCA that of the
	// CA that issued its certificate; all empty without TLS. CAFromDir
	// is set when its agent takes its CA from --pki-dir (see
	// planCARotation).
	Trust, EtcdTrust []string
	CertCA           string
	CAFromDir        bool
	// RestoreRoom is the largest snapshot its agent would unpack for a
	// restore now (0: unknown).
	RestoreRoom int64
	// HeldBy is the term of the driver that holds its etcd down; 0 when
	// none does. DataIndex is then the raft index its data is applied to,
	// read from its database (0: unknown), and Revision and LocalMembers
	// come from the database too.
	HeldBy    int64
	DataIndex uint64
	// InitialCheckFailed is set while its agent keeps etcd stopped after
	// its initial corruption check failed, for the leader to judge, and
	// InitialCheckFailedFor how long; Unjudged while it runs after it
	// started without the check, with no leader to judge it then.
	InitialCheckFailed    bool
	InitialCheckFailedFor time.Duration
	Unjudged              bool
}

// ClusterView is the etcd cluster as its raft leader sees it.
type ClusterView struct {
	Token   string
	Members []Member
	// NoSpace lists the members with etcd's NOSPACE alarm raised;
	// AlarmsKnown is false when no member's status was read.
	NoSpace     []uint64
	AlarmsKnown bool
	// Corrupt lists the members with etcd's CORRUPT alarm raised.
	Corrupt []uint64
}

// Member is one etcd member.
type Member struct {
	ID         uint64
	Name       string
	PeerURLs   []string
	ClientURLs []string
	IsLearner  bool
	Healthy    bool
	// UnhealthyFor is how long the member has been seen unhealthy.
	UnhealthyFor time.Duration
	// LearnerFor is how long the member has been seen a learner, or added
	// but not started.
	LearnerFor time.Duration
	// RaftIndex is its log's index, read by the leader in the same pass
	// as every other member's, so the figures compare.
	RaftIndex uint64
	// DBSize is the size of its database file, DBSizeInUse how much of
	// it holds data (the rest is what a defragmentation gives back).
	DBSize, DBSizeInUse int64
}

// Action is one step the executor performs.
type Action interface {
	fmt.Stringer
	// Mutates reports whether the action changes the cluster or node; the
	// executor re-observes after each one.
	Mutates() bool
}

// StartEtcd starts (or re-adopts) the local etcd from the node's state.
type StartEtcd struct{}

// MarkBootstrapped records that the local etcd has bootstrapped its new
// cluster, so it is never started as a new cluster again.
type MarkBootstrapped struct{}

// ConfirmCreate starts the local member of a creation that the store's
// marker confirms.
type ConfirmCreate struct{ Token string }

// AbandonPending drops a pending creation that lost, or never completed.
type AbandonPending struct {
	Token  string
	Reason string
}

// CreateCluster creates a new cluster of the given nodes and version.
// PeerCertHostname, when set, is required of peer certificates by every
// member from the start: all the nodes carry it.
type CreateCluster struct {
	Members          []string
	Version          string
	PeerCertHostname string
	// On is what Plan attached (see Targets).
	On Targets
}

// AddMember adds a standby node to the cluster as a learner.
type AddMember struct {
	NodeID string
	// On is what Plan attached (see Targets).
	On Targets
}

// PromoteMember promotes a caught-up learner to a voting member.
type PromoteMember struct{ MemberID uint64 }

// RemoveMember removes an etcd member, then tells its node (if known) to
// leave.
type RemoveMember struct {
	MemberID uint64
	NodeID   string
	Reason   string
	// StuckLearner marks the removal of a learner that did not start or
	// catch up in time: its node is not added again at once.
	StuckLearner bool
	// On is what Plan attached (see Targets).
	On Targets
}

// EvictNode tells a node that is not a member to drop its stale
// membership.
type EvictNode struct {
	NodeID string
	Token  string
	Reason string
	// On is what Plan attached (see Targets).
	On Targets
}

// TakeBackup takes a full backup through the local etcd. With
// CommandIDs, it runs those backup-now commands, every one queued so far,
// and records the outcome in each: one backup started after they were
// queued answers them all.
type TakeBackup struct {
	Reason string
	// Kind is spec.BackupPeriodic, BackupPreChange or BackupOnDemand.
	Kind       string
	CommandIDs []string
	// ForVersion marks the backup taken before moving to that version.
	ForVersion string
}

// FailCommand marks a queued command failed, keeping it for the operator
// to read in list-commands and delete. Term is the term of its status, so
// that the failure is the status readers see.
type FailCommand struct {
	ID     string
	Reason string
	Term   int64
	// On is what Plan attached (see Targets).
	On Targets
}

// ForgetCommand removes a command that finished long ago.
type ForgetCommand struct{ ID string }

// NoteCommand writes why a procedure's command waits into its status,
// for the operator's ctl to show; it stays pending.
type NoteCommand struct {
	ID, Message string
	// On is what Plan attached (see Targets).
	On Targets
}

// Report logs a state that needs no action from this node, or one that a
// person must act on (at error level).
type Report struct {
	Level slog.Level
	Msg   string
	Attrs []any
	// Status, when set, is a line for etcd-manager-ctl status: the leader
	// shows it for as long as its plan keeps returning the report.
	Status string
}

// StatusLines are the Status lines of the plan's reports, in order.
func StatusLines(actions []Action) []string {
	var out []string
	for _, a := range actions {
		if r, ok := a.(Report); ok && r.Status != "" {
			out = append(out, r.Status)
		}
	}
	return out
}

func (StartEtcd) String() string        { return "start-etcd" }
func (StartEtcd) Mutates() bool         { return true }
func (MarkBootstrapped) String() string { return "mark-bootstrapped" }
func (MarkBootstrapped) Mutates() bool  { return false }
func (a ConfirmCreate) String() string  { return "confirm-create " + a.Token }
func (ConfirmCreate) Mutates() bool     { return true }
func (a AbandonPending) String() string { return "abandon-pending " + a.Token + " (" + a.Reason + ")" }
func (AbandonPending) Mutates() bool    { return true }
func (a CreateCluster) String() string {
	return fmt.Sprintf("create-cluster %v %s", a.Members, a.Version)
}
func (CreateCluster) Mutates() bool    { return true }
func (a AddMember) String() string     { return "add-member " + a.NodeID }
func (AddMember) Mutates() bool        { return true }
func (a PromoteMember) String() string { return fmt.Sprintf("promote-member %x", a.MemberID) }
func (PromoteMember) Mutates() bool    { return true }
func (a RemoveMember) String() string {
	return fmt.Sprintf("remove-member %x node=%s (%s)", a.MemberID, a.NodeID, a.Reason)
}
func (RemoveMember) Mutates() bool   { return true }
func (a EvictNode) String() string   { return "evict-node " + a.NodeID + " (" + a.Reason + ")" }
func (EvictNode) Mutates() bool      { return true }
func (a TakeBackup) String() string  { return "take-backup (" + a.Reason + ")" }
func (TakeBackup) Mutates() bool     { return true }
func (a FailCommand) String() string { return "fail-command " + a.ID + " (" + a.Reason + ")" }
func (FailCommand) Mutates() bool    { return false }
func (a ForgetCommand) String() string {
	return "forget-command " + a.ID
}
func (ForgetCommand) Mutates() bool { return false }
func (a NoteCommand) String() string {
	return "note-command " + a.ID
}
func (NoteCommand) Mutates() bool { return false }
func (a Report) String() string   { return "report " + a.Msg }
func (Report) Mutates() bool      { return false }

// Plan decides what to do next from the desired spec and what was
// observed. It is pure: no I/O, no clock, no randomness. Each action
// carries the observed nodes and command it acts on (see Targets).
func Plan(o Observed) []Action {
	return attach(o, decide(o))
}

// decide is Plan without the targets attached.
func decide(o Observed) []Action {
	if o.Revoked[o.Self.ID] {
		return planRevokedSelf(o)
	}
	actions := planLocal(o)

	switch {
	case o.StoreErr != nil:
		return append(actions, Report{Level: slog.LevelError, Msg: "backup store unreachable; will retry", Attrs: []any{"error", o.StoreErr}})
	case o.SpecErr != nil:
		return append(actions, Report{Level: slog.LevelError, Msg: "cluster spec is invalid; keeping etcd as it is until it is fixed with etcd-manager-ctl configure-cluster", Attrs: []any{"error", o.SpecErr}})
	case o.Spec == nil:
		return append(actions, Report{Level: slog.LevelInfo, Msg: "waiting for a cluster spec; set one with etcd-manager-ctl configure-cluster"})
	}

	if waits := planNewerFormat(o); len(waits) > 0 {
		return append(actions, waits...)
	}
	if o.LockRefused != nil {
		actions = append(actions, Report{Level: slog.LevelError, Msg: "this agent does not take the store lock; it leads only through etcd while etcd has quorum",
			Attrs: []any{"error", o.LockRefused}})
	}
	if r := ActiveExclusive(o.Commands); r != nil {
		if !o.LockHeld {
			return append(actions, Report{Level: slog.LevelInfo, Msg: "a " + r.Command.Kind() + " is in progress; the agent holding the store lock drives it",
				Attrs: []any{"command", r.ID}})
		}
		if r.Command.RecoverQuorum != nil {
			return append(actions, planRecoverQuorum(o, *r)...)
		}
		return append(actions, planRestore(o, *r)...)
	}
	if o.Cluster != nil || o.LockHeld {
		actions = append(actions, planReleaseHolds(o)...)
	}
	if m := o.Self.Member; m != nil && m.Pending {
		return append(actions, planPending(o)...)
	}
	switch {
	case o.Cluster != nil:
		return append(actions, planCluster(o)...)
	case o.LockHeld:
		for _, c := range o.Commands {
			if c.Err != nil && c.Newer == nil && c.Status.State != spec.CommandFailed {
				actions = append(actions, FailCommand{ID: c.ID, Reason: c.Err.Error(), Term: c.StatusTerm})
			}
		}
		return append(actions, planNoCluster(o)...)
	case o.Self.Member == nil:
		return append(actions, Report{Level: slog.LevelInfo, Msg: "standby: not an etcd member"})
	}
	return actions
}

// NoCluster reports whether the store lock leads: no node holds or is
// creating cluster data, and the lock's holder would have something to do.
func NoCluster(o Observed) bool {
	return o.Cluster == nil && !anyLiveMember(o.Peers) && lockWorthwhile(o)
}

// lockWorthwhile reports whether the lock holder would have anything to
// do: an agent that cannot see enough agents to create the cluster leaves
// the lock to one that can, instead of holding it while it waits.
func lockWorthwhile(o Observed) bool {
	if o.Spec == nil {
		return false
	}
	if o.Created != nil {
		return true
	}
	free := 0
	for _, p := range o.Peers {
		if p.Member == nil {
			free++
		}
	}
	return free >= int(o.Spec.MemberCount)
}

// anyLiveMember reports whether any node holds, or is creating, cluster
// data.
func anyLiveMember(nodes []Node) bool {
	for _, n := range nodes {
		if m := n.Member; m != nil && (n.HasData || m.NewCluster || m.Pending || n.Healthy) {
			return true
		}
	}
	return false
}

// planNewerFormat waits, saying why, while a record that this agent
// would act on was written by a newer etcd-manager: the store lock, or a
// command that may replace the cluster (a restore-like command, or one of
// a kind this version does not know). A newer backup-now is only left
// alone; the rest of the plan goes on.
func planNewerFormat(o Observed) []Action {
	const msg = "a record in the store was written by a newer etcd-manager; this agent waits until it is upgraded"
	var waits []Action
	if o.NewerFormat != nil {
		waits = append(waits, Report{Level: slog.LevelWarn, Msg: msg, Attrs: []any{"error", o.NewerFormat}})
	}
	for _, c := range o.Commands {
		if c.Newer == nil {
			continue
		}
		k := c.Command
		if (k.BackupNow != nil || k.Defrag != nil) && k.RestoreBackup == nil && k.RecoverQuorum == nil && k.DumpRestore == nil {
			continue
		}
		waits = append(waits, Report{Level: slog.LevelWarn, Msg: msg, Attrs: []any{"command", c.ID, "error", c.Newer}})
	}
	return waits
}

// planLocal keeps this node's own etcd running from local state alone,
// whatever the store says: a bad spec or an unreachable store must never
// take a healthy member down.
func planLocal(o Observed) []Action {
	var actions []Action
	m := o.Self.Member
	switch {
	case m == nil || m.Pending || o.Self.EtcdWanted:
	case o.Self.HeldBy != 0:
		actions = append(actions, Report{Level: slog.LevelInfo, Msg: "etcd is held down by a procedure's driver until it releases it",
			Attrs: []any{"term", o.Self.HeldBy}})
	case o.Self.InitialCheckFailed && o.Self.InitialCheckFailedFor >= FailedCheckPatience && !leaderServes(o.Peers):
		actions = append(actions, ResumeUnjudged{Reason: fmt.Sprintf("no member's etcd has served with a leader for the %s since the check failed", FailedCheckPatience)})
	case o.Self.InitialCheckFailed:
		actions = append(actions, Report{Level: slog.LevelError, Msg: "etcd's initial corruption check failed: its data differs from a peer's; etcd stays stopped until the leader compares every member's data and rebuilds the minority",
			Attrs: []any{"cluster-token", m.ClusterToken}})
	case !o.Self.HasData && m.HasRun:
		// Starting etcd as the old member on an empty data dir would
		// rejoin with an empty log, or panic. The leader removes this
		// member and adds the node back with fresh data.
		actions = append(actions, Report{Level: slog.LevelError, Msg: "this node's etcd data is missing; not starting etcd",
			Attrs: []any{"cluster-token", m.ClusterToken}})
	default:
		actions = append(actions, StartEtcd{})
	}
	// etcd itself ignores --initial-cluster-state once it has data, so
	// record that as soon as the data is there.
	if m != nil && (m.NewCluster || !m.HasRun) && o.Self.HasData {
		actions = append(actions, MarkBootstrapped{})
	}
	return actions
}

// FailedCheckPatience is how long a member whose initial check failed
// waits, stopped, for a leader to judge it, when no member serves with a
// leader: after that it starts without the check (ResumeUnjudged).
const FailedCheckPatience = 30 * time.Second

// ResumeUnjudged starts this node's etcd without its initial check, which
// failed with no leader to judge it.
type ResumeUnjudged struct{ Reason string }

func (a ResumeUnjudged) String() string { return "resume-unjudged (" + a.Reason + ")" }
func (ResumeUnjudged) Mutates() bool    { return true }

// leaderServes says whether a reachable node's etcd serves with a raft
// leader.
func leaderServes(nodes []Node) bool {
	for _, n := range nodes {
		if n.Healthy && n.RaftLeader != 0 {
			return true
		}
	}
	return false
}

// planPending finishes or drops a creation this node was told about.
func planPending(o Observed) []Action {
	token := o.Self.Member.ClusterToken
	switch {
	case o.Created != nil && o.Created.ClusterToken == token:
		return []Action{ConfirmCreate{Token: token}}
	case o.Created != nil:
		return []Action{AbandonPending{Token: token, Reason: "another creation won"}}
	case o.Self.PendingFor > o.PendingTimeout:
		return []Action{AbandonPending{Token: token, Reason: "the creation was never confirmed"}}
	}
	return []Action{Report{Level: slog.LevelInfo, Msg: "waiting for the cluster creation to be confirmed", Attrs: []any{"cluster-token", token}}}
}

// planNoCluster runs on the lock holder while no node has cluster data.
func planNoCluster(o Observed) []Action {
	var pending []string
	for _, p := range o.Peers {
		if p.Member != nil && (p.Member.Pending || p.Member.NewCluster || p.HasData) {
			pending = append(pending, p.ID)
		}
	}
	if len(pending) > 0 {
		return []Action{Report{Level: slog.LevelInfo, Msg: "waiting for a cluster creation in progress", Attrs: []any{"nodes", pending}}}
	}
	switch {
	case o.Created != nil:
		// Only a cluster that truly has no members needs a restore; an
		// agent cut off from members that still publish their data must
		// not say so.
		for _, r := range o.Records {
			if r.NodeID != o.Self.ID && r.Age <= o.RecordFresh && r.HasData && r.ClusterToken != "" {
				return []Action{Report{Level: slog.LevelWarn, Msg: "cannot reach any member of the cluster, though their agents publish their data in the store; is this agent cut off from them?",
					Attrs: []any{"member", r.NodeID, "record-age", r.Age.Round(time.Second)}}}
			}
		}
		return []Action{Report{Level: slog.LevelError, Msg: MsgNoMembers}}
	case o.SpecBinaryErr != nil:
		return []Action{Report{Level: slog.LevelError, Msg: "cannot create the cluster: no etcd binary for the spec's version", Attrs: []any{"error", o.SpecBinaryErr}}}
	}
	want := int(o.Spec.MemberCount)
	ids := make([]string, 0, len(o.Peers))
	for _, p := range o.Peers {
		if p.Member == nil && ordinalFits(o.Spec, p.ID) && !o.Revoked[p.ID] {
			ids = append(ids, p.ID)
		}
	}
	if len(ids) < want {
		return []Action{Report{Level: slog.LevelInfo, Msg: "waiting for enough agents to create the cluster", Attrs: []any{"have", len(ids), "want", want}}}
	}
	sort.Strings(ids)
	chosen, err := findNodes(o.Peers, ids[:want])
	if err != nil {
		return nil // the IDs come from o.Peers
	}
	return []Action{CreateCluster{Members: ids[:want], Version: o.Spec.EtcdVersion, PeerCertHostname: PeerCertHostname(chosen)}}
}

// planCluster runs on the agent beside etcd's raft leader. A membership
// change is preceded by a backup; the periodic backup runs when nothing
// else is to be done.
func planCluster(o Observed) []Action {
	var actions []Action
	for _, a := range planStrayQuarantine(o) {
		if _, ok := a.(Report); ok {
			// Held quarantined: nothing else is done to a cluster no
			// client may reach yet.
			return []Action{a}
		}
		// A lift that keeps failing backs off; the rest goes on.
		if why, ok := o.Backoff[ActionKey(a)]; ok {
			actions = append(actions, backingOff(a, why))
			continue
		}
		return []Action{a}
	}
	actions = append(actions, planMembership(o)...)
	mutating := -1
	for i, a := range actions {
		if a.Mutates() {
			mutating = i
			break
		}
	}
	if mutating >= 0 {
		switch actions[mutating].(type) {
		case AddMember, RemoveMember:
			if !o.BackedUpSinceChange {
				if !o.BackupFailedRecently {
					return []Action{TakeBackup{Reason: "before " + actions[mutating].String(), Kind: spec.BackupPreChange}}
				}
				actions = append([]Action{Report{Level: slog.LevelWarn, Msg: "changing membership without a fresh backup: the last backup attempt failed"}}, actions...)
			}
		}
		return actions
	}
	cmdActions := planCommands(o.Commands, o.BackupFailedRecently)
	for _, a := range cmdActions {
		if a.Mutates() {
			return append(actions, cmdActions...)
		}
	}
	actions = append(actions, cmdActions...)
	if o.BackupDue {
		actions = append(actions, TakeBackup{Reason: "periodic", Kind: spec.BackupPeriodic})
	}
	return actions
}

// CommandKeep is how long a done command stays listed before the leader
// removes it. Failed commands stay until an operator deletes them.
const CommandKeep = time.Hour

// planCommands works through the command queue: junk is marked failed
// (once), one backup answers every unfinished backup-now, done commands are
// forgotten after CommandKeep. At most one mutating action is returned.
// Restore commands are left for the restore flow.
func planCommands(cmds []Command, backupFailedRecently bool) []Action {
	var actions []Action
	var backupNow []string
	for _, c := range cmds {
		switch {
		case c.Newer != nil:
			actions = append(actions, Report{Level: slog.LevelWarn, Msg: "a command in the store was written by a newer etcd-manager; leaving it alone",
				Attrs: []any{"command", c.ID, "error", c.Newer}})
		case c.Status.State == spec.CommandFailed:
		case c.Err != nil:
			actions = append(actions, FailCommand{ID: c.ID, Reason: c.Err.Error(), Term: c.StatusTerm})
		case c.lapsed():
			actions = append(actions, FailCommand{ID: c.ID, Term: c.StatusTerm,
				Reason: "expired before it started: it was queued " + queuedAt(c.Command) + " with an expiry of " + time.Unix(0, int64(c.Command.Expires)).UTC().Format(time.RFC3339) + "; queue it again if it is still wanted"})
		case c.Status.State == spec.CommandDone:
			if c.Age >= CommandKeep {
				actions = append(actions, ForgetCommand{ID: c.ID})
			}
		case c.Command.BackupNow != nil:
			backupNow = append(backupNow, c.ID)
		}
	}
	switch {
	case len(backupNow) == 0:
	case backupFailedRecently:
		actions = append(actions, Report{Level: slog.LevelInfo, Msg: "backup-now waits: the last backup attempt failed moments ago", Attrs: []any{"commands", backupNow}})
	default:
		actions = append(actions, TakeBackup{Reason: "backup-now " + strings.Join(backupNow, " "), Kind: spec.BackupOnDemand, CommandIDs: backupNow})
	}
	return actions
}

// queuedAt is when a command was queued, as RFC 3339.
func queuedAt(c spec.Command) string {
	return time.Unix(0, int64(c.Timestamp)).UTC().Format(time.RFC3339)
}

// PlanBackupAgent is the plan of the backup-only agent that holds the
// store lock: the command queue's work, then the periodic backup when it
// is due and no backup-now already takes one.
func PlanBackupAgent(cmds []Command, backupFailedRecently, backupDue bool) []Action {
	actions := planCommands(cmds, backupFailedRecently)
	if backupDue && !hasBackup(actions) {
		actions = append(actions, TakeBackup{Reason: "periodic", Kind: spec.BackupPeriodic})
	}
	return actions
}

func hasBackup(actions []Action) bool {
	for _, a := range actions {
		if _, ok := a.(TakeBackup); ok {
			return true
		}
	}
	return false
}

// planMembership returns at most one mutating action, the most urgent
// first. An action that keeps failing (o.Backoff) is passed over for the
// next candidate, so that one stuck change never blocks the others, nor
// the backups and commands planned after it.
func planMembership(o Observed) []Action {
	p := newMembershipPlan(o)
	for _, rule := range []func() Action{
		p.revoked,       // 0. members whose node was revoked
		p.lostData,      // 1. members whose node lost its data
		p.strays,        // 2. nodes that think they are members but are not
		p.stuckLearners, // 3. learners that did not start or catch up in time
		p.missedJoins,   // 4. members added whose node missed the join
		p.promotions,    // 5. learners ready to vote
		p.replacements,  // 6. members unhealthy past the grace period
		p.shrink,        // 7. too many members
		p.grow,          // 8. too few members
	} {
		if a := rule(); a != nil {
			return append(p.actions, a)
		}
	}
	// Corrupt data comes first, then a NOSPACE alarm; when they only
	// report (live data fills the quota), the rest goes on, a roll that
	// raises the quota among it.
	acts := func(steps []Action) bool {
		return slices.ContainsFunc(steps, func(a Action) bool { return a.Mutates() && !p.backsOff(a) })
	}
	steps := planCorruption(o)
	if !acts(steps) {
		steps = append(steps, planSpace(o)...)
	}
	if !acts(steps) {
		next := planPeerURLs(o)
		if len(next) == 0 {
			next = planVersion(o)
		}
		if len(next) == 0 {
			next = planSettings(o)
		}
		if len(next) == 0 {
			next = planPeerCertCheck(o)
		}
		if len(next) == 0 {
			// A rotation at a gate only reports: maintenance goes on.
			next = planCARotation(o)
			if !acts(next) {
				next = append(next, planDefrag(o)...)
			}
		}
		steps = append(steps, next...)
	}
	for _, a := range steps {
		if !a.Mutates() || p.pick(a) {
			p.actions = append(p.actions, a)
		}
	}
	return p.actions
}

// membershipPlan is the state of one planMembership: the observation,
// lookups over it, and the reports made on the way (actions passed over,
// waits).
type membershipPlan struct {
	o        Observed
	c        *ClusterView
	want     int
	byName   map[string]Member
	peerByID map[string]Node
	// standbys can join; unfit are the IDs of those without the etcd
	// binaries to, and unmarked of those whose certificate the members'
	// etcd would refuse on its peer port.
	standbys []Node
	unfit    []string
	unmarked []string
	actions  []Action
}

func newMembershipPlan(o Observed) *membershipPlan {
	p := &membershipPlan{o: o, c: o.Cluster, want: int(o.Spec.MemberCount), byName: map[string]Member{}, peerByID: map[string]Node{}}
	for _, m := range p.c.Members {
		if m.Name != "" {
			p.byName[m.Name] = m
		}
	}
	for _, n := range o.Peers {
		p.peerByID[n.ID] = n
	}
	p.standbys, p.unfit, p.unmarked = standbyNodes(o)
	return p
}

// nodeOf finds a member's agent: by name, else by peer URLs.
func (p *membershipPlan) nodeOf(m Member) (Node, bool) {
	if n, ok := p.peerByID[m.Name]; ok {
		return n, true
	}
	for _, n := range p.o.Peers {
		if SameURLs(n.PeerURLs, m.PeerURLs) {
			return n, true
		}
	}
	return Node{}, false
}

// nodeIDOf is the ID of a member's agent, or its name when none is seen.
func (p *membershipPlan) nodeIDOf(m Member) string {
	if n, ok := p.nodeOf(m); ok {
		return n.ID
	}
	return m.Name
}

// pick says whether a may be taken now; one backing off after failures
// is reported and passed over.
func (p *membershipPlan) pick(a Action) bool {
	if why, ok := p.o.Backoff[ActionKey(a)]; ok {
		p.actions = append(p.actions, backingOff(a, why))
		return false
	}
	return true
}

// backsOff reports whether a waits out a backoff.
func (p *membershipPlan) backsOff(a Action) bool {
	_, ok := p.o.Backoff[ActionKey(a)]
	return ok
}

// first returns the first of the candidates that may be taken now.
func (p *membershipPlan) first(cands ...Action) Action {
	for _, a := range cands {
		if p.pick(a) {
			return a
		}
	}
	return nil
}

// lostData removes members whose node lost its data: they are re-added
// fresh later.
func (p *membershipPlan) lostData() Action {
	var cands []Action
	for _, m := range p.c.Members {
		n, ok := p.nodeOf(m)
		if !ok || n.ID == p.o.Self.ID {
			continue
		}
		ours := n.Member != nil && n.Member.ClusterToken == p.c.Token && m.Name == n.ID
		switch {
		case n.Member == nil && m.Name != "" && m.Name != n.ID:
			cands = append(cands, RemoveMember{MemberID: m.ID, NodeID: n.ID, Reason: "its node came back without its data"})
		case ours && !n.HasData && !m.Healthy:
			// The member has run (it has a name) but its node has no data.
			// A member that just joined may show no data in a stale report,
			// but it is healthy; one whose data is gone never is.
			cands = append(cands, RemoveMember{MemberID: m.ID, NodeID: n.ID, Reason: "its data dir was wiped"})
		case ours && n.DataLost && keepsQuorum(p.c.Members, m):
			// Its data vanished under a running etcd, which serves on
			// from open files until it restarts, and will not restart.
			cands = append(cands, RemoveMember{MemberID: m.ID, NodeID: n.ID, Reason: "its data dir vanished while etcd ran"})
		case n.Member == nil && m.Name == n.ID && !m.Healthy:
			// The node came back under its own name but without its
			// membership record; it cannot be a standby while the member
			// holds its URLs. Remove the member; the node joins again.
			cands = append(cands, RemoveMember{MemberID: m.ID, NodeID: n.ID, Reason: "its node lost its membership record"})
		}
	}
	return p.first(cands...)
}

// strays tells nodes that think they are members, but are not, to leave.
func (p *membershipPlan) strays() Action {
	var cands []Action
	for _, n := range p.o.Peers {
		if n.Member == nil || n.Member.Pending || n.ID == p.o.Self.ID {
			continue
		}
		_, named := p.byName[n.ID]
		urls := slices.ContainsFunc(p.c.Members, func(m Member) bool { return SameURLs(m.PeerURLs, n.PeerURLs) })
		if n.Member.ClusterToken != p.c.Token || (!named && !urls) {
			cands = append(cands, EvictNode{NodeID: n.ID, Token: n.Member.ClusterToken, Reason: "not a member of the running cluster"})
		}
	}
	return p.first(cands...)
}

// stuckLearners removes learners that did not start, or did not catch up,
// in time; their nodes become standbys.
func (p *membershipPlan) stuckLearners() Action {
	if p.o.LearnerTimeout <= 0 {
		return nil
	}
	var cands []Action
	for _, m := range sortedMembers(p.c.Members) {
		if (!m.IsLearner && m.Name != "") || m.LearnerFor < p.o.LearnerTimeout {
			continue
		}
		cands = append(cands, RemoveMember{MemberID: m.ID, NodeID: p.nodeIDOf(m), StuckLearner: true,
			Reason: fmt.Sprintf("the learner did not start and catch up within %s", p.o.LearnerTimeout)})
	}
	return p.first(cands...)
}

// missedJoins sends the join again to the node of a member added but
// never started.
func (p *membershipPlan) missedJoins() Action {
	var cands []Action
	for _, m := range p.c.Members {
		if m.Name != "" {
			continue
		}
		if n, ok := p.nodeOf(m); ok && n.Member == nil {
			cands = append(cands, AddMember{NodeID: n.ID})
		}
	}
	return p.first(cands...)
}

// promotions promotes learners once they are healthy (etcd refuses until
// the learner has caught up; the loop retries).
func (p *membershipPlan) promotions() Action {
	var cands []Action
	for _, m := range p.c.Members {
		if m.IsLearner && m.Healthy {
			cands = append(cands, PromoteMember{MemberID: m.ID})
		}
	}
	return p.first(cands...)
}

// replacements removes members unhealthy past the grace period, when a
// standby that can run the cluster's etcd can take the place, or the
// cluster is too big anyway.
func (p *membershipPlan) replacements() Action {
	if len(p.standbys) == 0 && len(p.c.Members) <= p.want {
		return nil
	}
	var cands []Action
	for _, m := range sortedMembers(p.c.Members) {
		if m.Healthy || m.UnhealthyFor < p.o.Grace || m.Name == p.o.Self.ID {
			continue
		}
		cands = append(cands, RemoveMember{MemberID: m.ID, NodeID: p.nodeIDOf(m), Reason: fmt.Sprintf("unhealthy for %s", m.UnhealthyFor.Round(time.Second))})
	}
	return p.first(cands...)
}

// shrink removes a member of a cluster bigger than the spec asks:
// unhealthy or a learner first, then the highest name; never this node
// and never below quorum.
func (p *membershipPlan) shrink() Action {
	if len(p.c.Members) <= p.want {
		return nil
	}
	voters, healthyVoters := 0, 0
	for _, m := range p.c.Members {
		if !m.IsLearner {
			voters++
			if m.Healthy {
				healthyVoters++
			}
		}
	}
	if p.o.Spec.OrdinalMembers {
		return p.shrinkOrdinal(healthyVoters, voters)
	}
	for _, victim := range removalOrder(p.c.Members, p.o.Self.ID) {
		if !keepsQuorumOf(victim, healthyVoters, voters) {
			return Report{Level: slog.LevelWarn, Msg: "not shrinking the cluster: removing a member now would lose quorum", Attrs: []any{"members", len(p.c.Members), "wanted", p.want}}
		}
		if a := (RemoveMember{MemberID: victim.ID, NodeID: p.nodeIDOf(victim), Reason: fmt.Sprintf("the spec asks for %d members", p.want)}); p.pick(a) {
			return a
		}
	}
	return nil
}

// keepsQuorumOf says whether removing victim from voters members, of which
// healthyVoters are healthy, leaves a quorum of healthy voters.
func keepsQuorumOf(victim Member, healthyVoters, voters int) bool {
	if !victim.IsLearner {
		voters--
		if victim.Healthy {
			healthyVoters--
		}
	}
	return healthyVoters >= quorum(voters)
}

// shrinkOrdinal removes the member of the highest ordinal at or above the
// wanted count, whatever its health, so that the StatefulSet can then
// drop exactly that pod. Leadership is moved off it first: the leader's
// agent never removes its own member.
func (p *membershipPlan) shrinkOrdinal(healthyVoters, voters int) Action {
	var victim *Member
	best := -1
	for i, m := range p.c.Members {
		name := m.Name
		if name == "" {
			name = p.nodeIDOf(m)
		}
		if n, ok := spec.Ordinal(name); ok && n >= p.want && n > best {
			victim, best = &p.c.Members[i], n
		}
	}
	if victim == nil {
		return Report{Level: slog.LevelWarn, Msg: "not shrinking the cluster: no member has an ordinal at or above the wanted count",
			Attrs: []any{"members", len(p.c.Members), "wanted", p.want}}
	}
	if !keepsQuorumOf(*victim, healthyVoters, voters) {
		return Report{Level: slog.LevelWarn, Msg: "not shrinking the cluster: removing a member now would lose quorum", Attrs: []any{"member", victim.Name, "wanted", p.want}}
	}
	if victim.Name == p.o.Self.ID {
		for _, m := range sortedMembers(p.c.Members) {
			if n, ok := spec.Ordinal(m.Name); ok && n < p.want && m.Healthy && !m.IsLearner {
				if a := (MoveLeader{To: m.ID, Reason: "before removing the leader's own member"}); p.pick(a) {
					return a
				}
				return nil
			}
		}
		return Report{Level: slog.LevelWarn, Msg: "not shrinking the cluster: no healthy member to hand leadership to", Attrs: []any{"member", victim.Name}}
	}
	if a := (RemoveMember{MemberID: victim.ID, NodeID: p.nodeIDOf(*victim), Reason: fmt.Sprintf("the spec asks for %d members, the lowest ordinals", p.want)}); p.pick(a) {
		return a
	}
	return nil
}

// grow adds a standby once every member is healthy, or says why it
// cannot; the report does not end the plan.
func (p *membershipPlan) grow() Action {
	if len(p.c.Members) >= p.want {
		return nil
	}
	attrs := []any{"members", len(p.c.Members), "wanted", p.want}
	switch {
	case slices.ContainsFunc(p.c.Members, func(m Member) bool { return !m.Healthy || m.IsLearner }):
		p.actions = append(p.actions, Report{Level: slog.LevelInfo, Msg: "waiting for every member to be healthy before adding one", Attrs: attrs})
	case len(p.standbys) == 0 && len(p.unmarked) > 0:
		p.actions = append(p.actions, Report{Level: slog.LevelWarn, Msg: "the spec asks for more members, but the members' etcd requires the node marker on peer certificates, and no standby agent's certificate carries it (an older etcd-manager?)",
			Attrs: append(attrs, "standbys", p.unmarked)})
	case len(p.standbys) == 0 && len(p.unfit) > 0:
		p.actions = append(p.actions, Report{Level: slog.LevelWarn, Msg: "the spec asks for more members, but no standby agent has the etcd binaries to join",
			Attrs: append(attrs, "standbys", p.unfit)})
	case len(p.standbys) == 0:
		p.actions = append(p.actions, Report{Level: slog.LevelWarn, Msg: "the spec asks for more members, but no standby agent is available", Attrs: attrs})
	default:
		var cands []Action
		for _, sb := range p.standbys {
			cands = append(cands, AddMember{NodeID: sb.ID})
		}
		return p.first(cands...)
	}
	return nil
}

// ActionKey names an action for its failure count: its kind and target,
// without the reason, so that a retry is the same action.
func ActionKey(a Action) string {
	switch a := a.(type) {
	case AddMember:
		return "add-member " + a.NodeID
	case RemoveMember:
		return fmt.Sprintf("remove-member %x", a.MemberID)
	case PromoteMember:
		return fmt.Sprintf("promote-member %x", a.MemberID)
	case EvictNode:
		return "evict-node " + a.NodeID
	case SetMemberVersion:
		return "set-member-version " + a.NodeID + " " + a.Version
	case SetPeerURLs:
		return "set-peer-urls " + a.NodeID
	case MoveLeader:
		return fmt.Sprintf("move-leader %x", a.To)
	case SetQuarantine:
		return "set-quarantine " + a.Token
	case SetMemberSettings:
		return "set-member-settings " + a.NodeID
	case SetPeerCertCheck:
		return "set-peer-cert-check " + a.NodeID
	case DefragMember:
		return "defrag-member " + a.NodeID
	case RecoverSpace:
		return "recover-space"
	case DisarmNoSpace:
		return "disarm-nospace"
	case FinishDefrag:
		return "finish-defrag"
	case CheckHashes:
		return "check-hashes"
	case DiscardMemberData:
		return fmt.Sprintf("discard-member-data %x", a.MemberID)
	case DisarmCorrupt:
		return "disarm-corrupt"
	}
	return a.String()
}

// backingOff reports an action passed over while it backs off.
func backingOff(a Action, why string) Report {
	return Report{Level: slog.LevelInfo, Msg: "an action keeps failing; it is retried after a backoff, and everything else goes on",
		Attrs: []any{"action", a.String(), "last-error", why}}
}

// standbyNodes are reachable agents with no membership whose peer URLs no
// member uses, sorted by ID: those that have the etcd binaries to join
// (the version the members run, and the spec's) and a certificate every
// member's etcd takes on its peer port and, apart, the IDs of those that
// lack the binaries (unfit) or the certificate (unmarked).
func standbyNodes(o Observed) (fit []Node, unfit, unmarked []string) {
	need := []string{o.Spec.EtcdVersion}
	if m := o.Self.Member; m != nil && m.EtcdVersion != o.Spec.EtcdVersion {
		need = append(need, m.EtcdVersion)
	}
	var required []string
	for _, p := range o.Peers {
		if m := p.Member; m != nil && m.ClusterToken == o.Cluster.Token && m.PeerCertHostname != "" && !slices.Contains(required, m.PeerCertHostname) {
			required = append(required, m.PeerCertHostname)
		}
	}
	for _, p := range o.Peers {
		if p.Member != nil || !ordinalFits(o.Spec, p.ID) || o.Revoked[p.ID] {
			continue
		}
		taken := false
		for _, m := range o.Cluster.Members {
			taken = taken || SameURLs(m.PeerURLs, p.PeerURLs)
		}
		if taken {
			continue
		}
		if slices.ContainsFunc(need, func(v string) bool { return !slices.Contains(p.Installed, v) }) {
			unfit = append(unfit, p.ID)
			continue
		}
		if slices.ContainsFunc(required, func(name string) bool { return p.CertMarker != name }) {
			unmarked = append(unmarked, p.ID)
			continue
		}
		fit = append(fit, p)
	}
	sort.Slice(fit, func(i, j int) bool { return fit[i].ID < fit[j].ID })
	sort.Strings(unfit)
	sort.Strings(unmarked)
	return fit, unfit, unmarked
}

// ordinalFits says whether node id may be a member: always, unless the
// spec's members are a StatefulSet's ordinals, which must be below the
// member count.
func ordinalFits(s *spec.ClusterSpec, id string) bool {
	if s == nil || !s.OrdinalMembers {
		return true
	}
	n, ok := spec.Ordinal(id)
	return ok && n < int(s.MemberCount)
}

// removalOrder is the order in which members are removed to shrink the
// cluster: unhealthy first, then learners, then the highest name; never
// the member named self.
func removalOrder(members []Member, self string) []Member {
	cands := slices.DeleteFunc(sortedMembers(members), func(m Member) bool { return m.Name == self })
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.Healthy != b.Healthy {
			return !a.Healthy
		}
		if a.IsLearner != b.IsLearner {
			return a.IsLearner
		}
		return a.Name > b.Name
	})
	return cands
}

func sortedMembers(members []Member) []Member {
	out := slices.Clone(members)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func quorum(voters int) int { return voters/2 + 1 }

// keepsQuorum reports whether removing member victim leaves a quorum of
// healthy voters.
func keepsQuorum(members []Member, victim Member) bool {
	voters, healthy := 0, 0
	for _, m := range members {
		if m.IsLearner || m.ID == victim.ID {
			continue
		}
		voters++
		if m.Healthy {
			healthy++
		}
	}
	return healthy >= quorum(voters)
}

func SameURLs(a, b []string) bool {
	if len(a) == 0 || len(a) != len(b) {
		return false
	}
	x, y := slices.Clone(a), slices.Clone(b)
	for i := range x {
		x[i] = strings.TrimSuffix(strings.ToLower(x[i]), "/")
		y[i] = strings.TrimSuffix(strings.ToLower(y[i]), "/")
	}
	sort.Strings(x)
	sort.Strings(y)
	return slices.Equal(x, y)
}

// Activity names the long-running work that actions belong to, for the
// procedure metric: a roll of the members (version, settings, peer TLS,
// CA) or a defragmentation (by the rules, or to recover from NOSPACE).
// It is empty when the actions hold none of these; a move of the leader
// alone says nothing, as every roll and defragmentation makes one.
func Activity(actions []Action) (procedure, phase string) {
	for _, a := range actions {
		switch a.(type) {
		case SetMemberVersion, EnableDowngrade:
			return "roll", "version"
		case SetMemberSettings:
			return "roll", "settings"
		case SetPeerCertCheck, SetPeerURLs:
			return "roll", "peer-tls"
		case SyncCA, AdvanceCARotation:
			return "roll", "ca"
		case DefragMember:
			return "defrag", "defragment"
		case RecoverSpace, DisarmNoSpace:
			return "defrag", "nospace"
		}
	}
	return "", ""
}
