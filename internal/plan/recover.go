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
type RecoverMember struct{ ID, NodeID, Token string }

// FinishRecover removes the completed recover-quorum command.
type FinishRecover struct{ ID string }

func (a RecoverMember) String() string {
	return fmt.Sprintf("recover-member %s node=%s token=%s", a.ID, a.NodeID, a.Token)
}
func (RecoverMember) Mutates() bool    { return true }
func (a FinishRecover) String() string { return "finish-recover " + a.ID }
func (FinishRecover) Mutates() bool    { return true }

// planRecoverQuorum is the lock holder's next step of recover-quorum c.
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
	survivors, why := survivorsOf(o)
	switch {
	case why != "":
		return []Action{FailCommand{ID: c.ID, Reason: why}}
	case len(survivors) == 0:
		return planNoSurvivor(o, c)
	}
	s := survivors[0]
	healthy := 0
	for _, n := range survivors {
		if n.Healthy {
			healthy++
		}
	}
	// Quorum of the cluster as its members list it, else as the spec says.
	voters := int(o.Spec.MemberCount)
	if n := len(voterNames(s.LocalMembers)); n > 0 {
		voters = n
	}
	if healthy >= voters/2+1 {
		return refuse(fmt.Sprintf(
			"quorum is not lost: %d members with data are up, a quorum of the cluster's %d; they may still be electing a leader", healthy, voters))
	}
	if why := noQuorumEvidence(o, c, s); len(why) > 0 {
		return why
	}
	if why := behindBackup(o, c, s); len(why) > 0 {
		return why
	}
	return []Action{RecoverMember{ID: c.ID, NodeID: s.ID, Token: s.Member.ClusterToken}}
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
	n, err := FindNode(o.Peers, id)
	switch {
	case err != nil:
		return []Action{Report{Level: slog.LevelWarn, Msg: "recover-quorum waits for the survivor's agent to be reachable",
			Attrs: []any{"command", c.ID, "node", id}}}
	case n.Member == nil:
		return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("the survivor %s no longer holds any etcd membership", id)}}
	case c.Status.NodeToken != "" && n.Member.ClusterToken != c.Status.NodeToken:
		return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("the survivor %s now runs cluster %s, not %s, which it was chosen from", id, n.Member.ClusterToken, c.Status.NodeToken)}}
	case n.Healthy && n.RaftLeader != 0 && !n.Member.ForceNewCluster:
		return []Action{FinishRecover{ID: c.ID}}
	case !n.HasData:
		return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf(
			"the survivor %s no longer holds the cluster's data (its start-up check may have found it damaged and moved it to its trash): queue recover-quorum again to choose another survivor, or use restore-backup", id)}}
	}
	// Not forced yet, or not leading yet: the evidence must still hold
	// (once forced, the survivor lists only itself).
	if why := noQuorumEvidence(o, c, n); len(why) > 0 {
		return why
	}
	if !n.Member.ForceNewCluster && n.RaftLeader == 0 {
		if why := behindBackup(o, c, n); len(why) > 0 {
			return why
		}
	}
	return []Action{RecoverMember{ID: c.ID, NodeID: id, Token: n.Member.ClusterToken}}
}

