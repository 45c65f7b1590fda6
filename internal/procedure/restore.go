package procedure

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// The restore procedure replaces the cluster with one made from a backup;
// the dump-restore procedure first quarantines the cluster and backs it
// up, then restores that backup into another etcd version. Their phases
// are spec.RestoreQuarantining through spec.RestoreLifting; package plan
// documents what each does and when it is done.

// prepareRestore fetches and verifies the backup, then chooses the
// restore's new cluster (token and members, created once), and records
// the first phase. Until then, nothing of the cluster has been touched.
func (e *Executor) prepareRestore(ctx context.Context, obs plan.Observed, act plan.PrepareRestore) error {
	c, _, err := command(act.ID, act.On.Command)
	if err != nil {
		return err
	}
	return e.Runner.Do(ctx, Restore, c, "", func(ctx context.Context, term int64) error {
		point := c.Command.RestoreBackup.RestorePoint
		checked, err := e.Backups.Validate(ctx, act.Backup, point)
		meta := checked.Meta
		if errors.Is(err, backup.ErrNoKey) {
			return e.Runner.Fail(ctx, act.ID, c.Status, fmt.Sprintf("cannot restore: %v; %s; the cluster was not touched", err, keyHint))
		}
		if errors.Is(err, backup.ErrNotFound) || errors.Is(err, backup.ErrCorrupt) || errors.Is(err, backup.ErrCheckLimit) ||
			errors.Is(err, backup.ErrTooLarge) || errors.Is(err, backup.ErrTempFull) ||
			errors.Is(err, changelog.ErrCorrupt) || errors.Is(err, changelog.ErrGap) || errors.Is(err, changelog.ErrRange) || errors.Is(err, changelog.ErrTooLarge) {
			return e.Runner.Fail(ctx, act.ID, c.Status, fmt.Sprintf("cannot restore: %v; the cluster was not touched", err))
		}
		if err != nil {
			return err
		}
		// Every node restores the backup itself: each needs its keys,
		// and room for it.
		if lacking := lackingKeys(act.On.Nodes, act.Members, checked.Keys); lacking != "" {
			return e.Runner.Fail(ctx, act.ID, c.Status, fmt.Sprintf("cannot restore backup %s: %s; %s; the cluster was not touched", act.Backup, lacking, keyHint))
		}
		if lacking := lackingRoom(act.On.Nodes, act.Members, max(meta.Size, checked.Size)); lacking != "" {
			return e.Runner.Fail(ctx, act.ID, c.Status, fmt.Sprintf("cannot restore backup %s: %s; the cluster was not touched", act.Backup, lacking))
		}
		check, how := restoreCheck(point, checked)
		if check == spec.RestoreUnverified && c.Command.RestoreBackup.RequireDigest {
			return e.Runner.Fail(ctx, act.ID, c.Status, fmt.Sprintf("cannot restore backup %s brought forward to revision %d unverified: %s, and the restore requires one (--require-digest); "+
				"restore without --require-digest, or pick a target at or after a revision capture recorded a digest for; the cluster was not touched", act.Backup, point.ToRevision, how))
		}
		v, err := spec.ParseSupportedVersion(obs.Spec.EtcdVersion)
		if err != nil {
			return err
		}
		progress, err := e.choose(ctx, act.ID, spec.RestoreStopping, act.Members, act.On.Nodes, v, "")
		if err != nil {
			return err
		}
		progress.ParentToken, progress.ParentRevision = meta.ClusterToken, changelog.SnapshotRevision(meta.Revision)
		if point.ToRevision > 0 {
			progress.ParentToken, progress.ParentRevision = point.Timeline, point.ToRevision
		}
		what := fmt.Sprintf("backup %s (etcd %s, revision %d)", act.Backup, meta.EtcdVersion, meta.Revision)
		if point.ToRevision > 0 {
			what += fmt.Sprintf(" brought forward to revision %d", point.ToRevision)
		}
		progress.Check, progress.DigestRevision = check, checked.Digest
		st := spec.CommandStatus{State: spec.CommandRunning, Restore: progress,
			Message: fmt.Sprintf("restoring %s as cluster %s; %s: %s", what, progress.Token, check, how)}
		if check == spec.RestoreUnverified {
			e.Log.Warn("restoring a point no digest checks: the captured changes applied are not checked against etcd", "command", act.ID,
				"backup", act.Backup, "to-revision", point.ToRevision)
		}
		e.Log.Warn("restore started: stopping the current cluster", "command", act.ID, "backup", act.Backup,
			"cluster-token", progress.Token, "members", progress.Members, "lock-term", term)
		return e.Runner.Record(ctx, Restore, act.ID, "", st, spec.RestoreStopping, "restore-"+spec.RestoreStopping)
	})
}

