package operator

import "sort"

// RollPod is a member pod as the image roll sees it.
type RollPod struct {
	Name string
	// Current says the pod runs the StatefulSet's newest template.
	Current bool
	// Ready is the pod's readiness; Healthy its member's health.
	Ready, Healthy bool
	// Leader says its member leads raft.
	Leader bool
}

// RollStep is the next step of an image roll.
type RollStep struct {
	// Delete is the pod to delete, so the StatefulSet recreates it from
	// the new template; empty for none.
	Delete string
	// MoveLeaderFrom is set when the leader's pod is next: leadership
	// moves off it first.
	MoveLeaderFrom string
	// Waiting says why nothing happens now, empty when the roll is done.
	Waiting string
}

// PlanRoll picks the next pod to replace, one at a time: only while every
// pod is ready and every member healthy, the highest ordinal first, the
// leader last and only after leadership left it. It is pure.
func PlanRoll(pods []RollPod, members int32) RollStep {
	var outdated []RollPod
	for _, p := range pods {
		if !p.Current {
			outdated = append(outdated, p)
		}
	}
	if len(outdated) == 0 {
		return RollStep{}
	}
	healthy := int32(0)
	for _, p := range pods {
		if !p.Ready {
			return RollStep{Waiting: "pod " + p.Name + " to be ready"}
		}
		if p.Healthy {
			healthy++
		}
	}
	if healthy < members {
		return RollStep{Waiting: "every member to be healthy"}
	}
	sort.Slice(outdated, func(i, j int) bool {
		if outdated[i].Leader != outdated[j].Leader {
			return !outdated[i].Leader
		}
		return ordinalLess(outdated[j].Name, outdated[i].Name)
	})
	next := outdated[0]
	if next.Leader {
		if len(pods) == 1 {
			return RollStep{Delete: next.Name}
		}
		return RollStep{MoveLeaderFrom: next.Name}
	}
	return RollStep{Delete: next.Name}
}
