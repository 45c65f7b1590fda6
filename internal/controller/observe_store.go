package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

// observeStore reads the cluster spec and the cluster-created marker
// into obs: an unreachable store sets StoreErr, a spec that does not
// read or validate SpecErr.
func (lp *loop) observeStore(ctx context.Context, s *store.Store, obs *plan.Observed) {
	cs, err := s.ReadSpec(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case errors.Is(err, store.ErrUnreachable):
		obs.StoreErr = err
		return
	case err != nil:
		obs.SpecErr = err
	default:
		if _, verr := cs.Validate(); verr != nil {
			obs.SpecErr = fmt.Errorf("controller: %s in %s: %w", store.KeySpec, s.URL(), verr)
		} else {
			obs.Spec = &cs
			obs.DefragWindowOpen = cs.Defrag.Effective().Open(lp.now())
			v, _ := spec.ParseVersion(cs.EtcdVersion)
			if _, berr := etcdproc.FindBinaries(lp.cfg.EtcdBinDir, v); berr != nil {
				obs.SpecBinaryErr = berr
			}
		}
	}
	lp.observeRevocations(ctx, s)
	created, err := s.ReadCreated(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case errors.Is(err, store.ErrUnreachable):
		obs.StoreErr = err
	case err != nil:
		// A marker that exists but cannot be parsed still marks the cluster
		// as created: refusing to create is the safe side.
		lp.log.Warn("cluster-created marker is unreadable; treating the cluster as created", "error", err)
		obs.Created = &created
	default:
		obs.Created = &created
	}
}

// takeLock takes (or renews) the store lock while there is no cluster,
// and throughout a procedure, whose cluster comes and goes; it releases
// it otherwise. It never takes it on a store or with clocks it cannot
// trust. An error means the store cannot be read.
func (lp *loop) takeLock(ctx context.Context, s *store.Store, obs *plan.Observed, noCluster bool) error {
	obs.LockRefused = lp.lockRefused(ctx, s)
	if obs.Revoked[obs.Self.ID] {
		// A revoked node leads nothing: it sees no peer (they refuse it),
		// so it would think the cluster gone and hold the lock for ever.
		obs.LockRefused = errors.New("controller: this node is revoked")
	}
	want := obs.LockRefused == nil && (noCluster || plan.ActiveExclusive(obs.Commands) != nil)
	if !want {
		if lp.lease.Term() != 0 {
			if err := lp.lease.Release(ctx, s); err != nil {
				lp.log.Warn("cannot release the store lock; it expires with its lease", "error", err)
			}
		}
		return nil
	}
	prev := lp.lease.Term()
	term, err := lp.lease.Acquire(ctx, s)
	switch {
	case errors.Is(err, spec.ErrNewerFormat):
		obs.NewerFormat = err
	case err != nil:
		return err
	}
	obs.LockHeld = term != 0
	if term != 0 && term != prev {
		// A new term: every node it reaches refuses the older ones from
		// now on, whether this driver acts or not. A driver paused in a
		// step, which resumes, changes nothing on them.
		lp.procedures.FenceAll(ctx, *obs, term)
	}
	return nil
}

// lockRefused says why this agent may not take the store lock now, or
// nil. The store's create-if-absent is checked once (and again while the
// store cannot be reached); the clock offsets to the peers are those of
// this cycle.
func (lp *loop) lockRefused(ctx context.Context, s *store.Store) error {
	if !lp.storeChecked {
		err := lease.CheckCreateOnce(ctx, s, lp.node.ID())
		switch {
		case err == nil:
			lp.storeChecked = true
		case errors.Is(err, lease.ErrUntrustedStore):
			lp.storeChecked, lp.untrusted = true, err
		default:
			return fmt.Errorf("the store's create-if-absent is not checked yet: %w", err)
		}
	}
	if lp.untrusted != nil {
		return lp.untrusted
	}
	limit := lease.MaxClockOffset(lp.cfg.LeaderLease)
	// Stores keep modification times to the second.
	if off, storeLimit := lp.storeOffset, limit+time.Second; off > storeLimit || off < -storeLimit {
		return fmt.Errorf("controller: the backup store's clock is %s off this agent's, more than %s; leases compare clocks, so fix the clocks (NTP)",
			off.Round(time.Millisecond), storeLimit)
	}
	for id, off := range lp.offsets {
		if off > limit || off < -limit {
			return fmt.Errorf("controller: the clock of %s is %s off this agent's, more than %s (a fifth of --leader-lease); leases compare clocks, so fix the clocks (NTP)",
				id, off.Round(time.Millisecond), limit)
		}
	}
	return nil
}

// publishEvery is how often the agent publishes its record: often
// enough that a record older than a lease and this means a silent agent.
func (lp *loop) publishEvery() time.Duration {
	return min(publishInterval, lp.cfg.LeaderLease/2)
}

