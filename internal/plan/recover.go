package plan

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"
)

// recover-quorum rebuilds a cluster that lost a majority of its members
// from one survivor's data, with etcd's --force-new-cluster: nothing the
// survivor holds is lost, writes after the last backup included. The
// other members come back through the usual membership steps, as new
// members, once the command is done.

// RecoverMember has the survivor restart etcd with --force-new-cluster.
type RecoverMember struct {
	ID, NodeID, Token string
	// On is what Plan attached (see Targets).
	On Targets
}

// FinishRecover removes the completed recover-quorum command.
type FinishRecover struct{ ID string }

func (a RecoverMember) String() string {
	return fmt.Sprintf("recover-member %s node=%s token=%s", a.ID, a.NodeID, a.Token)
}
func (RecoverMember) Mutates() bool    { return true }
func (a FinishRecover) String() string { return "finish-recover " + a.ID }
func (FinishRecover) Mutates() bool    { return true }

// HoldNodes has each node stop its etcd and keep it stopped under the
// driver's term (peer.FenceRequest.Hold), and read where its data stands:
// what recover-quorum does to every reachable data holder before it
// forces one. A frozen etcd that thaws finds its agent holding it down.
type HoldNodes struct {
	ID    string
	Nodes []Node
	// On is what Plan attached (see Targets).
	On Targets
}

// ReleaseHolds ends the holds of nodes no procedure needs held any more.
type ReleaseHolds struct{ Nodes []Node }

func (a HoldNodes) String() string    { return fmt.Sprintf("hold-nodes %s %s", a.ID, NodeIDs(a.Nodes)) }
func (HoldNodes) Mutates() bool       { return true }
func (a ReleaseHolds) String() string { return "release-holds " + NodeIDs(a.Nodes) }
func (ReleaseHolds) Mutates() bool    { return true }

// NodeIDs names the nodes, comma separated.
func NodeIDs(ns []Node) string {
	ids := make([]string, len(ns))
	for i, n := range ns {
		ids[i] = n.ID
	}
	return strings.Join(ids, ",")
}

// planReleaseHolds releases the nodes held down once no recover-quorum
// runs: the procedure ended (done, failed or deleted), and they go back
// to the usual membership steps.
func planReleaseHolds(o Observed) []Action {
	var held []Node
	for _, n := range o.Peers {
		if n.HeldBy != 0 {
			held = append(held, n)
		}
	}
	if len(held) == 0 {
		return nil
	}
	return []Action{ReleaseHolds{Nodes: held}}
}

