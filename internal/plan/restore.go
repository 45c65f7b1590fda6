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

// A restore replaces the cluster with one made from a backup. The agent
// that holds the store lock drives it, whether or not an etcd is up, and
// records each phase in the command's status before it acts on it, so a
// new lock holder resumes where the last one stopped:
//
//	validate (no status yet): fetch and verify the backup, pick the members
//	stopping:   every node stops its old etcd, moving the data to its trash
//	restoring:  each chosen node restores the backup and starts, quarantined
//	verifying:  all members are up and HashKV agrees
//	lifting:    the quarantine is lifted, all members at once: clients
//	            are back
//	backing-up: a fresh backup of the restored cluster, taken while
//	            clients write; once it is recorded, the command is
//	            removed
//
// Nothing of the old cluster is touched until the backup has been fetched
// and verified: a bad backup fails the command and leaves the cluster as it
// was.

// PrepareRestore validates the backup and records the restore's plan.
type PrepareRestore struct {
	ID, Backup string
	Members    []string
	// On is what Plan attached (see Targets).
	On Targets
}

// StopForRestore tells nodes to stop their old etcd and trash its data,
// all at once.
type StopForRestore struct {
	ID string
	// Tokens maps each node to stop to the cluster token it runs.
	Tokens map[string]string
	// On is what Plan attached (see Targets).
	On Targets
}

// SetRestorePhase moves a restore to its next phase.
type SetRestorePhase struct {
	ID, Phase string
	// On is what Plan attached (see Targets).
	On Targets
}

// RestoreNodes tells the chosen nodes to restore the backup and start.
type RestoreNodes struct {
	ID      string
	NodeIDs []string
	// On is what Plan attached (see Targets).
	On Targets
}

// VerifyRestore checks the restored cluster: all members, equal HashKV.
type VerifyRestore struct {
	ID string
	// On is what Plan attached (see Targets).
	On Targets
}

// BackupRestored takes the fresh backup of the restored cluster and
// records its name in the restore's progress.
type BackupRestored struct {
	ID string
	// On is what Plan attached (see Targets).
	On Targets
}

// SetQuarantine restarts the members of the cluster Token on the nodes,
// all at once, serving clients on their quarantine URLs only (On) or on
// their client URLs again. Nobody can reach a quarantined cluster, so a
// moment without quorum costs nothing. ID is the command it serves, if
// any.
type SetQuarantine struct {
	ID      string
	Token   string
	NodeIDs []string
	// Quarantine is true to quarantine the members, false to lift it.
	Quarantine bool
	// On is what Plan attached (see Targets).
	On Targets
}

// PrepareDumpRestore records a dump-restore's plan: the old cluster's
// token, and the new cluster's token and members.
type PrepareDumpRestore struct {
	ID       string
	OldToken string
	Members  []string
	// On is what Plan attached (see Targets).
	On Targets
}

// DumpBackup takes the backup of the quarantined cluster that a
// dump-restore restores.
type DumpBackup struct {
	ID string
	// On is what Plan attached (see Targets).
	On Targets
}

// FinishRestore removes the completed restore command.
type FinishRestore struct {
	ID string
	// On is what Plan attached (see Targets).
	On Targets
}

func (a PrepareRestore) String() string {
	return fmt.Sprintf("prepare-restore %s backup=%s members=%v", a.ID, a.Backup, a.Members)
}
func (PrepareRestore) Mutates() bool { return true }