// survivorsOf returns the reachable nodes that hold data of one cluster,
// the one most of them hold, that of the longest raft log first; or why
// there is no telling which cluster to recover.
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
	sort.Slice(survivors, func(i, j int) bool {
		if survivors[i].RaftIndex != survivors[j].RaftIndex {
			return survivors[i].RaftIndex > survivors[j].RaftIndex
		}
		return survivors[i].ID < survivors[j].ID
	})
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
// from survivor s while there is no positive evidence that the other
// members have no quorum; nothing when there is. Not reaching a member is
// no evidence: an agent cut off from its peers, but not from the store,
// must never fork a cluster that still serves. And a member that sees no
// leader only for a moment may be in an election. So the survivor must
// have seen no leader for o.NoLeaderSettle, and each other member (as the
// survivor's etcd lists them) must be reachable and either outside the
// cluster (a wiped node back on the member's peer URLs) or without a
// leader for as long; or have a fresh record in the store showing that;
// or be named lost by the operator and silent (no fresh record).
func noQuorumEvidence(o Observed, c Command, s Node) []Action {
	if len(s.LocalMembers) == 0 {
		return []Action{Report{Level: slog.LevelInfo, Msg: "recover-quorum waits for the survivor's etcd to report its members",
			Attrs: []any{"command", c.ID, "node", s.ID}}}
	}
	if s.NoLeaderFor < o.NoLeaderSettle && len(s.LocalMembers) > 1 {
		return []Action{Report{Level: slog.LevelInfo, Msg: "recover-quorum waits: the survivor must see no leader for a while, or it may be an election",
			Attrs: []any{"command", c.ID, "node", s.ID, "no-leader-for", s.NoLeaderFor.Round(time.Millisecond), "needed", o.NoLeaderSettle}}}
	}
	var lost []string
	if rq := c.Command.RecoverQuorum; rq != nil {
		lost = rq.Lost
	}
	var names []string
	for _, m := range s.LocalMembers {
		names = append(names, m.Name)
	}
	for _, name := range lost {
		if !slices.Contains(names, name) {
			return []Action{FailCommand{ID: c.ID, Reason: fmt.Sprintf("--lost names %s, which is not a member of the cluster (its members: %s)",
				name, strings.Join(names, ", "))}}
		}
	}
	token := s.Member.ClusterToken
	var silent, inQuorum, settling []string
	for _, m := range s.LocalMembers {
		name := m.Name
		if name == s.ID {
			continue
		}
		// Its agent, by name or, if its node came back wiped under a new
		// ID, on the member's own peer URLs.
		n, err := FindNode(o.Peers, name)
		if err != nil {
			for _, p := range o.Peers {
				if SameURLs(p.PeerURLs, m.PeerURLs) {
					n, err = p, nil
				}
			}
		}
		ours := func(t string, healthy bool) bool { return t == token && healthy }
		if err == nil {
			switch {
			case n.Member == nil || !ours(n.Member.ClusterToken, n.Healthy):
				// Reachable and outside the cluster, or its etcd down:
				// evidence.
			case n.RaftLeader != 0:
				inQuorum = append(inQuorum, name) // caught earlier; kept for safety
			case n.NoLeaderFor < o.NoLeaderSettle:
				settling = append(settling, name)
			}
			continue
		}
		r, ok := findRecord(o.Records, name)
		switch {
		case ok && r.Age <= o.RecordFresh && ours(r.ClusterToken, r.Healthy) && r.RaftLeader != 0:
			inQuorum = append(inQuorum, fmt.Sprintf("%s (reported leader %x %s ago)", name, r.RaftLeader, r.Age.Round(time.Second)))
		case ok && r.Age <= o.RecordFresh && ours(r.ClusterToken, r.Healthy) && r.NoLeaderFor < o.NoLeaderSettle:
			settling = append(settling, name)
		case ok && r.Age <= o.RecordFresh:
			// It reports no leader for long, or no membership: evidence.
		case slices.Contains(lost, name):
			// Named lost, and silent: evidence.
		default:
			silent = append(silent, name)
		}
	}
	switch {
	case len(inQuorum) > 0:
		return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits: agents this one cannot reach report a raft leader; this agent may be cut off from a cluster that still has quorum, which must not be forked",
			Attrs: []any{"command", c.ID, "members", inQuorum}},
			fmt.Sprintf("waiting: members %s report a raft leader but cannot be reached; the survivor %s may be cut off from a cluster that still has quorum", strings.Join(inQuorum, ", "), s.ID))
	case len(settling) > 0:
		return []Action{Report{Level: slog.LevelInfo, Msg: "recover-quorum waits: members lost their leader only moments ago, which may be an election",
			Attrs: []any{"command", c.ID, "members", settling}}}
	case len(silent) > 0:
		return waitNoted(c, Report{Level: slog.LevelWarn, Msg: "recover-quorum waits for evidence that the other members have no quorum: their agents are silent; if their nodes are gone for good, delete this command and queue recover-quorum --lost with their names",
			Attrs: []any{"command", c.ID, "silent", silent}},
			fmt.Sprintf("waiting for evidence that the other members have no quorum: the agents of %s are silent; if those nodes are gone for good, delete this command and run recover-quorum --lost=%s",
				strings.Join(silent, ", "), strings.Join(silent, ",")))
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