// planRecoverQuorum is the lock holder's next step of recover-quorum c.
//
// Forcing a new cluster from one member's data is safe only when the
// other members cannot form a quorum again: each must be proven out (its
// data gone, no membership, another cluster's, or named --lost and
// silent), or be a reachable holder of the data, held down under the
// driver's term. A holder whose etcd is stalled or restarting counts as a
// voter: should the holders make a quorum, the command waits for them. A
// record in the store may veto a force (it shows a leader), never prove
// one. The survivor is the holder whose data goes furthest, read from its
// database once it is held.
func planRecoverQuorum(o Observed, c Command) []Action {
	if id := c.Status.Node; id != "" {
		return planRecovering(o, c, id)
	}
	// A view of quorum may be a cycle old, from just before it was lost:
	// refuse only once the command has waited out a record's freshness.
	refuse := func(reason string) []Action {
		if c.Age < o.RecordFresh {
			return []Action{Report{Level: slog.LevelInfo, Msg: "recover-quorum waits a moment: quorum looks held, which may be a view from before it was lost",
				Attrs: []any{"command", c.ID, "why", reason}}}
		}
		return []Action{FailCommand{ID: c.ID, Reason: reason}}
	}
	for _, n := range o.Peers {
		if n.Healthy && n.RaftLeader != 0 {
			return refuse(fmt.Sprintf(
				"quorum is not lost: the etcd of %s follows raft leader %x; recover-quorum is only for a cluster that has lost a majority of its members", n.ID, n.RaftLeader))
		}
	}
	holders, why := survivorsOf(o)
	switch {
	case why != "":
		return []Action{FailCommand{ID: c.ID, Reason: why}}
	case len(holders) == 0:
		return planNoSurvivor(o, c)
	}
	members := membersOf(holders)
	if len(members) == 0 {
		// No holder's etcd serves to list the members: held, each reads
		// them from its database.
		return holdAll(c, holders, "no member's etcd serves to list the members")
	}
	voters := int(o.Spec.MemberCount)
	if n := len(voterNames(members)); n > 0 {
		voters = n
	}
	healthy := 0
	for _, n := range holders {
		if n.Healthy {
			healthy++
		}
	}
	if healthy >= voters/2+1 {
		return refuse(fmt.Sprintf(
			"quorum is not lost: %d members with data are up, a quorum of the cluster's %d; they may still be electing a leader", healthy, voters))
	}
	if len(holders) >= voters/2+1 {
		var ids []string
		for _, n := range holders {
			ids = append(ids, n.ID)
		}
		return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits: a quorum of members hold the cluster's data and answer; their etcd may be stalled or restarting, and would serve again",
			Attrs: []any{"command", c.ID, "holders", ids, "voters", voters}},
			fmt.Sprintf("waiting: %s hold the cluster's data, a quorum of its %d voters; their etcd may be stalled or restarting, and quorum comes back with them. If an etcd cannot start for good, stop its agent (or move its data away) and queue recover-quorum --lost with its name",
				strings.Join(ids, ", "), voters))
	}
	if why := noQuorumEvidence(o, c, members, holders); len(why) > 0 {
		return why
	}
	var unheld []string
	for _, n := range holders {
		if n.HeldBy == 0 {
			unheld = append(unheld, n.ID)
		}
	}
	if len(unheld) > 0 {
		return holdAll(c, holders, "before one is forced")
	}
	var unknown []string
	for _, n := range holders {
		if n.DataIndex == 0 {
			unknown = append(unknown, n.ID)
		}
	}
	if len(unknown) > 0 {
		return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits to know where each held member's data stands",
			Attrs: []any{"command", c.ID, "unknown", unknown}},
			"waiting to read where the data of "+strings.Join(unknown, ", ")+" stands")
	}
	sort.SliceStable(holders, func(i, j int) bool {
		a, b := holders[i], holders[j]
		if a.DataIndex != b.DataIndex {
			return a.DataIndex > b.DataIndex
		}
		if a.Revision != b.Revision {
			return a.Revision > b.Revision
		}
		return a.ID < b.ID
	})
	s := holders[0]
	if why := behindBackup(o, c, s); len(why) > 0 {
		return why
	}
	return []Action{RecoverMember{ID: c.ID, NodeID: s.ID, Token: s.Member.ClusterToken}}
}

// holdAll holds every holder down, noting why the command waits.
func holdAll(c Command, holders []Node, why string) []Action {
	var hold []Node
	for _, n := range holders {
		if n.HeldBy == 0 {
			hold = append(hold, n)
		}
	}
	if len(hold) == 0 {
		return waitNoted(c, Report{Level: slog.LevelInfo, Msg: "recover-quorum waits for the held members to report their data",
			Attrs: []any{"command", c.ID}}, "waiting for the held members to report where their data stands")
	}
	return append(waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum holds the etcd of every member with data down",
		Attrs: []any{"command", c.ID, "nodes", NodeIDs(hold), "why", why}},
		"holding the etcd of "+NodeIDs(hold)+" down ("+why+"), to read where each member's data stands"), HoldNodes{ID: c.ID, Nodes: hold})
}

// membersOf are the members the holder whose data goes furthest lists.
func membersOf(holders []Node) []Member {
	var best *Node
	for i := range holders {
		n := &holders[i]
		if len(n.LocalMembers) == 0 {
			continue
		}
		if best == nil || max(n.DataIndex, n.RaftIndex) > max(best.DataIndex, best.RaftIndex) {
			best = n
		}
	}
	if best == nil {
		return nil
	}
	return best.LocalMembers
}