// NodeIDs are the nodes told to stop, in order.
func (a StopForRestore) NodeIDs() []string {
	ids := make([]string, 0, len(a.Tokens))
	for id := range a.Tokens {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (a StopForRestore) String() string {
	return fmt.Sprintf("stop-for-restore %s nodes=%v", a.ID, a.NodeIDs())
}
func (StopForRestore) Mutates() bool     { return true }
func (a SetRestorePhase) String() string { return "set-restore-phase " + a.ID + " " + a.Phase }
func (SetRestorePhase) Mutates() bool    { return true }
func (a RestoreNodes) String() string {
	return fmt.Sprintf("restore-nodes %s %v", a.ID, a.NodeIDs)
}
func (RestoreNodes) Mutates() bool      { return true }
func (a VerifyRestore) String() string  { return "verify-restore " + a.ID }
func (VerifyRestore) Mutates() bool     { return true }
func (a BackupRestored) String() string { return "backup-restored " + a.ID }
func (BackupRestored) Mutates() bool    { return true }
func (a SetQuarantine) String() string {
	verb := "lift-quarantine"
	if a.Quarantine {
		verb = "quarantine"
	}
	if a.ID != "" {
		verb += " " + a.ID
	}
	return fmt.Sprintf("%s nodes=%v", verb, a.NodeIDs)
}
func (SetQuarantine) Mutates() bool { return true }
func (a PrepareDumpRestore) String() string {
	return fmt.Sprintf("prepare-dump-restore %s old=%s members=%v", a.ID, a.OldToken, a.Members)
}
func (PrepareDumpRestore) Mutates() bool { return true }
func (a DumpBackup) String() string      { return "dump-backup " + a.ID }
func (DumpBackup) Mutates() bool         { return true }
func (a FinishRestore) String() string   { return "finish-restore " + a.ID }
func (FinishRestore) Mutates() bool      { return true }

// ActiveExclusive returns the oldest restore, dump-restore or
// recover-quorum command that is neither done nor failed, nor expired
// before it started. Such a command replaces the cluster, so the store
// lock's holder runs it alone.
func ActiveExclusive(cmds []Command) *Command {
	for i, c := range cmds {
		k := c.Command
		if c.Err == nil && c.Newer == nil && (k.RestoreBackup != nil || k.RecoverQuorum != nil || k.DumpRestore != nil) && !c.Status.Finished() && !c.lapsed() {
			return &cmds[i]
		}
	}
	return nil
}

// planRestore is the lock holder's next step of the restore c.
func planRestore(o Observed, c Command) []Action {
	peers := append([]Node(nil), o.Peers...)
	sort.Slice(peers, func(i, j int) bool { return peers[i].ID < peers[j].ID })
	p := c.Status.Restore
	dump := c.Command.DumpRestore
	switch {
	case p == nil && dump != nil:
		return planPrepareDump(o, c, peers)
	case p == nil:
		return planPrepareRestore(o, c, peers)
	case dump != nil && (p.Phase == spec.RestoreQuarantining || p.Phase == spec.RestoreDumping) && o.Spec.EtcdVersion != dump.EtcdVersion:
		// The old cluster is whole: the change can still be called off.
		return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("called off before the old cluster was stopped: the spec now asks for etcd %s; the quarantine is lifted", o.Spec.EtcdVersion)}}
	}
	if why := damagedProgress(p, dump != nil); why != "" {
		return []Action{FailCommand{ID: c.ID, Reason: "the restore's recorded progress is damaged (" + why +
			"); the old cluster may already be stopped: see etcd-manager-ctl status, then queue the restore again"}}
	}
	switch p.Phase {
	case spec.RestoreQuarantining:
		return planQuarantining(c, p, peers)
	case spec.RestoreDumping:
		return []Action{DumpBackup{ID: c.ID}}
	case spec.RestoreStopping:
		stop := map[string]string{}
		for _, n := range peers {
			if n.Member != nil && n.Member.ClusterToken != p.Token {
				stop[n.ID] = n.Member.ClusterToken
			}
		}
		if len(stop) > 0 {
			return []Action{StopForRestore{ID: c.ID, Tokens: stop}}
		}
		// A member of the old cluster this agent cannot reach, but whose
		// fresh record says it serves with a leader, would go on serving
		// beside the restored cluster.
		if serving := servingElsewhere(o, p.Token); len(serving) > 0 {
			return []Action{Report{Level: slog.LevelWarn, Msg: "restore waits: members of the old cluster cannot be reached, but report that they still serve; stop them, or let this agent reach them",
				Attrs: []any{"command", c.ID, "members", serving}}}
		}
		return []Action{SetRestorePhase{ID: c.ID, Phase: spec.RestoreRestoring}}
	case spec.RestoreRestoring:
		if acts := planChosenPresent(o, c, p, peers); len(acts) > 0 {
			return acts
		}
		return planRestoring(c, p, peers)
	case spec.RestoreVerifying:
		if acts := planChosenPresent(o, c, p, peers); len(acts) > 0 {
			return acts
		}
		return []Action{VerifyRestore{ID: c.ID}}
	case spec.RestoreLifting:
		acts, ready := planLifting(c, p, peers)
		if !ready {
			return acts
		}
		return append(acts, SetRestorePhase{ID: c.ID, Phase: spec.RestoreBackingUp})
	case spec.RestoreBackingUp:
		// A restore recorded by an older etcd-manager, which backed up
		// before it lifted, still has its quarantine to lift.
		acts, ready := planLifting(c, p, peers)
		if !ready {
			return acts
		}
		if p.Fresh != "" {
			return append(acts, FinishRestore{ID: c.ID})
		}
		return append(acts, BackupRestored{ID: c.ID})
	}
	return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("restore is in an unknown phase %q (known: %s)", p.Phase,
		strings.Join([]string{spec.RestoreQuarantining, spec.RestoreDumping, spec.RestoreStopping, spec.RestoreRestoring, spec.RestoreVerifying, spec.RestoreLifting, spec.RestoreBackingUp}, ", "))}}
}

