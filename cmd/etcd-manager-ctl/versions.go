package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// configure-cluster checks an etcd version against the versions each
// agent reports installed on its node, in its record under discovery/ in
// the store: the ctl itself needs no etcd binaries, and may run on a
// laptop. The agents refuse a version their nodes lack before they stop
// anything in any case; the check here says so at once, naming the nodes.

// reportMaxAge is how fresh a record must be for a version to be refused
// by it. Agents publish every few seconds; an older record is a node that
// is down or gone, whose lack of the version is only warned about.
const reportMaxAge = 10 * time.Minute

// checkInstalled refuses version when a member's node that reported
// recently lacks it, naming each such node with what it has; a standby
// lacking it only cannot become a member. It warns on warn
// when no node has reported (agents older than the report, or none
// running), when a node not heard from for a while lacks it, and when
// records cannot be read: the agents check again in any case.
func checkInstalled(ctx context.Context, s peer.BlobStore, version string, now time.Time, warn io.Writer) error {
	v, err := spec.ParseVersion(version)
	if err != nil {
		return usagef("--etcd-version: %w", err)
	}
	recs, err := peer.StoreRecords(ctx, s, peer.ReadLimits{Now: now})
	if err != nil {
		// Some records, or all, could not be read: check by the rest.
		fprintf(warn, "warning: cannot read every node's record to check etcd %s against what it has installed: %v; the agents refuse it, before they stop anything, if a member lacks it\n", v, err)
	}
	var lacking, silent []string
	reported := 0
	for _, r := range recs {
		has, known := r.HasEtcd(v)
		if !known {
			continue
		}
		node := r.NodeID
		if node == "" {
			node = r.Address
		}
		if age := now.Sub(r.Updated); r.Updated.IsZero() || age > reportMaxAge {
			if !has {
				when := "its record says not when it was written"
				if !r.Updated.IsZero() {
					when = fmt.Sprintf("last heard from %s ago", age.Round(time.Second))
				}
				silent = append(silent, fmt.Sprintf("%s (%s)", node, when))
			}
			continue
		}
		reported++
		if !has && r.Etcd != nil && r.Etcd.ClusterToken != "" {
			lacking = append(lacking, fmt.Sprintf("%s (has %s)", node, strings.Join(r.EtcdVersions, ", ")))
		}
	}
	sort.Strings(lacking)
	sort.Strings(silent)
	if len(lacking) > 0 {
		return fmt.Errorf("--etcd-version=%s: no etcd %s on node %s; install etcd-v%s/etcd under each node's --etcd-bin-dir (or roll out an image that has it) and try again: until then the agents would refuse the version",
			version, v, strings.Join(lacking, ", node "), v)
	}
	if len(silent) > 0 {
		fprintf(warn, "warning: node %s, not heard from for over %s, lacks etcd %s: it cannot run it when it comes back\n", strings.Join(silent, ", node "), reportMaxAge, v)
	}
	if reported == 0 {
		fprintf(warn, "warning: no node has reported its installed etcd versions in the last %s (no agent runs, or they are older than this ctl), so etcd %s is not checked against the nodes; the agents refuse it, before they stop anything, if a member lacks it\n", reportMaxAge, v)
	}
	return nil
}

// installedOnAll are the etcd versions every member's node reported
// installed in a fresh record: what a version change may step through.
// It is nil when no member's node has reported.
func installedOnAll(ctx context.Context, s peer.BlobStore, now time.Time) []spec.Version {
	recs, _ := peer.StoreRecords(ctx, s, peer.ReadLimits{Now: now})
	var common []string
	seen := false
	for _, r := range recs {
		if r.Etcd == nil || r.Etcd.ClusterToken == "" || r.Updated.IsZero() || now.Sub(r.Updated) > reportMaxAge {
			continue
		}
		if !seen {
			common, seen = slices.Clone(r.EtcdVersions), true
			continue
		}
		common = slices.DeleteFunc(common, func(v string) bool { return !slices.Contains(r.EtcdVersions, v) })
	}
	var out []spec.Version
	for _, c := range common {
		if v, err := spec.ParseVersion(c); err == nil {
			out = append(out, v)
		}
	}
	return out
}