// behindBackup returns what to do instead of forcing a new cluster from
// survivor s when its data is behind the newest backup of its cluster:
// the cluster it would seed would lack writes that a backup holds (its
// data is older than the cluster's, restored from an old copy or left
// behind by a long partition). Nothing when it is not behind, or when its
// etcd does not report its revision (an agent of an older version).
func behindBackup(o Observed, c Command, s Node) []Action {
	if o.NewestBackupsErr != nil {
		return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits: the backups cannot be read to check that the survivor is not behind the newest one",
			Attrs: []any{"command", c.ID, "error", o.NewestBackupsErr}},
			"waiting: the backups cannot be read to check that the survivor's data is not behind the newest backup")
	}
	b, ok := o.NewestBackups[s.Member.ClusterToken]
	if !ok || s.Revision == 0 || s.Revision >= b.Revision {
		return nil
	}
	return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf(
		"the survivor %s holds revision %d, behind backup %s of the same cluster at revision %d: a cluster forced from it would lose writes that backup holds; use restore-backup %s (or bring back a member with newer data and queue recover-quorum again)",
		s.ID, s.Revision, b.Name, b.Revision, b.Name)}}
}

// silentHolderPatience is how long recover-quorum waits for an agent
// with etcd data that went silent (paused, restarting, cut off from its
// peers) before it gives up: about as long as a machine takes to reboot.
const silentHolderPatience = 2 * time.Minute

// planNoSurvivor is the step of recover-quorum c when no reachable node
// holds etcd data: wait while an agent whose record says it has data
// may only be paused, restarting or cut off from its peers (for as long
// as it keeps its record fresh, and silentHolderPatience after), or while
// the records cannot all be read; fail once neither holds. Failing points
// the operator at restore-backup, which loses the writes since the last
// backup: so only on evidence.
func planNoSurvivor(o Observed, c Command) []Action {
	if o.RecordsErr != nil {
		return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits: no reachable node holds etcd data, and the agents' records cannot all be read",
			Attrs: []any{"command", c.ID, "error", o.RecordsErr}},
			"waiting: no reachable node holds etcd data, and the agents' records in the store cannot all be read")
	}
	var gone []string
	for _, r := range o.Records {
		if !r.HasData || replacedAt(o.Peers, r) {
			continue
		}
		if r.Age <= o.RecordFresh+silentHolderPatience {
			return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits: an agent with etcd data cannot be reached",
				Attrs: []any{"command", c.ID, "node", r.NodeID, "record-age", r.Age.Round(time.Second)}},
				fmt.Sprintf("waiting for %s, whose agent has etcd data but cannot be reached (paused, restarting or cut off from its peers); "+
					"given up %s after its record goes silent", r.NodeID, silentHolderPatience))
		}
		gone = append(gone, fmt.Sprintf("%s, silent for %s", r.NodeID, r.Age.Round(time.Second)))
	}
	if len(gone) > 0 {
		sort.Strings(gone)
		return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf(
			"no reachable node holds etcd data; the agents that had some are gone (%s): queue recover-quorum again once one is back, or use restore-backup",
			strings.Join(gone, "; "))}}
	}
	return []Action{FailCommand{ID: c.ID, Reason: "no reachable node holds etcd data; use restore-backup instead"}}
}

// replacedAt says whether another node now answers at the address of
// record r: a node that came back wiped, under a new ID, whose old
// record's data is gone.
func replacedAt(peers []Node, r Record) bool {
	for _, n := range peers {
		if r.Address != "" && n.Address == r.Address && n.ID != r.NodeID {
			return true
		}
	}
	return false
}