// planPrepareRestore picks the members of the restored cluster: the
// spec's member count of agents, by node ID.
func planPrepareRestore(o Observed, c Command, peers []Node) []Action {
	want := int(o.Spec.MemberCount)
	if len(peers) < want {
		return []Action{Report{Level: slog.LevelWarn, Msg: "restore waits for enough agents",
			Attrs: []any{"command", c.ID, "have", len(peers), "want", want}}}
	}
	ids := make([]string, 0, want)
	for _, n := range peers[:want] {
		ids = append(ids, n.ID)
	}
	return []Action{PrepareRestore{ID: c.ID, Backup: c.Command.RestoreBackup.Backup, Members: ids}}
}

// planQuarantining quarantines every member of the cluster a dump-restore
// replaces, and moves on to the dump once all are, and none is unseen.
func planQuarantining(c Command, p *spec.RestoreProgress, peers []Node) []Action {
	var todo, starting []string
	for _, n := range peers {
		switch {
		case n.Member == nil || n.Member.ClusterToken != p.OldToken:
		case !n.Member.Quarantined:
			todo = append(todo, n.ID)
		case !n.Healthy:
			starting = append(starting, n.ID)
		}
	}
	if len(todo) > 0 {
		return []Action{SetQuarantine{ID: c.ID, Token: p.OldToken, NodeIDs: todo, Quarantine: true}}
	}
	if len(starting) > 0 {
		return []Action{Report{Level: slog.LevelInfo, Msg: "dump-restore waits for the quarantined members to start",
			Attrs: []any{"command", c.ID, "nodes", starting}}}
	}
	// A member whose agent cannot be reached may still serve clients: a
	// write it acknowledges after the dump would be lost.
	if unseen := unquarantined(peers, p.OldToken); len(unseen) > 0 {
		return []Action{Report{Level: slog.LevelWarn, Msg: "dump-restore waits: a member of the cluster is not known to be quarantined, and may still serve clients",
			Attrs: []any{"command", c.ID, "members", unseen}}}
	}
	return []Action{SetRestorePhase{ID: c.ID, Phase: spec.RestoreDumping}}
}

// ChosenGonePatience is how long, beyond a record's freshness, the agent
// of a chosen member may stay silent before the lift: after that it is
// gone for good, and the restore fails instead of waiting forever.
const ChosenGonePatience = 2 * time.Minute

// planChosenPresent fails a restore, before its lift, whose chosen member
// is gone for good or has lost its restored data, and waits for one whose
// agent is out of reach for now. The cluster stays quarantined: its
// restored members hold data no client has seen yet.
func planChosenPresent(o Observed, c Command, p *spec.RestoreProgress, peers []Node) []Action {
	for _, id := range p.Members {
		n, err := findNode(peers, id)
		if err == nil {
			if n.DataLost && n.Member != nil && n.Member.ClusterToken == p.Token {
				// Restoring it again would bring back a member ID whose
				// log its peers have seen, with an empty one.
				return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("chosen member %s lost its restored data before the quarantine was lifted; "+
					"it may not be restored again under the same member ID. %s", id, quarantinedHint)}}
			}
			continue
		}
		if silent, gone := chosenSilence(o, c, id); gone {
			return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("the agent of chosen member %s has been silent for %s, before the quarantine was lifted. %s",
				id, silent.Round(time.Second), quarantinedHint)}}
		}
		return []Action{Report{Level: slog.LevelWarn, Msg: "restore waits for a chosen member's agent to be reachable",
			Attrs: []any{"command", c.ID, "node", id, "fails-after", (o.RecordFresh + ChosenGonePatience).String()}}}
	}
	return nil
}

// quarantinedHint says what a restore that failed before its lift leaves
// behind, and how to go on.
const quarantinedHint = "The restored cluster stays quarantined, serving no client: queue the restore again " +
	"(its agents must be reachable), or delete this command to lift the quarantine on the members restored so far"