// restoreCheck says whether what a restore restores is checked against
// etcd itself, and how.
func restoreCheck(p spec.RestorePoint, v Validated) (check, how string) {
	switch {
	case !v.Forward:
		return spec.RestoreVerified, "the backup's snapshot as etcd wrote it, its checksums verified"
	case v.Digest > 0:
		return spec.RestoreVerified, fmt.Sprintf("the data brought forward matched, at revision %d, the digest capture read from etcd", v.Digest)
	}
	return spec.RestoreUnverified, fmt.Sprintf("capture recorded no digest between the backup and revision %d to check the changes applied against", p.ToRevision)
}

// keyHint says how to give the agents a key they lack.
const keyHint = "start the agents with --backup-encryption-key-file or --backup-decryption-key-file holding that key (see docs/security.md)"

// lackingKeys says which of the nodes members lack which of the keys, as
// they report them: "" when none does. nodes are the members' observed
// nodes.
func lackingKeys(nodes []plan.Node, members, keys []string) string {
	var out []string
	for _, k := range keys {
		var lack []string
		held := ""
		for _, n := range nodes {
			if slices.Contains(members, n.ID) && !slices.Contains(n.BackupKeys, k) {
				lack = append(lack, n.ID)
				if len(n.BackupKeys) == 0 {
					held += fmt.Sprintf("; %s holds no key", n.ID)
				} else {
					held += fmt.Sprintf("; %s holds [%s]", n.ID, strings.Join(n.BackupKeys, ", "))
				}
			}
		}
		if len(lack) > 0 {
			out = append(out, fmt.Sprintf("it is encrypted with key %s, which the agents of %s do not hold%s", k, strings.Join(lack, ", "), held))
		}
	}
	return strings.Join(out, "; ")
}

