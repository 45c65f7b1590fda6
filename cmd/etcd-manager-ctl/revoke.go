package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// revoke-node lists a node in the store's revocation list (see package
// pki), with the serials of every certificate the store recorded for it.

// recordFresh is how old an agent's record may be for revoke-node to
// count its etcd as up: agents publish every 10 s.
const recordFresh = time.Minute

func revokeNodeCommand(o *options, stdout io.Writer) *cobra.Command {
	var reason string
	var force bool
	cmd := &cobra.Command{
		Use:   "revoke-node NODE",
		Short: "Revoke a node's certificates: every agent refuses them, and the leader replaces its member",
		Long: `revoke-node revokes a node whose certificate or key may have leaked, or whose
machine is gone for good. It writes the node to the store's revocation list
(pki/revoked) with the serial numbers of every certificate the agents recorded
for it (pki/issued/NODE/). From their next cycle (seconds):

  - every agent refuses the node's certificates on its peer API, whatever
    their serial, and stops calling the node;
  - etcd refuses the listed serials on its client and peer ports, for new
    connections (the CRL file each agent writes beside its certificate,
    which etcd reads at each connection; a member started by an older
    etcd-manager reads it from its next restart);
  - the node's own agent stops its etcd and keeps it stopped;
  - the leader removes the node's member, while the other members keep a
    quorum, and a standby agent, if there is one, joins in its place.

A revoked node ID stays refused. To bring the machine back, start its agent
on an empty --data-dir: it gets a new node ID and a new certificate (an agent
given --node-name, such as a StatefulSet's pod, needs another name).
A node that holds the CA key (the store's pki/ prefix, or --pki-dir) can
issue itself certificates under any name: for a machine that may hold it,
rotate the CA (rotate-ca) as well.

revoke-node refuses a node no agent has recorded in this store (a typo),
and a member whose loss would leave fewer healthy members than a quorum,
unless --force. To undo a revocation, remove the node's entry from
pki/revoked (or the object itself) before its member is removed.`,
		Example: `  etcd-manager-ctl --backup-store=s3://bucket/main revoke-node kYdQ3R5u0x4mVb1p --reason "disk image leaked"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.revokeNode(cmd.Context(), stdout, args[0], reason, force)
		},
		ValidArgsFunction: o.completeFrom(nodeIDs),
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept in the revocation list")
	cmd.Flags().BoolVar(&force, "force", false, "revoke a node no agent recorded, or a member whose loss costs the quorum")
	return cmd
}

// revokeResult is what revoke-node prints.
type revokeResult struct {
	NodeID    string    `json:"nodeId"`
	RevokedAt time.Time `json:"revokedAt"`
	Reason    string    `json:"reason,omitempty"`
	// Serials are the node's certificates now listed; New says the node
	// was not revoked before.
	Serials []string `json:"serials"`
	New     bool     `json:"new"`
}

func (o *options) revokeNode(ctx context.Context, w io.Writer, node, reason string, force bool) error {
	if err := pki.CheckNodeID(node); err != nil {
		return usageError{err}
	}
	if len(reason) > 512 {
		return usagef("--reason has %d bytes; at most 512", len(reason))
	}
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	keys, err := s.List(ctx, pki.StoreIssuedPrefix+node+"/", "")
	if err != nil {
		return err
	}
	var serials []string
	for _, k := range keys {
		serial := strings.TrimPrefix(k, pki.StoreIssuedPrefix+node+"/")
		if len(serials) < pki.MaxRevokedSerials && pki.ValidSerialHex(serial) {
			serials = append(serials, serial)
		}
	}
	recs, err := peer.StoreRecords(ctx, s, peer.ReadLimits{Now: time.Now()})
	if err != nil && !force {
		return fmt.Errorf("the agents' records do not all read, so the quorum after the revocation cannot be judged: %w; or --force", err)
	}
	known := len(serials) > 0 || slices.ContainsFunc(recs, func(r peer.Record) bool { return r.NodeID == node })
	if !known && !force {
		return fmt.Errorf("no agent recorded node %q in this store (no discovery record, no certificate issued): check the ID (etcd-manager-ctl status lists the nodes), or --force", node)
	}
	current, err := readRevocations(ctx, s)
	if err != nil {
		return err
	}
	memberCount := 0
	if cs, err := s.ReadSpec(ctx); err == nil {
		memberCount = int(cs.MemberCount)
	}
	if err := quorumAfterRevoking(recs, current, node, memberCount, time.Now()); err != nil && !force {
		return fmt.Errorf("%w; heal or replace the others first, or --force", err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	_, was := current.Node(node)
	next := current.Revoke(pki.RevokedNode{NodeID: node, RevokedAt: now, Reason: reason, Serials: serials})
	data, err := next.Marshal()
	if err != nil {
		return err
	}
	if err := s.Write(ctx, pki.StoreRevokedKey, data); err != nil {
		return err
	}
	o.nudge(ctx, s)
	entry, _ := next.Node(node)
	res := revokeResult{NodeID: node, RevokedAt: entry.RevokedAt, Reason: entry.Reason, Serials: entry.Serials, New: !was}
	if res.Serials == nil {
		res.Serials = []string{}
	}
	return o.emit(w, res, func() error {
		verb := "revoked"
		if was {
			verb = "already revoked"
		}
		return fprintf(w, "node %s %s (since %s); %d certificate serials listed for etcd's CRL\n"+
			"the agents refuse its certificates from their next cycle; its agent stops its etcd, and the leader removes its member "+
			"(a standby agent, if any, takes its place); to use the machine again, start its agent on an empty --data-dir\n",
			node, verb, entry.RevokedAt.Format(time.RFC3339), len(entry.Serials))
	})
}

// readRevocations reads the store's revocation list; a missing one is
// empty.
func readRevocations(ctx context.Context, s *store.Store) (pki.Revocations, error) {
	return pki.LoadStoreRevocations(ctx, s, isNotFound)
}

// quorumAfterRevoking refuses to revoke a member when the members whose
// agents lately published a healthy etcd, without it and without the
// nodes revoked already, would be fewer than a quorum of the members:
// its agent stops its etcd at once. Members are the nodes whose fresh
// records carry the most common cluster token among them, and there are
// at least as many as the spec asks for (memberCount): a member whose
// agent is silent counts, as unhealthy.
func quorumAfterRevoking(recs []peer.Record, revoked pki.Revocations, node string, memberCount int, now time.Time) error {
	var members []peer.Record
	tokens := map[string]int{}
	for _, r := range recs {
		if r.Etcd != nil && r.Etcd.ClusterToken != "" && now.Sub(r.Updated) <= recordFresh {
			tokens[r.Etcd.ClusterToken]++
		}
	}
	token, most := "", 0
	for t, n := range tokens {
		if n > most || (n == most && t < token) {
			token, most = t, n
		}
	}
	for _, r := range recs {
		if r.Etcd != nil && r.Etcd.ClusterToken == token && token != "" && now.Sub(r.Updated) <= recordFresh {
			members = append(members, r)
		}
	}
	if !slices.ContainsFunc(members, func(r peer.Record) bool { return r.NodeID == node }) {
		return nil // not a member the records show
	}
	healthy := 0
	for _, r := range members {
		if _, gone := revoked.Node(r.NodeID); r.NodeID != node && !gone && r.Etcd.Healthy {
			healthy++
		}
	}
	total := max(len(members), memberCount)
	if need := total/2 + 1; healthy < need {
		return fmt.Errorf("revoking %s, whose agent then stops its etcd, would leave %d healthy members of %d, short of a quorum of %d", node, healthy, total, need)
	}
	return nil
}
