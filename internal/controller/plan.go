// Package controller is the agent's brain: each cycle it observes the
// store, the local node and etcd, plans with a pure function, and performs
// the planned actions one at a time.
package controller

import (
	"fmt"
	"log/slog"
	"sort"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// MsgNoMembers is reported, word for word, when the store says a cluster
// was created but no node holds its data. Only a restore may proceed.
const MsgNoMembers = "etcd has 0 members registered; must issue restore-backup command to proceed"

// Observed is what one cycle saw. It is plain data, built by observe.
type Observed struct {
	// StoreErr is set when the backup store could not be read.
	StoreErr error
	// Spec is the desired spec; nil when the store has none.
	Spec *spec.ClusterSpec
	// SpecErr is set when the stored spec is unreadable or invalid.
	SpecErr error
	// SpecBinaryErr is set when this node has no etcd binary for the
	// spec's version.
	SpecBinaryErr error
	// Created is the store's creation marker; nil when absent.
	Created *spec.ClusterCreated
	// Leader is true when this node may take cluster-wide actions.
	Leader bool
	// Self is this node; Peers are all nodes seen, Self included.
	Self  Node
	Peers []Node
}

// Node is one agent as observed.
type Node struct {
	ID string
	// Member is the node's etcd membership from its local state.
	Member *etcdproc.MemberState
	// HasData is true when the node's etcd data for its member's cluster
	// token is on disk.
	HasData bool
	// EtcdWanted is true while the node's supervisor keeps etcd running.
	EtcdWanted bool
	// Healthy is true when the node's etcd answered a status call.
	Healthy bool
	// Version is the server version its etcd reported.
	Version string
}

// Action is one step the executor performs.
type Action interface {
	fmt.Stringer
	// Mutates reports whether the action changes the cluster or node; the
	// executor re-observes after each one.
	Mutates() bool
}

// StartEtcd starts (or re-adopts) the local etcd from the node's state.
type StartEtcd struct{}

// MarkBootstrapped records that the local etcd has bootstrapped its new
// cluster, so it is never started as a new cluster again.
type MarkBootstrapped struct{}

// CreateCluster creates a new cluster of the given nodes and version.
type CreateCluster struct {
	Members []string
	Version string
}

// ConfirmCreate finishes a creation this node began: it writes the
// creation marker (once only) and abandons the attempt if another node
// wrote it first.
type ConfirmCreate struct{ Token string }

// Report logs a state that needs no action from this node, or one that a
// person must act on (at error level).
type Report struct {
	Level slog.Level
	Msg   string
	Attrs []any
}

func (StartEtcd) String() string        { return "start-etcd" }
func (StartEtcd) Mutates() bool         { return true }
func (MarkBootstrapped) String() string { return "mark-bootstrapped" }
func (MarkBootstrapped) Mutates() bool  { return false }
func (a CreateCluster) String() string {
	return fmt.Sprintf("create-cluster %v %s", a.Members, a.Version)
}
func (CreateCluster) Mutates() bool    { return true }
func (a ConfirmCreate) String() string { return "confirm-create " + a.Token }
func (ConfirmCreate) Mutates() bool    { return true }
func (a Report) String() string        { return "report " + a.Msg }
func (Report) Mutates() bool           { return false }

// Plan decides what to do next from the desired spec and what was
// observed. It is pure: no I/O, no clock, no randomness.
func Plan(o Observed) []Action {
	var actions []Action

	// The local etcd is kept running from local state alone, whatever the
	// store says: a bad spec or an unreachable store must never take a
	// healthy member down.
	switch {
	case o.Self.Member == nil || o.Self.Member.Pending || o.Self.EtcdWanted:
	case !o.Self.HasData && !o.Self.Member.NewCluster:
		// Starting etcd on an empty data dir of an existing cluster would
		// fail over and over at best; report it instead.
		actions = append(actions, Report{Level: slog.LevelError, Msg: "this node's etcd data is missing; not starting etcd",
			Attrs: []any{"cluster-token", o.Self.Member.ClusterToken}})
	default:
		actions = append(actions, StartEtcd{})
	}
	if m := o.Self.Member; m != nil && m.NewCluster && o.Self.Healthy && o.Self.HasData {
		actions = append(actions, MarkBootstrapped{})
	}

	switch {
	case o.StoreErr != nil:
		return append(actions, Report{Level: slog.LevelError, Msg: "backup store unreachable; will retry", Attrs: []any{"error", o.StoreErr}})
	case o.SpecErr != nil:
		return append(actions, Report{Level: slog.LevelError, Msg: "cluster spec is invalid; keeping etcd as it is until it is fixed with etcd-manager-ctl configure-cluster", Attrs: []any{"error", o.SpecErr}})
	case o.Spec == nil:
		return append(actions, Report{Level: slog.LevelInfo, Msg: "waiting for a cluster spec; set one with etcd-manager-ctl configure-cluster"})
	}

	if o.Self.Member != nil && o.Self.Member.Pending {
		return append(actions, ConfirmCreate{Token: o.Self.Member.ClusterToken})
	}
	if !o.Leader {
		return actions
	}

	members := memberNodes(o.Peers)
	if len(members) == 0 {
		return append(actions, planCreate(o)...)
	}

	// A cluster exists. Version and size changes come with later work; say
	// so plainly instead of acting.
	if o.Self.Member != nil && o.Self.Version != "" && o.Self.Version != o.Spec.EtcdVersion {
		actions = append(actions, Report{Level: slog.LevelWarn, Msg: "spec asks for another etcd version; version changes are not supported yet, so the cluster keeps its version",
			Attrs: []any{"running", o.Self.Version, "wanted", o.Spec.EtcdVersion}})
	}
	if int(o.Spec.MemberCount) != len(members) {
		actions = append(actions, Report{Level: slog.LevelWarn, Msg: "spec asks for another member count; resizing is not supported yet",
			Attrs: []any{"members", len(members), "wanted", o.Spec.MemberCount}})
	}
	return actions
}

func planCreate(o Observed) []Action {
	switch {
	case o.Created != nil:
		return []Action{Report{Level: slog.LevelError, Msg: MsgNoMembers}}
	case o.SpecBinaryErr != nil:
		return []Action{Report{Level: slog.LevelError, Msg: "cannot create the cluster: no etcd binary for the spec's version", Attrs: []any{"error", o.SpecBinaryErr}}}
	}
	want := int(o.Spec.MemberCount)
	ids := make([]string, 0, len(o.Peers))
	for _, p := range o.Peers {
		ids = append(ids, p.ID)
	}
	if len(ids) < want {
		return []Action{Report{Level: slog.LevelInfo, Msg: "waiting for enough agents to create the cluster", Attrs: []any{"have", len(ids), "want", want}}}
	}
	sort.Strings(ids)
	return []Action{CreateCluster{Members: ids[:want], Version: o.Spec.EtcdVersion}}
}

// memberNodes returns the nodes that hold (or are about to create) etcd
// data of a cluster.
func memberNodes(nodes []Node) []Node {
	var out []Node
	for _, n := range nodes {
		if n.Member != nil && (n.HasData || n.Member.NewCluster) {
			out = append(out, n)
		}
	}
	return out
}