// lackingRoom says which of the nodes members report less room than a
// snapshot of size bytes needs (their free space less the reserve, or
// their --max-snapshot-bytes): "" when none does, or the size is not
// known (a kops meta). A node that reports no room (an older agent) is
// not judged; it refuses the snapshot itself. nodes are the members'
// observed nodes.
func lackingRoom(nodes []plan.Node, members []string, size int64) string {
	if size <= 0 {
		return ""
	}
	var out []string
	for _, n := range nodes {
		if slices.Contains(members, n.ID) && n.RestoreRoom > 0 && n.RestoreRoom < size {
			out = append(out, fmt.Sprintf("%s has room for %d", n.ID, n.RestoreRoom))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return fmt.Sprintf("its snapshot is %d bytes, and %s (free space on the data dir less the reserve, or --max-snapshot-bytes)", size, strings.Join(out, ", "))
}

// choose makes the choice of a restore or dump-restore: a new cluster of
// the members' nodes and version v, under a new token, starting at
// phase. It is created once; a choice an earlier driver made wins.
func (e *Executor) choose(ctx context.Context, id, phase string, members []string, nodes []plan.Node, v spec.Version, oldToken string) (*spec.RestoreProgress, error) {
	progress, err := newRestoreProgress(phase, members, nodes, v)
	if err != nil {
		return nil, err
	}
	progress.OldToken = oldToken
	choice := *progress
	choice.Phase = ""
	got, err := e.Runner.Choose(ctx, id, spec.Choice{Restore: &choice})
	if err != nil {
		return nil, err
	}
	if got.Restore == nil {
		return nil, fmt.Errorf("procedure: command %s: the recorded choice has no new cluster", id)
	}
	chosen := *got.Restore
	chosen.Phase = phase
	return &chosen, nil
}

// newRestoreProgress is the plan of a new cluster of the members' nodes
// (as the plan attached them) and version v, under a new token, starting
// at phase.
func newRestoreProgress(phase string, members []string, attached []plan.Node, v spec.Version) (*spec.RestoreProgress, error) {
	nodes, err := plan.ReachedAll(members, attached)
	if err != nil {
		return nil, err
	}
	token, err := spec.NewClusterToken()
	if err != nil {
		return nil, err
	}
	return &spec.RestoreProgress{Phase: phase, Token: token, Members: members,
		InitialCluster: plan.InitialCluster(nodes), EtcdVersion: v.String()}, nil
}

// step runs one step of the current phase of the restore or dump-restore
// id; fn gets the fencing term to put on its calls.
func (e *Executor) step(ctx context.Context, id string, on plan.Targets, fn func(context.Context, *plan.Command, *spec.RestoreProgress, int64) error) error {
	c, d, err := command(id, on.Command)
	if err != nil {
		return err
	}
	p := c.Status.Restore
	if p == nil {
		return fmt.Errorf("procedure: restore %s has no progress", id)
	}
	return e.Runner.Do(ctx, d, c, p.Phase, func(ctx context.Context, term int64) error { return fn(ctx, c, p, term) })
}

// setRestorePhase moves a restore to its next phase.
func (e *Executor) setRestorePhase(ctx context.Context, id string, cmd *plan.Command, phase string) error {
	c, d, err := command(id, cmd)
	if err != nil {
		return err
	}
	if c.Status.Restore == nil {
		return fmt.Errorf("procedure: restore %s has no progress to move on", id)
	}
	st := c.Status
	p := *st.Restore
	from := p.Phase
	p.Phase = phase
	if phase == spec.RestoreLifting {
		p.Lifted = spec.Int64(e.Now().UnixNano())
	}
	st.Restore = &p
	return e.Runner.Record(ctx, d, id, from, st, phase, "restore-"+phase)
}

// stopForRestore tells nodes to stop their old etcd and trash its data,
// the raft leader last.
func (e *Executor) stopForRestore(ctx context.Context, obs plan.Observed, act plan.StopForRestore) error {
	return e.step(ctx, act.ID, act.On, func(ctx context.Context, _ *plan.Command, _ *spec.RestoreProgress, term int64) error {
		nodes, err := plan.ReachedAll(act.NodeIDs(), act.On.Nodes)
		if err != nil {
			return err
		}
		return onNodesLeaderLast(ctx, nodes, func(ctx context.Context, n plan.Node) error {
			return e.call(ctx, n, callTimeout, func(ctx context.Context, api NodeAPI) error {
				return api.Leave(ctx, peer.LeaveRequest{LeaderID: e.SelfID, Term: term, Token: act.Tokens[n.ID], Reason: "restore " + act.ID + " replaces this cluster", Replaced: true,
					NotAfter: e.Runner.NotAfter()})
			})
		})
	})
}

// restoreNodes has the chosen nodes restore the backup, in parallel.
func (e *Executor) restoreNodes(ctx context.Context, obs plan.Observed, act plan.RestoreNodes) error {
	return e.step(ctx, act.ID, act.On, func(ctx context.Context, c *plan.Command, p *spec.RestoreProgress, term int64) error {
		name := p.Backup // a dump-restore's own backup
		var point spec.RestorePoint
		if c.Command.RestoreBackup != nil {
			name, point = c.Command.RestoreBackup.Backup, c.Command.RestoreBackup.RestorePoint
		}
		// The new cluster requires the node marker of peer certificates
		// from the start when every one of its nodes carries it.
		nodes, err := plan.ReachedAll(act.NodeIDs, act.On.Nodes)
		if err != nil {
			return err
		}
		req := peer.RestoreRequest{
			LeaderID: e.SelfID,
			Term:     term,
			Backup:   name,
			Point:    point,
			Member: etcdproc.MemberState{
				ClusterToken: p.Token, EtcdVersion: p.EtcdVersion, InitialCluster: p.InitialCluster, Quarantined: true,
				Settings: restoreSettings(obs, p.EtcdVersion), PeerCertHostname: plan.PeerCertHostname(nodes),
			},
		}
		return onNodes(ctx, nodes, func(ctx context.Context, n plan.Node) error {
			err := e.call(ctx, n, restoreCallTimeout, func(ctx context.Context, api NodeAPI) error {
				r := req
				r.NotAfter = e.Runner.NotAfter()
				return api.Restore(ctx, r)
			})
			if err != nil {
				return fmt.Errorf("procedure: restore on %s: %w", n.ID, err)
			}
			return nil
		})
	})
}

// verifyRestore checks the restored cluster, then moves on to lifting its
// quarantine.
func (e *Executor) verifyRestore(ctx context.Context, obs plan.Observed, act plan.VerifyRestore) error {
	return e.step(ctx, act.ID, act.On, func(ctx context.Context, c *plan.Command, p *spec.RestoreProgress, _ int64) error {
		want := int64(0)
		if r := c.Command.RestoreBackup; r != nil && r.ToRevision > 0 {
			want = r.ToRevision + r.BumpRevision
		}
		if err := verifyRestored(ctx, act.On.Members, p, e.ClientTLS, want); err != nil {
			return err
		}
		e.Log.Info("restored cluster verified: every member is up and HashKV agrees", "command", act.ID, "members", p.Members)
		return e.setRestorePhase(ctx, act.ID, c, spec.RestoreLifting)
	})
}

// backupRestored takes the fresh backup of the restored cluster, which
// serves clients by now, and records its name: the restore is then
// complete.
func (e *Executor) backupRestored(ctx context.Context, obs plan.Observed, act plan.BackupRestored) error {
	return e.step(ctx, act.ID, act.On, func(ctx context.Context, c *plan.Command, p *spec.RestoreProgress, _ int64) error {
		endpoint, err := restoredEndpoint(act.On.Members, p)
		if err != nil {
			return err
		}
		if err := e.recordBranch(ctx, c, p); err != nil {
			return err
		}
		info, err := e.Backups.Take(ctx, Source{Endpoint: endpoint, EtcdVersion: p.EtcdVersion, ClusterToken: p.Token, Spec: obs.Spec}, spec.BackupRestored, "after restore "+act.ID)
		if err != nil {
			return err
		}
		_, d, err := command(act.ID, c)
		if err != nil {
			return err
		}
		st := c.Status
		done := *p
		done.Fresh = info.Name
		st.Restore = &done
		return e.Runner.Record(ctx, d, act.ID, p.Phase, st, p.Phase, "")
	})
}

// restoredEndpoint is where the fresh backup of a restored cluster is
// taken: a healthy member's client URL, or its quarantine URL while its
// quarantine is on. members are the observed nodes of p's members.
func restoredEndpoint(members []plan.Node, p *spec.RestoreProgress) (string, error) {
	for _, n := range members {
		if !slices.Contains(p.Members, n.ID) || !n.Healthy || n.Member == nil || n.Member.ClusterToken != p.Token {
			continue
		}
		if n.Member.Quarantined {
			return quarantineURL(n)
		}
		if len(n.ClientURLs) > 0 && n.ClientURLs[0] != "" {
			return n.ClientURLs[0], nil
		}
	}
	// Its members restart once the quarantine is lifted; with a large
	// database that takes a while.
	return "", fmt.Errorf("%w: no member of the restored cluster %s is healthy to back up yet", ErrWait, p.Token)
}

// recordBranch records where the restored cluster's timeline began,
// before its first backup, so that its history can be followed back. A
// restore recorded by an older etcd-manager has no parent to record.
func (e *Executor) recordBranch(ctx context.Context, c *plan.Command, p *spec.RestoreProgress) error {
	if p.ParentToken == "" || p.ParentRevision < 1 {
		return nil
	}
	// The timeline begins when clients could first write to it: at the
	// lift, which a restore recorded by an older agent does not hold.
	began := e.Now().UTC()
	if p.Lifted > 0 {
		began = time.Unix(0, int64(p.Lifted)).UTC()
	}
	b := changelog.Branch{Timeline: p.Token, Parent: p.ParentToken, Revision: p.ParentRevision, Backup: p.Backup, Time: began}
	if r := c.Command.RestoreBackup; r != nil {
		b.Backup, b.BumpRevision = r.Backup, r.BumpRevision
	}
	if err := e.Backups.RecordBranch(ctx, b); err != nil {
		return err
	}
	e.Log.Info("the restored cluster's timeline branches from another", "cluster-token", b.Timeline, "parent", b.Parent, "revision", b.Revision, "bump-revision", b.BumpRevision)
	return nil
}

// setQuarantine quarantines the old cluster (dump-restore) or lifts the
// new one's quarantine (the end of a restore).
func (e *Executor) setQuarantine(ctx context.Context, obs plan.Observed, act plan.SetQuarantine) error {
	return e.step(ctx, act.ID, act.On, func(ctx context.Context, _ *plan.Command, _ *spec.RestoreProgress, term int64) error {
		return e.quarantine(ctx, obs, act, term)
	})
}

// finishRestore removes the completed restore command.
func (e *Executor) finishRestore(ctx context.Context, obs plan.Observed, act plan.FinishRestore) error {
	c, d, err := command(act.ID, act.On.Command)
	if err != nil {
		return err
	}
	if err := e.Runner.Finish(ctx, d, act.ID); err != nil {
		return err
	}
	fresh := ""
	if p := c.Status.Restore; p != nil {
		fresh = p.Fresh
	}
	e.Log.Info("restore complete; the command is removed", "command", act.ID, "fresh-backup", fresh)
	e.Changed()
	return nil
}

// prepareDumpRestore chooses the new cluster of a dump-restore (created
// once) and records its first phase. Nothing has been touched yet.
func (e *Executor) prepareDumpRestore(ctx context.Context, obs plan.Observed, act plan.PrepareDumpRestore) error {
	c := act.On.Command
	if c == nil || c.Command.DumpRestore == nil {
		return fmt.Errorf("procedure: no dump-restore %s", act.ID)
	}
	return e.Runner.Do(ctx, DumpRestore, c, "", func(ctx context.Context, term int64) error {
		v, err := spec.ParseSupportedVersion(c.Command.DumpRestore.EtcdVersion)
		if err != nil {
			return err
		}
		// Every node restores the dump, encrypted with this agent's key:
		// wait, untouched, until each holds it.
		if e.WriteKeyID != "" {
			if lacking := lackingKeys(act.On.Nodes, act.Members, []string{e.WriteKeyID}); lacking != "" {
				return fmt.Errorf("procedure: dump-restore %s waits: its backup would be encrypted, and %s; %s", act.ID, lacking, keyHint)
			}
		}
		progress, err := e.choose(ctx, act.ID, spec.RestoreQuarantining, act.Members, act.On.Nodes, v, act.OldToken)
		if err != nil {
			return err
		}
		st := spec.CommandStatus{State: spec.CommandRunning, Restore: progress,
			Message: fmt.Sprintf("changing etcd to %s by dump and restore: cluster %s is replaced by cluster %s", v, progress.OldToken, progress.Token)}
		e.Log.Warn("dump-restore started: quarantining the cluster", "command", act.ID, "version", v.String(),
			"old-cluster-token", progress.OldToken, "cluster-token", progress.Token, "members", progress.Members, "lock-term", term)
		return e.Runner.Record(ctx, DumpRestore, act.ID, "", st, spec.RestoreQuarantining, "restore-"+spec.RestoreQuarantining)
	})
}

// dumpBackup backs up the quarantined cluster and records the backup as
// the one to restore.
func (e *Executor) dumpBackup(ctx context.Context, obs plan.Observed, act plan.DumpBackup) error {
	return e.step(ctx, act.ID, act.On, func(ctx context.Context, c *plan.Command, cur *spec.RestoreProgress, _ int64) error {
		p := *cur
		from, endpoint, err := e.dumpSource(ctx, obs, p.OldToken)
		if err != nil {
			return fmt.Errorf("procedure: dump-restore %s: %w", act.ID, err)
		}
		info, err := e.Backups.Take(ctx, Source{Endpoint: endpoint, EtcdVersion: from.Member.EtcdVersion, ClusterToken: p.OldToken, Spec: obs.Spec},
			spec.BackupPreChange, "dump for etcd "+p.EtcdVersion+" ("+act.ID+")")
		if err != nil {
			return err
		}
		// Every node unpacks the dump: one too large for this agent's
		// maximum or disk fails now, while the old cluster still runs.
		const untouched = "the old cluster was not stopped, and its quarantine is lifted"
		if err := e.Backups.Fits(info.Meta, info.Name); errors.Is(err, backup.ErrTooLarge) || errors.Is(err, backup.ErrTempFull) {
			return e.Runner.Fail(ctx, act.ID, c.Status, fmt.Sprintf("cannot restore the dump: %v; %s", err, untouched))
		} else if err != nil {
			return err
		}
		if lacking := lackingRoom(act.On.Members, p.Members, info.Meta.Size); lacking != "" {
			return e.Runner.Fail(ctx, act.ID, c.Status, fmt.Sprintf("cannot restore the dump %s: %s; %s", info.Name, lacking, untouched))
		}
		p.Backup, p.Phase = info.Name, spec.RestoreStopping
		p.ParentToken, p.ParentRevision = p.OldToken, changelog.SnapshotRevision(info.Meta.Revision)
		st := c.Status
		st.Restore = &p
		st.Message = fmt.Sprintf("changing etcd to %s by dump and restore of backup %s (revision %d) as cluster %s",
			p.EtcdVersion, info.Name, info.Meta.Revision, p.Token)
		e.Log.Warn("dump-restore: the quarantined cluster is backed up; stopping it", "command", act.ID, "backup", info.Name, "node", from.ID)
		return e.Runner.Record(ctx, DumpRestore, act.ID, cur.Phase, st, spec.RestoreStopping, "restore-"+spec.RestoreStopping)
	})
}

// dumpSource is where the dump of the quarantined cluster token is
// taken: its raft leader, after a linearizable read through it, so that
// the leader has applied every write the cluster acknowledged before the
// quarantine (nothing can be written since).
func (e *Executor) dumpSource(ctx context.Context, obs plan.Observed, token string) (plan.Node, string, error) {
	var nodes []plan.Node
	var endpoints []string
	for _, n := range obs.Peers {
		if n.Member != nil && n.Member.ClusterToken == token && n.Member.Quarantined && n.Healthy {
			if u, err := quarantineURL(n); err == nil {
				nodes, endpoints = append(nodes, n), append(endpoints, u)
			}
		}
	}
	if len(nodes) == 0 {
		return plan.Node{}, "", fmt.Errorf("no quarantined member of cluster %s is healthy to back up", token)
	}
	c, err := etcdproc.NewClient(endpoints, e.ClientTLS)
	if err != nil {
		return plan.Node{}, "", err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
	defer cancel()
	for i, ep := range endpoints {
		st, err := c.Status(ctx, ep)
		if err != nil || st.Leader == 0 || st.Leader != st.Header.MemberId {
			continue
		}
		// A linearizable read through the leader: it has applied all that
		// was committed before the read.
		lc, err := etcdproc.NewClient([]string{ep}, e.ClientTLS)
		if err != nil {
			return plan.Node{}, "", err
		}
		_, err = lc.Get(ctx, "/etcd-manager/dump-check")
		lc.Close()
		if err != nil {
			return plan.Node{}, "", fmt.Errorf("linearizable read on the quarantined leader %s: %w", nodes[i].ID, err)
		}
		return nodes[i], ep, nil
	}
	return plan.Node{}, "", fmt.Errorf("the quarantined cluster %s has no leader among its reachable members yet", token)
}

// verifyRestored checks that the restored cluster has exactly its members,
// all voters and up, that HashKV agrees across them at one revision, and
// that this is the revision wanted, when one is (a restore to a point).
func verifyRestored(ctx context.Context, attached []plan.Node, p *spec.RestoreProgress, tlsCfg *tls.Config, wantRev int64) error {
	nodes, err := plan.ReachedAll(p.Members, attached)
	if err != nil {
		return err
	}
	var endpoints []string
	for _, n := range nodes {
		u, err := quarantineURL(n)
		if err != nil {
			return err
		}
		endpoints = append(endpoints, u)
	}
	c, err := etcdproc.NewClient(endpoints, tlsCfg)
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
	defer cancel()
	members, err := c.MemberList(cctx)
	if err != nil {
		return fmt.Errorf("procedure: restored cluster: member list: %w", err)
	}
	if len(members.Members) != len(p.Members) {
		return fmt.Errorf("procedure: restored cluster has %d members, want %d", len(members.Members), len(p.Members))
	}
	st, err := c.Status(cctx, endpoints[0])
	if err != nil {
		return fmt.Errorf("procedure: restored cluster: status of %s: %w", endpoints[0], err)
	}
	rev := st.Header.Revision
	if wantRev > 0 && rev != wantRev {
		return fmt.Errorf("procedure: restored cluster is at revision %d, but the restore was to revision %d", rev, wantRev)
	}
	var first *clientv3.HashKVResponse
	for _, ep := range endpoints {
		h, err := etcdproc.HashKV(ctx, c, ep, rev)
		if err != nil {
			return fmt.Errorf("procedure: restored cluster: HashKV of %s at revision %d: %w", ep, rev, err)
		}
		if first == nil {
			first = h
			continue
		}
		if h.Hash != first.Hash || h.CompactRevision != first.CompactRevision {
			return fmt.Errorf("procedure: restored cluster: HashKV differs at revision %d: %s has %d, %s has %d",
				rev, endpoints[0], first.Hash, ep, h.Hash)
		}
	}
	return nil
}

// quarantineURL is where node n's etcd serves while quarantined; a peer
// that reports none is an error, never a panic.
func quarantineURL(n plan.Node) (string, error) {
	if len(n.QuarantineURLs) == 0 || n.QuarantineURLs[0] == "" {
		return "", fmt.Errorf("procedure: node %s reports no quarantine URL", n.ID)
	}
	return n.QuarantineURLs[0], nil
}

// restoreSettings are the spec's etcd settings that the restored etcd's
// version accepts.
func restoreSettings(obs plan.Observed, version string) map[string]string {
	v, err := spec.ParseVersion(version)
	if obs.Spec == nil || err != nil {
		return nil
	}
	s, _ := obs.Spec.EtcdSettings.Usable(v)
	return s
}