// planRecovering goes on with a recovery whose survivor id was chosen.
func planRecovering(o Observed, c Command, id string) []Action {
	n, err := findNode(o.Peers, id)
	forced := err == nil && n.Healthy && n.RaftLeader != 0 && n.RaftLeader == n.MemberID
	if !forced {
		// The majority came back before the survivor was forced: the
		// decision is void. (Its driver, should it resume, finds every
		// node fenced by a newer term, and its own lease over.)
		for _, p := range o.Peers {
			if p.ID != id && p.Healthy && p.RaftLeader != 0 && (err != nil || p.RaftLeader != n.MemberID) {
				return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf(
					"quorum came back before the survivor %s was forced: the etcd of %s follows raft leader %x; nothing was forced, and the cluster goes on as it was", id, p.ID, p.RaftLeader)}}
			}
		}
	}
	switch {
	case err != nil:
		return []Action{Report{Level: slog.LevelWarn, Msg: "recover-quorum waits for the survivor's agent to be reachable",
			Attrs: []any{"command", c.ID, "node", id}}}
	case n.Member == nil:
		return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("the survivor %s no longer holds any etcd membership", id)}}
	case c.Status.NodeToken != "" && n.Member.ClusterToken != c.Status.NodeToken:
		return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("the survivor %s now runs cluster %s, not %s, which it was chosen from", id, n.Member.ClusterToken, c.Status.NodeToken)}}
	case forced && !n.Member.ForceNewCluster:
		return []Action{FinishRecover{ID: c.ID}}
	case n.Healthy && n.RaftLeader != 0 && !n.Member.ForceNewCluster && n.MemberID != 0:
		return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf(
			"quorum came back before the survivor %s was forced: its etcd follows raft leader %x; nothing was forced, and the cluster goes on as it was", id, n.RaftLeader)}}
	case !n.HasData:
		return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf(
			"the survivor %s no longer holds the cluster's data (its start-up check may have found it damaged and moved it to its trash): queue recover-quorum again to choose another survivor, or use restore-backup", id)}}
	}
	// Not forced yet, or not leading yet: the evidence must still hold
	// (once forced, the survivor lists only itself), and every other
	// holder must still be held. The survivor stays the one chosen.
	holders, why := survivorsOf(o)
	if why != "" || !slices.ContainsFunc(holders, func(h Node) bool { return h.ID == id }) {
		holders = []Node{n}
	}
	members := membersOf(holders)
	if len(members) == 0 {
		members = n.LocalMembers
	}
	if len(members) == 0 {
		return holdAll(c, holders, "no member's etcd serves to list the members")
	}
	if why := noQuorumEvidence(o, c, members, holders); len(why) > 0 {
		return why
	}
	if !n.Member.ForceNewCluster && n.RaftLeader == 0 {
		if slices.ContainsFunc(holders, func(h Node) bool { return h.HeldBy == 0 && h.ID != id }) {
			return holdAll(c, holders, "before the survivor is forced")
		}
		if why := behindBackup(o, c, n); len(why) > 0 {
			return why
		}
	}
	return []Action{RecoverMember{ID: c.ID, NodeID: id, Token: n.Member.ClusterToken}}
}

// survivorsOf returns the reachable nodes that hold data of one cluster,
// the one most of them hold, by ID; or why there is no telling which
// cluster to recover. (Which of them goes furthest is read from their
// databases, once they are held: a serving etcd's index is no measure of
// a restarting one's data.)
func survivorsOf(o Observed) ([]Node, string) {
	byToken := map[string][]Node{}
	for _, n := range o.Peers {
		if m := n.Member; m != nil && n.HasData && !m.Pending {
			byToken[m.ClusterToken] = append(byToken[m.ClusterToken], n)
		}
	}
	var best string
	tie := false
	for token, ns := range byToken {
		switch {
		case best == "" || len(ns) > len(byToken[best]):
			best, tie = token, false
		case len(ns) == len(byToken[best]):
			tie = true
		}
	}
	if tie {
		var held []string
		for token, ns := range byToken {
			for _, n := range ns {
				held = append(held, n.ID+"="+token)
			}
		}
		sort.Strings(held)
		return nil, fmt.Sprintf("the reachable nodes hold data of different clusters, as many of each (%s); there is no telling which to recover: stop the stale ones, or use restore-backup",
			strings.Join(held, ", "))
	}
	survivors := byToken[best]
	sort.Slice(survivors, func(i, j int) bool { return survivors[i].ID < survivors[j].ID })
	return survivors, ""
}

func voterNames(ms []Member) []string {
	var out []string
	for _, m := range ms {
		if !m.IsLearner {
			out = append(out, m.Name)
		}
	}
	return out
}