// publish writes this agent's record to the store, where other agents
// read what it last saw, and announces it to the discovery provider. It
// does so every publishEvery, and at once when what it reports changes.
func (lp *loop) publish(ctx context.Context, s *store.Store, self plan.Node) {
	// The installed versions let configure-cluster check a version on a
	// machine with no etcd; a change of them waits for the periodic
	// publish.
	rec := peer.Record{NodeID: self.ID, ClusterName: lp.cfg.ClusterName, Address: lp.env.PeerAddress, EtcdVersions: self.Installed,
		Etcd: &peer.EtcdReport{HasData: self.HasData, Healthy: self.Healthy, RaftLeader: self.RaftLeader, NoLeaderFor: self.NoLeaderFor}}
	if m := self.Member; m != nil {
		rec.Etcd.ClusterToken = m.ClusterToken
	}
	changed := lp.lastRecord == nil || func(a, b peer.EtcdReport) bool {
		a.NoLeaderFor, b.NoLeaderFor = 0, 0 // it grows every cycle; the periodic publish carries it
		return a != b
	}(*lp.lastRecord, *rec.Etcd)
	if lp.now().Sub(lp.lastPublish) < lp.publishEvery() && !changed {
		return
	}
	sent := time.Now().Add(testhook.Offset())
	if err := peer.PublishToStore(ctx, s, rec, lp.now()); err != nil {
		lp.log.Warn("cannot publish this agent's record to the store", "error", err)
		return
	}
	// The store's clock, from the record just written: an agent that
	// reaches no peer still measures its clock against a common one.
	if mt, err := s.ModTime(ctx, peer.DiscoveryPrefix+self.ID); err == nil {
		if off, ok := lease.ClockOffset(mt, sent, time.Now().Add(testhook.Offset()), lease.MaxClockOffset(lp.cfg.LeaderLease)); ok {
			lp.storeOffset = off
		}
	}
	if lp.cfg.Discovery != "store" {
		if err := lp.discovery.Publish(ctx, rec); err != nil {
			lp.log.Warn("cannot publish this agent for discovery", "error", err)
			return
		}
	}
	lp.lastPublish, lp.lastRecord = lp.now(), rec.Etcd
}

// records reads what every agent last published, for evidence; the error
// is set when the store did not answer for some of them, so that the
// records may be incomplete.
func (lp *loop) records(ctx context.Context, s *store.Store) ([]plan.Record, error) {
	recs, err := peer.StoreRecords(ctx, s, peer.ReadLimits{Max: lp.cfg.DiscoveryMaxRecords, Now: lp.now()})
	var unreachable error
	if err != nil {
		lp.log.Warn("some agents' records cannot be read", "error", err)
		if errors.Is(err, store.ErrUnreachable) {
			unreachable = err
		}
	}
	now := lp.now()
	out := make([]plan.Record, 0, len(recs))
	for _, r := range recs {
		pr := plan.Record{NodeID: r.NodeID, Address: r.Address, Age: now.Sub(r.Updated)}
		if r.Updated.IsZero() {
			pr.Age = time.Duration(math.MaxInt64)
		}
		if e := r.Etcd; e != nil {
			pr.ClusterToken, pr.HasData, pr.Healthy, pr.RaftLeader, pr.NoLeaderFor = e.ClusterToken, e.HasData, e.Healthy, e.RaftLeader, e.NoLeaderFor
		}
		out = append(out, pr)
	}
	return out, unreachable
}

// storedBackupReads bounds the metas noteStoredBackup reads.
const storedBackupReads = 10

// noteStoredBackup reads the newest full backup of the cluster token from
// the store, before this agent takes one because one is due: a backup
// another agent took (an earlier leader, the driver of a restore) counts
// as this agent's own, so that a change of leader, or a restore's end,
// does not start a second full backup at once. It reports whether it
// found one.
func (lp *loop) noteStoredBackup(ctx context.Context, s *store.Store, token string) bool {
	in, err := backup.Newest(ctx, s, backup.Want{Token: token, NotAfter: lp.now().Add(spec.FutureSkew), MaxReads: storedBackupReads})
	if err != nil {
		lp.log.Warn("cannot read the newest backup from the store; taking the backup that seems due", "error", err)
		return false
	}
	if in == nil {
		return false
	}
	at := time.Unix(int64(in.Meta.Timestamp), 0)
	lp.backups.Stored(at)
	lp.capture.BaseStored(at)
	return true
}

// observeRevocations reads the store's revocation list, puts it in force
// (Env.Revoked) and keeps it for the plan. A list that cannot be read,
// or does not validate, leaves the last one in force: nobody is let back
// in by a store that does not answer. A list that is gone revokes no
// one: deleting it is how a revocation is undone.
func (lp *loop) observeRevocations(ctx context.Context, s *store.Store) {
	r, err := pki.LoadStoreRevocations(ctx, s, func(err error) bool { return errors.Is(err, store.ErrNotFound) })
	if err != nil {
		if msg := err.Error(); msg != lp.revokedErr {
			lp.log.Warn("cannot use the store's revocation list; the last one read stays in force", "key", pki.StoreRevokedKey, "error", err,
				"in-force", len(lp.revoked.Nodes))
			lp.revokedErr = msg
		}
		return
	}
	lp.revokedErr = ""
	if added := r.AddedSince(lp.revoked); len(added) > 0 {
		lp.log.Warn("nodes revoked: their certificates are refused from now on", "nodes", added)
	}
	lp.revoked = r
	if lp.env.Revoked != nil {
		lp.env.Revoked(r)
	}
}
