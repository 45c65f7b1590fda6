package plan

import (
	"fmt"
	"strings"
)

// Lookups over what was observed, for the executors that carry out a plan.

// FindNodes returns the observed nodes with the given IDs, in that order,
// or an error naming the first that was not reached.
func FindNodes(peers []Node, ids []string) ([]Node, error) {
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
			return nil, fmt.Errorf("plan: node %s is no longer reachable", id)
		}
	}
	return out, nil
}

// FindNode returns the observed node with the given ID.
func FindNode(peers []Node, id string) (Node, error) {
	nodes, err := FindNodes(peers, []string{id})
	if err != nil {
		return Node{}, err
	}
	return nodes[0], nil
}

// FindCommand returns the observed command with the given ID, or nil.
func FindCommand(cmds []Command, id string) *Command {
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