// chosenSilence is how long the agent id has been silent, by its record
// in the store or, without one, by the restore's last recorded step, and
// whether that proves it gone. A store that did not answer for every
// record proves nothing.
func chosenSilence(o Observed, c Command, id string) (time.Duration, bool) {
	limit := o.RecordFresh + ChosenGonePatience
	for _, r := range o.Records {
		if r.NodeID == id {
			return r.Age, o.RecordFresh > 0 && r.Age > limit
		}
	}
	if o.RecordsErr != nil || o.RecordFresh == 0 {
		return c.Age, false
	}
	return c.Age, c.Age > limit
}

// planRestoring has the chosen nodes restore the backup, and moves on once
// every one of them runs it. planChosenPresent has made sure each is
// reachable and has lost no restored data.
func planRestoring(c Command, p *spec.RestoreProgress, peers []Node) []Action {
	var todo, starting []string
	for _, id := range p.Members {
		n, err := findNode(peers, id)
		switch {
		case err != nil:
			return []Action{Report{Level: slog.LevelWarn, Msg: "restore waits for a chosen member's agent to be reachable",
				Attrs: []any{"command", c.ID, "node", id}}}
		case n.Member == nil || n.Member.ClusterToken != p.Token || !n.HasData:
			todo = append(todo, id)
		case !n.Healthy:
			starting = append(starting, id)
		}
	}
	if len(todo) > 0 {
		return []Action{RestoreNodes{ID: c.ID, NodeIDs: todo}}
	}
	if len(starting) > 0 {
		return []Action{Report{Level: slog.LevelInfo, Msg: "restore waits for the restored members to start",
			Attrs: []any{"command", c.ID, "nodes", starting}}}
	}
	return []Action{SetRestorePhase{ID: c.ID, Phase: spec.RestoreVerifying}}
}

// planLifting lifts the restored cluster's quarantine where it is still
// on. It reports the restore ready to go on to its backup once the
// quarantine is lifted on every chosen member it can reach. Clients may
// be back by then, so the restore never waits for a chosen member that
// cannot be reached or lost its data: with a quorum of chosen members
// serving, it finishes, and membership repair then replaces the rest like
// any failed member.
func planLifting(c Command, p *spec.RestoreProgress, peers []Node) ([]Action, bool) {
	var lift, missing []string
	serving := 0
	for _, id := range p.Members {
		n, err := findNode(peers, id)
		switch {
		case err != nil || n.DataLost || n.Member == nil || n.Member.ClusterToken != p.Token:
			missing = append(missing, id)
		case n.Member.Quarantined:
			lift = append(lift, id)
		case n.Healthy:
			serving++
		}
	}
	if len(lift) > 0 {
		return []Action{SetQuarantine{ID: c.ID, Token: p.Token, NodeIDs: lift}}, false
	}
	if len(missing) == 0 {
		return nil, true
	}
	if quorum := len(p.Members)/2 + 1; serving < quorum {
		return []Action{Report{Level: slog.LevelWarn, Msg: "restore waits: chosen members are missing, and too few of the others serve for a quorum",
			Attrs: []any{"command", c.ID, "missing", missing, "serving", serving, "quorum", quorum}}}, false
	}
	return []Action{Report{Level: slog.LevelWarn, Msg: "restore goes on without the chosen members that are missing; membership repair replaces them once it is complete",
		Attrs: []any{"command", c.ID, "missing", missing}}}, true
}

// planPrepareDump picks the members of the cluster a dump-restore makes:
// the nodes of the running cluster first, so that the same nodes serve.
func planPrepareDump(o Observed, c Command, peers []Node) []Action {
	want := int(o.Spec.MemberCount)
	old := ""
	if o.Cluster != nil {
		old = o.Cluster.Token
	} else {
		// The lock holder need not be beside etcd's leader: the token most
		// nodes with data hold.
		count := map[string]int{}
		for _, n := range peers {
			if n.Member != nil && n.HasData {
				count[n.Member.ClusterToken]++
				if count[n.Member.ClusterToken] > count[old] {
					old = n.Member.ClusterToken
				}
			}
		}
	}
	healthy := false
	for _, n := range peers {
		healthy = healthy || (n.Member != nil && n.Member.ClusterToken == old && n.Healthy)
	}
	if old == "" || !healthy {
		return []Action{Report{Level: slog.LevelWarn, Msg: "dump-restore waits for a healthy member of the running cluster to back up",
			Attrs: []any{"command", c.ID}}}
	}
	if len(peers) < want {
		return []Action{Report{Level: slog.LevelWarn, Msg: "dump-restore waits for enough agents",
			Attrs: []any{"command", c.ID, "have", len(peers), "want", want}}}
	}
	ordered := slices.Clone(peers)
	sort.SliceStable(ordered, func(i, j int) bool {
		return isMemberOf(ordered[i], old) && !isMemberOf(ordered[j], old)
	})
	ids := make([]string, 0, want)
	for _, n := range ordered[:want] {
		ids = append(ids, n.ID)
	}
	sort.Strings(ids)
	return []Action{PrepareDumpRestore{ID: c.ID, OldToken: old, Members: ids}}
}

