package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/cli"
)

// The leader's warnings, such as a stalled peer URL switch, are shown in
// status, in text and in JSON; without any, nothing is printed.
func TestStatusShowsTheLeadersWarnings(t *testing.T) {
	stalled := "peer URL switch stalled: member c has been unhealthy for 5m0s; until it is healthy or replaced, a, b keep the old peer URLs " +
		"http://a:2380,http://b:2380, so raft traffic to them is still plain http"
	tests := []struct {
		name     string
		warnings []string
		want     string
	}{
		{"none", nil, ""},
		{"a stalled switch", []string{stalled}, "\nwarnings from the leader:\n  " + stalled + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := cli.ClusterStatus{Leader: "a", Warnings: tt.warnings, Agents: []cli.AgentStatus{{ID: "a", Role: cli.RoleLeader, Healthy: true}}}
			var b strings.Builder
			if err := printStatus(&b, st); err != nil {
				t.Fatal(err)
			}
			if tt.want == "" && strings.Contains(b.String(), "warnings") {
				t.Errorf("printed warnings when there are none:\n%s", b.String())
			}
			if !strings.Contains(b.String(), tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, b.String())
			}
			var j strings.Builder
			if err := writeJSON(&j, st); err != nil {
				t.Fatal(err)
			}
			var back cli.ClusterStatus
			if err := json.Unmarshal([]byte(j.String()), &back); err != nil || strings.Join(back.Warnings, "|") != strings.Join(tt.warnings, "|") {
				t.Errorf("JSON %s: warnings %q, %v", j.String(), back.Warnings, err)
			}
		})
	}
}
