package controller

import (
	"context"
	"fmt"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// compact runs one compaction check when one is due, on the agent that
// leads etcd.
func (lp *loop) compact(ctx context.Context, obs plan.Observed) {
	lead := obs.Cluster != nil && obs.Self.Member != nil && !obs.Self.Member.Quarantined && lp.client != nil
	lp.compaction.Tend(ctx, obs, lead, etcdCompaction{lp}, lp.capture)
}

// etcdCompaction compacts through the loop's client to its own etcd.
type etcdCompaction struct{ lp *loop }

func (e etcdCompaction) Status(ctx context.Context) (int64, int64, error) {
	resp, err := etcdproc.MemberStatusOf(ctx, e.lp.client, e.lp.clientEndpoint)
	if err != nil {
		return 0, 0, fmt.Errorf("controller: etcd status: %w", err)
	}
	// Compaction frees pages for reuse; only a defragmentation shrinks
	// the file, so the bytes in use are what compaction can help.
	inUse := resp.DbSizeInUse
	if inUse == 0 {
		inUse = resp.DbSize
	}
	return resp.Header.Revision, inUse, nil
}

func (e etcdCompaction) Compact(ctx context.Context, rev int64) error {
	if _, err := e.lp.client.Compact(ctx, rev); err != nil {
		return fmt.Errorf("controller: compact to %d: %w", rev, err)
	}
	return nil
}