func isMemberOf(n Node, token string) bool { return n.Member != nil && n.Member.ClusterToken == token }

// planStrayQuarantine lifts a quarantine that no command explains, such as
// one left by a dump-restore that was called off or deleted: a quarantined
// cluster serves no client. A restore that failed before its lift
// explains its quarantine for as long as its command is kept: the
// restored data has not been verified, and no client has seen it.
func planStrayQuarantine(o Observed) []Action {
	if c := failedBeforeLift(o); c != nil {
		return []Action{Report{Level: slog.LevelWarn, Msg: "the cluster stays quarantined: a restore failed before its quarantine was lifted; queue the restore again, or delete the failed command to lift the quarantine",
			Attrs: []any{"command", c.ID, "reason", c.Status.Message}}}
	}
	var lift []string
	for _, n := range o.Peers {
		if n.Member != nil && n.Member.ClusterToken == o.Cluster.Token && n.Member.Quarantined {
			lift = append(lift, n.ID)
		}
	}
	if len(lift) == 0 {
		return nil
	}
	sort.Strings(lift)
	return []Action{SetQuarantine{Token: o.Cluster.Token, NodeIDs: lift}}
}

// failedBeforeLift returns the failed restore or dump-restore whose
// restored cluster is o.Cluster, if it failed before its quarantine was
// lifted; nil for none.
func failedBeforeLift(o Observed) *Command {
	for i, c := range o.Commands {
		p := c.Status.Restore
		if c.Status.State != spec.CommandFailed || p == nil || p.Token != o.Cluster.Token ||
			(p.Phase != spec.RestoreRestoring && p.Phase != spec.RestoreVerifying) {
			continue
		}
		if c.Command.RestoreBackup != nil || c.Command.DumpRestore != nil {
			return &o.Commands[i]
		}
	}
	return nil
}

// damagedProgress says what is wrong with a restore's recorded progress,
// or "" when nothing is: it comes from the store, and the planner trusts
// nothing it reads there.
func damagedProgress(p *spec.RestoreProgress, dump bool) string {
	switch {
	case p.Token == "":
		return "no cluster token"
	case len(p.Members) == 0:
		return "no members"
	case dump && p.OldToken == "":
		return "no old cluster token"
	case dump && p.Backup == "" && p.Phase == spec.RestoreRestoring:
		return "no dump backup recorded to restore"
	}
	if _, err := spec.ParseSupportedVersion(p.EtcdVersion); err != nil {
		return err.Error()
	}
	seen := map[string]bool{}
	for _, m := range p.Members {
		if m == "" || seen[m] {
			return fmt.Sprintf("member list %q is invalid", p.Members)
		}
		seen[m] = true
	}
	return ""
}

// unquarantined lists the members of the cluster token, as its members'
// own copies of the membership list them, whose agents are not reached
// or not yet quarantined.
func unquarantined(peers []Node, token string) []string {
	members := map[string][]string{}
	for _, n := range peers {
		if n.Member != nil && n.Member.ClusterToken == token {
			for _, m := range n.LocalMembers {
				members[m.Name] = m.PeerURLs
			}
		}
	}
	var out []string
	for name, urls := range members {
		found := false
		for _, n := range peers {
			if n.ID == name || SameURLs(n.PeerURLs, urls) {
				found = n.Member != nil && n.Member.ClusterToken == token && n.Member.Quarantined && n.Healthy
				break
			}
		}
		if !found {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// servingElsewhere lists the agents not reached whose fresh records show
// a member of another cluster than token serving with a raft leader.
func servingElsewhere(o Observed, token string) []string {
	var out []string
	for _, r := range o.Records {
		if r.Age > o.RecordFresh || r.ClusterToken == "" || r.ClusterToken == token || !r.Healthy || r.RaftLeader == 0 {
			continue
		}
		if _, err := findNode(o.Peers, r.NodeID); err != nil {
			out = append(out, r.NodeID)
		}
	}
	sort.Strings(out)
	return out
}
