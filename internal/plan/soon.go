package plan

// LookAgainSoon reports whether the loop should look again within moments
// rather than a whole interval: a learner waits for its promotion, or an
// election is under way (see leaderInDoubt).
func LookAgainSoon(obs Observed) bool { return learnerWaiting(obs) || leaderInDoubt(obs) }

// leaderInDoubt reports whether this node's etcd, a member, sees no raft
// leader, or one whose agent cannot be reached: an election is under way,
// or about to be, and whichever agent ends up beside the new leader has
// work to do.
func leaderInDoubt(obs Observed) bool {
	self := obs.Self
	if self.Member == nil || !self.HasData || self.MemberID == 0 {
		return false
	}
	if self.RaftLeader == 0 {
		return true
	}
	if self.RaftLeader == self.MemberID {
		return false
	}
	for _, n := range obs.Peers {
		if n.MemberID == self.RaftLeader {
			return !n.Healthy
		}
	}
	return true
}

// learnerWaiting reports whether this agent leads a cluster with a
// learner: it starts, catches up and is promoted within moments.
func learnerWaiting(obs Observed) bool {
	if obs.Cluster == nil {
		return false
	}
	for _, m := range obs.Cluster.Members {
		if m.IsLearner {
			return true
		}
	}
	return false
}

// ActiveProcedure names the exclusive procedure this agent runs, with its
// restore phase, "" for none.
func ActiveProcedure(obs Observed) string {
	c := ActiveExclusive(obs.Commands)
	if c == nil || !obs.LockHeld {
		return ""
	}
	procedure := c.Command.Kind()
	if p := c.Status.Restore; p != nil {
		procedure += " " + p.Phase
	}
	return procedure
}

// Voters counts the cluster's voting members.
func Voters(obs Observed) int {
	n := 0
	if obs.Cluster != nil {
		for _, m := range obs.Cluster.Members {
			if !m.IsLearner {
				n++
			}
		}
	}
	return n
}