// noQuorumEvidence returns what to do instead of forcing a new cluster
// while some member of members (as the furthest holder's data lists them)
// is neither one of the reachable holders nor proven out; nothing when
// each is. Not reaching a member is no evidence: an agent cut off from
// its peers, but not from the store, must never fork a cluster that
// still serves. A member is proven out when its agent answers and holds
// no data of the cluster (no membership, another cluster's, or its data
// gone), or when the operator named it --lost and its agent is silent (no
// fresh record). A fresh record in the store never proves a member out:
// it may veto (it shows a leader, or a loss of one too recent to tell
// from an election), and that is all. The members that answer must also
// have seen no leader for o.NoLeaderSettle.
func noQuorumEvidence(o Observed, c Command, members []Member, holders []Node) []Action {
	var lost []string
	if rq := c.Command.RecoverQuorum; rq != nil {
		lost = rq.Lost
	}
	var names []string
	for _, m := range members {
		names = append(names, m.Name)
	}
	for _, name := range lost {
		if !slices.Contains(names, name) {
			return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("--lost names %s, which is not a member of the cluster (its members: %s)",
				name, strings.Join(names, ", "))}}
		}
	}
	token := holders[0].Member.ClusterToken
	isHolder := func(id string) bool {
		return slices.ContainsFunc(holders, func(h Node) bool { return h.ID == id })
	}
	var silent, inQuorum, settling []string
	for _, h := range holders {
		if h.HeldBy == 0 && h.Healthy && h.NoLeaderFor < o.NoLeaderSettle && len(members) > 1 {
			settling = append(settling, h.ID)
		}
	}
	for _, m := range members {
		name := m.Name
		if isHolder(name) {
			continue
		}
		// Its agent, by name or, if its node came back wiped under a new
		// ID, on the member's own peer URLs.
		n, err := findNode(o.Peers, name)
		if err != nil {
			for _, p := range o.Peers {
				if SameURLs(p.PeerURLs, m.PeerURLs) {
					n, err = p, nil
				}
			}
		}
		if err == nil {
			switch {
			case n.Member == nil || n.Member.ClusterToken != token || !n.HasData:
				// Reachable, and holds none of the cluster's data: proven
				// out.
			case isHolder(n.ID):
				// A wiped node's successor that holds data again: a holder.
			case n.RaftLeader != 0:
				inQuorum = append(inQuorum, name) // caught earlier; kept for safety
			default:
				// Holds the data but is not among the holders (another
				// cluster's data won the count): it may serve again.
				settling = append(settling, name)
			}
			continue
		}
		r, ok := findRecord(o.Records, name)
		fresh := ok && r.Age <= o.RecordFresh
		switch {
		case fresh && r.ClusterToken == token && r.Healthy && r.RaftLeader != 0:
			inQuorum = append(inQuorum, fmt.Sprintf("%s (reported leader %x %s ago)", name, r.RaftLeader, r.Age.Round(time.Second)))
		case fresh && r.ClusterToken == token && r.Healthy && r.NoLeaderFor < o.NoLeaderSettle:
			settling = append(settling, name)
		case slices.Contains(lost, name) && !fresh:
			// Named lost, and silent: proven out.
		case slices.Contains(lost, name):
			silent = append(silent, fmt.Sprintf("%s (named lost, but its agent published a record %s ago)", name, r.Age.Round(time.Second)))
		default:
			silent = append(silent, name)
		}
	}
	switch {
	case len(inQuorum) > 0:
		return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits: agents this one cannot reach report a raft leader; this agent may be cut off from a cluster that still has quorum, which must not be forked",
			Attrs: []any{"command", c.ID, "members", inQuorum}},
			fmt.Sprintf("waiting: members %s report a raft leader but cannot be reached; this agent may be cut off from a cluster that still has quorum", strings.Join(inQuorum, ", ")))
	case len(settling) > 0:
		return []Action{Report{Level: slog.LevelInfo, Msg: "recover-quorum waits: members lost their leader only moments ago, which may be an election",
			Attrs: []any{"command", c.ID, "members", settling}}}
	case len(silent) > 0:
		var names []string
		for _, s := range silent {
			name, _, _ := strings.Cut(s, " ")
			names = append(names, name)
		}
		return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits for evidence that the other members have no quorum: their agents are silent; if their nodes are gone for good, delete this command and queue recover-quorum --lost with their names",
			Attrs: []any{"command", c.ID, "silent", silent}},
			fmt.Sprintf("waiting for evidence that the other members have no quorum: the agents of %s are silent; if those nodes are gone for good, stop their agents, delete this command and run recover-quorum --lost=%s",
				strings.Join(silent, ", "), strings.Join(names, ",")))
	}
	return nil
}

func findRecord(recs []Record, id string) (Record, bool) {
	for _, r := range recs {
		if r.NodeID == id {
			return r, true
		}
	}
	return Record{}, false
}

// waitNoted reports a wait, and notes it in the command's status (once)
// for the operator's ctl to show.
func waitNoted(c Command, r Report, note string) []Action {
	if c.Status.Message == note {
		return []Action{r}
	}
	return []Action{r, NoteCommand{ID: c.ID, Message: note}}
}
