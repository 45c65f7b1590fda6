package operator

import "testing"

func TestPlanRoll(t *testing.T) {
	pod := func(name string, current, leader bool) RollPod {
		return RollPod{Name: name, Current: current, Ready: true, Healthy: true, Leader: leader}
	}
	tests := []struct {
		name    string
		pods    []RollPod
		want    RollStep
		waiting bool
	}{
		{name: "nothing to roll", pods: []RollPod{pod("e-0", true, true), pod("e-1", true, false)}},
		{name: "the highest ordinal first, as a number",
			pods: []RollPod{pod("e-0", false, true), pod("e-9", false, false), pod("e-10", false, false)},
			want: RollStep{Delete: "e-10"}},
		{name: "the leader last, leadership moved first",
			pods: []RollPod{pod("e-0", false, true), pod("e-1", true, false), pod("e-2", true, false)},
			want: RollStep{MoveLeaderFrom: "e-0"}},
		{name: "a pod not ready: wait",
			pods:    []RollPod{pod("e-0", true, true), {Name: "e-1", Current: true, Ready: false, Healthy: true}, pod("e-2", false, false)},
			waiting: true},
		{name: "a member unhealthy: wait",
			pods:    []RollPod{pod("e-0", true, true), {Name: "e-1", Current: false, Ready: true}, pod("e-2", false, false)},
			waiting: true},
		{name: "a single member is replaced as it is",
			pods: []RollPod{pod("e-0", false, true)},
			want: RollStep{Delete: "e-0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanRoll(tc.pods, int32(len(tc.pods)))
			if tc.waiting {
				if got.Waiting == "" || got.Delete != "" || got.MoveLeaderFrom != "" {
					t.Fatalf("got %+v, want a wait", got)
				}
				return
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
