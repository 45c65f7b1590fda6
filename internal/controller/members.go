package controller

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/membership"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// newMembers returns the membership executor of loop lp.
func newMembers(lp *loop) *membership.Executor {
	return &membership.Executor{
		Log:    lp.log,
		Now:    lp.now,
		SelfID: lp.node.ID(),
		Etcd: func() (membership.LeaderEtcd, string) {
			if lp.client == nil {
				return nil, ""
			}
			return lp.client, lp.clientEndpoint
		},
		Self: lp.node.Member,
		Call: func(ctx context.Context, n plan.Node, call func(context.Context, membership.NodeAPI) error) error {
			api, err := lp.callee(n)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(ctx, membership.CallTimeout)
			defer cancel()
			return call(ctx, api)
		},
		Creation: loopCreation{lp},
		Dial: func(endpoints []string) (clientv3.Cluster, func(), error) {
			c, err := etcdproc.NewClient(endpoints, lp.env.EtcdTLS)
			if err != nil {
				return nil, nil, err
			}
			return c, func() { _ = c.Close() }, nil
		},
	}
}

// loopCreation writes the creation marker in the loop's store.
type loopCreation struct{ lp *loop }

func (c loopCreation) Term() int64 { return c.lp.lease.Term() }

func (c loopCreation) Hold(ctx context.Context) (int64, error) { return c.lp.lease.Hold(ctx) }

func (c loopCreation) CreateCreated(ctx context.Context, m spec.ClusterCreated) error {
	s, err := c.lp.openStore(ctx)
	if err != nil {
		return err
	}
	return s.CreateCreated(ctx, m)
}

func (c loopCreation) ReadCreated(ctx context.Context) (spec.ClusterCreated, error) {
	s, err := c.lp.openStore(ctx)
	if err != nil {
		return spec.ClusterCreated{}, err
	}
	return s.ReadCreated(ctx)
}
