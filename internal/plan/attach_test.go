package plan

import (
	"strings"
	"testing"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Plan attaches to each action the observed nodes and command it acts
// on, so that no executor searches the observation again.
func TestAttach(t *testing.T) {
	a, b := node("a", "member"), node("b", "member")
	restore := Command{ID: "r1", Status: spec.CommandStatus{Restore: &spec.RestoreProgress{Members: []string{"b", "gone", "a"}}}}
	o := Observed{Peers: []Node{a, b}, Commands: []Command{restore, {ID: "q1"}}}
	ids := func(ns []Node) string {
		var out []string
		for _, n := range ns {
			out = append(out, n.ID)
		}
		return strings.Join(out, ",")
	}
	tests := []struct {
		act                  Action
		node, nodes, members string
		command              string
	}{
		{act: AddMember{NodeID: "b"}, node: "b"},
		{act: AddMember{NodeID: "gone"}},
		{act: RemoveMember{MemberID: 7}}, // a member without a node
		{act: SyncCA{NodeID: "a"}, node: "a"},
		{act: DefragMember{NodeID: "a"}, node: "a"},
		{act: CreateCluster{Members: []string{"b", "a"}}, nodes: "b,a"},
		{act: CreateCluster{Members: []string{"a", "gone", "b"}}, nodes: "a,b"},
		{act: RecoverMember{ID: "q1", NodeID: "a"}, node: "a", command: "q1"},
		{act: RestoreNodes{ID: "r1", NodeIDs: []string{"a"}}, nodes: "a", command: "r1", members: "b,a"},
		{act: StopForRestore{ID: "r1", Tokens: map[string]string{"b": "old", "a": "old"}}, nodes: "a,b", command: "r1", members: "b,a"},
		{act: SetQuarantine{Token: "t", NodeIDs: []string{"b"}}, nodes: "b"}, // a stray quarantine: no command
		{act: VerifyRestore{ID: "r1"}, command: "r1", members: "b,a"},
		{act: FinishRestore{ID: "deleted"}},
		{act: NoteCommand{ID: "q1"}, command: "q1"},
		{act: FailCommand{ID: "r1"}, command: "r1", members: "b,a"},
	}
	for _, tt := range tests {
		got := attach(o, []Action{tt.act})[0]
		on := targetsOf(t, got)
		gotNode := ""
		if on.Node != nil {
			gotNode = on.Node.ID
		}
		gotCommand := ""
		if on.Command != nil {
			gotCommand = on.Command.ID
		}
		if gotNode != tt.node || ids(on.Nodes) != tt.nodes || ids(on.Members) != tt.members || gotCommand != tt.command {
			t.Errorf("%v: attached node %q nodes %q members %q command %q, want %q %q %q %q",
				tt.act, gotNode, ids(on.Nodes), ids(on.Members), gotCommand, tt.node, tt.nodes, tt.members, tt.command)
		}
		if got.String() != tt.act.String() {
			t.Errorf("attached %v reads %v", tt.act, got)
		}
	}

	// Through Plan: the cluster it creates carries its nodes.
	obs := Observed{Spec: specN(2), Self: node("a", "standby"), Peers: []Node{node("a", "standby"), node("b", "standby")}, LockHeld: true}
	for _, act := range Plan(obs) {
		if c, ok := act.(CreateCluster); ok {
			nodes, err := ReachedAll(c.Members, c.On.Nodes)
			if err != nil || ids(nodes) != "a,b" {
				t.Errorf("planned %v carries %q, %v; want a,b", c, ids(nodes), err)
			}
			return
		}
	}
	t.Errorf("no create-cluster planned: %s", describe(Plan(obs)))
}

func targetsOf(t *testing.T, act Action) Targets {
	t.Helper()
	switch a := act.(type) {
	case AddMember:
		return a.On
	case RemoveMember:
		return a.On
	case SyncCA:
		return a.On
	case DefragMember:
		return a.On
	case CreateCluster:
		return a.On
	case RecoverMember:
		return a.On
	case RestoreNodes:
		return a.On
	case StopForRestore:
		return a.On
	case SetQuarantine:
		return a.On
	case VerifyRestore:
		return a.On
	case FinishRestore:
		return a.On
	case NoteCommand:
		return a.On
	case FailCommand:
		return a.On
	}
	t.Fatalf("%T carries no targets", act)
	return Targets{}
}

// An executor given a node the plan did not reach gets the error it got
// when it searched for it, naming the node.
func TestReached(t *testing.T) {
	a, b := node("a", "member"), node("b", "member")
	if n, err := Reached("a", &a); err != nil || n.ID != "a" {
		t.Errorf("Reached(a, a) = %v, %v", n.ID, err)
	}
	for _, n := range []*Node{nil, &b} {
		if _, err := Reached("a", n); err == nil || !strings.Contains(err.Error(), "node a is no longer reachable") {
			t.Errorf("Reached(a, %v) = %v, want a's unreachable error", n, err)
		}
	}
	if got, err := ReachedAll([]string{"a", "b"}, []Node{a, b}); err != nil || len(got) != 2 {
		t.Errorf("ReachedAll(a b) = %v, %v", got, err)
	}
	for _, attached := range [][]Node{nil, {a}, {b}, {b, a}} {
		if _, err := ReachedAll([]string{"a", "b"}, attached); err == nil || !strings.Contains(err.Error(), "no longer reachable") {
			t.Errorf("ReachedAll(a b) of %d nodes = %v, want an error", len(attached), err)
		}
	}
}
