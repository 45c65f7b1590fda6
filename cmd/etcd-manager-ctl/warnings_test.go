package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/peer"
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
			if tt.want != "" && !strings.Contains(b.String(), tt.want) {
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

// status shows each node's certificate and CA with their expiry, so that
// a node left on an old CA, or a certificate close to its end, stands
// out; agents without TLS show nothing.
func TestPrintCerts(t *testing.T) {
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	ca := `"etcd-manager CA" AB:CD:EF:01`
	agents := []cli.AgentStatus{
		{ID: "a", Cert: &peer.CertInfo{NotAfter: now.Add(300 * 24 * time.Hour), CA: ca, CANotAfter: now.Add(3650 * 24 * time.Hour)}},
		{ID: "b", Cert: &peer.CertInfo{NotAfter: now.Add(-time.Hour), CA: `"old CA" 12:34:56:78`, CANotAfter: now.Add(24 * time.Hour)}},
		{ID: "c"},
	}
	var b strings.Builder
	printCerts(&b, agents, now)
	out := b.String()
	for _, want := range []string{
		"ID  CERT EXPIRES",
		"a   2027-09-19 (in 300d)  " + ca + "  2036-11-20 (in 3650d)",
		`b   2026-11-22 (expired)  "old CA" 12:34:56:78`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\nc ") {
		t.Errorf("an agent without TLS has a line:\n%s", out)
	}
	b.Reset()
	printCerts(&b, agents[2:], now)
	if b.Len() != 0 {
		t.Errorf("printed %q without any certificate", b.String())
	}
}
