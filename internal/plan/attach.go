package plan

import (
	"fmt"
	"strings"
)

// Plan attaches to each action what it acts on, from the observation it
// planned from: the nodes it names and the command it belongs to. The
// executors take them from the action, and never search the observation
// again. (The loop acts on one plan until an action mutates, then
// observes and plans again: an action is always carried out against the
// observation it was made from.)

// Targets is what Plan attaches to an action, in its On field. The
// planner's rules leave it empty, and String ignores it.
type Targets struct {
	// Node is the observed node of the action's NodeID; nil when that
	// node was not reached.
	Node *Node
	// Nodes are the observed nodes of the IDs the action names, in their
	// order; an ID whose node was not reached has none.
	Nodes []Node
	// Command is the observed command of the action's ID; nil when it is
	// gone.
	Command *Command
	// Members are the observed nodes of the members the command's restore
	// progress records, in its order; one not reached has none.
	Members []Node
}

// Reached returns the node an action attached for id, or an error when
// it was not reached.
func Reached(id string, n *Node) (Node, error) {
	if n == nil || n.ID != id {
		return Node{}, unreached(id)
	}
	return *n, nil
}

// ReachedAll returns the nodes an action attached for ids, or an error
// naming the first of ids whose node was not reached.
func ReachedAll(ids []string, nodes []Node) ([]Node, error) {
	for i, id := range ids {
		if i >= len(nodes) || nodes[i].ID != id {
			return nil, unreached(id)
		}
	}
	return nodes, nil
}

func unreached(id string) error {
	return fmt.Errorf("plan: node %s is no longer reachable", id)
}

// attach fills in each action's On from o.
func attach(o Observed, actions []Action) []Action {
	node := func(id string) *Node {
		if id == "" {
			return nil
		}
		if n, err := findNode(o.Peers, id); err == nil {
			return &n
		}
		return nil
	}
	nodes := func(ids []string) []Node {
		var out []Node
		for _, id := range ids {
			if n := node(id); n != nil {
				out = append(out, *n)
			}
		}
		return out
	}
	command := func(id string) Targets {
		t := Targets{Command: findCommand(o.Commands, id)}
		if t.Command != nil && t.Command.Status.Restore != nil {
			t.Members = nodes(t.Command.Status.Restore.Members)
		}
		return t
	}
	for i, act := range actions {
		switch a := act.(type) {
		case CreateCluster:
			a.On.Nodes = nodes(a.Members)
			actions[i] = a
		case AddMember:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case RemoveMember:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case EvictNode:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case SetMemberVersion:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case SetMemberSettings:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case SetPeerCertCheck:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case SetPeerURLs:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case SyncCA:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case ResumeMember:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case DiscardMemberData:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case DefragMember:
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case RecoverMember:
			a.On = command(a.ID)
			a.On.Node = node(a.NodeID)
			actions[i] = a
		case PrepareRestore:
			a.On = command(a.ID)
			a.On.Nodes = nodes(a.Members)
			actions[i] = a
		case PrepareDumpRestore:
			a.On = command(a.ID)
			a.On.Nodes = nodes(a.Members)
			actions[i] = a
		case StopForRestore:
			a.On = command(a.ID)
			a.On.Nodes = nodes(a.NodeIDs())
			actions[i] = a
		case RestoreNodes:
			a.On = command(a.ID)
			a.On.Nodes = nodes(a.NodeIDs)
			actions[i] = a
		case SetQuarantine:
			if a.ID != "" {
				a.On = command(a.ID)
			}
			a.On.Nodes = nodes(a.NodeIDs)
			actions[i] = a
		case SetRestorePhase:
			a.On = command(a.ID)
			actions[i] = a
		case VerifyRestore:
			a.On = command(a.ID)
			actions[i] = a
		case BackupRestored:
			a.On = command(a.ID)
			actions[i] = a
		case DumpBackup:
			a.On = command(a.ID)
			actions[i] = a
		case FinishRestore:
			a.On = command(a.ID)
			actions[i] = a
		case HoldNodes:
			a.On = command(a.ID)
			actions[i] = a
		case NoteCommand:
			a.On = command(a.ID)
			actions[i] = a
		case FailCommand:
			a.On = command(a.ID)
			actions[i] = a
		}
	}
	return actions
}

// findNodes returns the observed nodes with the given IDs, in that order,
// or an error naming the first that was not reached.
func findNodes(peers []Node, ids []string) ([]Node, error) {
	var out []Node
	for _, id := range ids {
		found := false
		for _, p := range peers {
			if p.ID == id {
				out = append(out, p)
				found = true
				break
			}
		}
		if !found {
			return nil, unreached(id)
		}
	}
	return out, nil
}

// findNode returns the observed node with the given ID.
func findNode(peers []Node, id string) (Node, error) {
	nodes, err := findNodes(peers, []string{id})
	if err != nil {
		return Node{}, err
	}
	return nodes[0], nil
}

// findCommand returns the observed command with the given ID, or nil.
func findCommand(cmds []Command, id string) *Command {
	for i := range cmds {
		if cmds[i].ID == id {
			return &cmds[i]
		}
	}
	return nil
}

// InitialCluster is etcd's --initial-cluster for nodes: name=peerURL,...
func InitialCluster(nodes []Node) string {
	var initial []string
	for _, n := range nodes {
		for _, u := range n.PeerURLs {
			initial = append(initial, n.ID+"="+u)
		}
	}
	return strings.Join(initial, ",")
}
