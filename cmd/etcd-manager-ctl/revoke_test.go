package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/pki"
)

// revoke-node lists the node with every serial the store recorded for
// it, merges a second revocation into the first, and refuses a node no
// agent recorded, a malformed ID, a damaged list, and a member whose loss
// costs the quorum, each unless --force where that makes sense.
func TestRevokeNode(t *testing.T) {
	fresh := time.Now().UTC().Format(time.RFC3339)
	record := func(id string, healthy bool) string {
		return `{"nodeId":"` + id + `","address":"127.0.0.1:1","updated":"` + fresh + `","etcd":{"clusterToken":"tok","hasData":true,"healthy":` + map[bool]string{true: "true", false: "false"}[healthy] + `}}`
	}
	tests := []struct {
		name     string
		objects  map[string]string
		args     []string
		wantCode int
		wantErr  string
		// wantSerials are node's serials in the list afterwards.
		node        string
		wantSerials string
	}{
		{name: "a node with recorded certificates", objects: map[string]string{"pki/issued/n1/abc": "{}", "pki/issued/n1/1f": "{}", "pki/issued/n2/99": "{}"},
			args: []string{"revoke-node", "n1", "--reason", "leaked"}, node: "n1", wantSerials: "1f,abc"},
		{name: "again, with a new certificate: merged", objects: map[string]string{"pki/issued/n1/abc": "{}", "pki/issued/n1/77": "{}",
			pki.StoreRevokedKey: `{"nodes":[{"nodeId":"n1","revokedAt":"2026-12-01T00:00:00Z","serials":["1f","abc"]}]}`},
			args: []string{"revoke-node", "n1"}, node: "n1", wantSerials: "1f,77,abc"},
		{name: "a standby known by its record alone", objects: map[string]string{"discovery/n3": `{"nodeId":"n3","address":"127.0.0.1:1","updated":"` + fresh + `"}`},
			args: []string{"revoke-node", "n3"}, node: "n3", wantSerials: ""},
		{name: "a node no agent recorded", args: []string{"revoke-node", "typo"}, wantCode: exitFailed, wantErr: `no agent recorded node "typo"`},
		{name: "the same with --force", args: []string{"revoke-node", "typo", "--force"}, node: "typo", wantSerials: ""},
		{name: "a malformed ID", args: []string{"revoke-node", "../x"}, wantCode: exitUsage, wantErr: "only letters"},
		{name: "a damaged list", objects: map[string]string{"pki/issued/n1/abc": "{}", pki.StoreRevokedKey: "nodes"},
			args: []string{"revoke-node", "n1"}, wantCode: exitFailed, wantErr: "fix or remove it"},
		{name: "a member whose loss costs the quorum",
			objects:  map[string]string{"discovery/a": record("a", true), "discovery/b": record("b", false), "discovery/c": record("c", true)},
			args:     []string{"revoke-node", "a"},
			wantCode: exitFailed, wantErr: "would leave 1 healthy members of 3, short of a quorum of 2"},
		{name: "a member the others can do without",
			objects: map[string]string{"discovery/a": record("a", true), "discovery/b": record("b", true), "discovery/c": record("c", true)},
			args:    []string{"revoke-node", "a"}, node: "a", wantSerials: ""},
		{name: "the unhealthy member itself",
			objects: map[string]string{"discovery/a": record("a", true), "discovery/b": record("b", false), "discovery/c": record("c", true)},
			args:    []string{"revoke-node", "b"}, node: "b", wantSerials: ""},
		{name: "the only agent publishing, of the spec's three members",
			objects: map[string]string{"discovery/a": record("a", true)},
			args:    []string{"revoke-node", "a"}, wantCode: exitFailed, wantErr: "would leave 0 healthy members of 3"},
		{name: "a healthy member while two agents are silent",
			objects: map[string]string{"discovery/a": record("a", true), "discovery/b": record("b", true)},
			args:    []string{"revoke-node", "a"}, wantCode: exitFailed, wantErr: "would leave 1 healthy members of 3, short of a quorum of 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCtlEnv(t)
			if _, _, err := e.run(t, "--member-count=3", "--etcd-version=3.6.16", "configure-cluster"); err != nil {
				t.Fatal(err)
			}
			s := e.open(t)
			defer s.Close()
			for k, v := range tt.objects {
				if err := s.Write(t.Context(), k, []byte(v)); err != nil {
					t.Fatal(err)
				}
			}
			out, errOut, err := e.run(t, append(tt.args, "-o", "json")...)
			if tt.wantCode != 0 {
				if exitCode(err) != tt.wantCode || err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("exit %d (%v), want %d saying %q", exitCode(err), err, tt.wantCode, tt.wantErr)
				}
				if out != "" {
					t.Errorf("stdout %q on a failure", out)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, errOut)
			}
			var res revokeResult
			if err := json.Unmarshal([]byte(out), &res); err != nil || res.NodeID != tt.node || strings.Join(res.Serials, ",") != tt.wantSerials {
				t.Errorf("result %s (%v), want node %s with serials %q", out, err, tt.node, tt.wantSerials)
			}
			r, err := readRevocations(t.Context(), s)
			if err != nil {
				t.Fatal(err)
			}
			n, ok := r.Node(tt.node)
			if !ok || strings.Join(n.Serials, ",") != tt.wantSerials {
				t.Errorf("the store's list %+v, want %s with serials %q", r, tt.node, tt.wantSerials)
			}
		})
	}
}
