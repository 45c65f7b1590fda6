package controller

import (
	"context"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/history"
	"github.com/etcd-manager/etcd-manager/internal/maintenance"
	"github.com/etcd-manager/etcd-manager/internal/membership"
	"github.com/etcd-manager/etcd-manager/internal/node"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/procedure"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Call makes one bounded call on a node for a procedure: this agent's
// own node, or a peer over the peer API.
func (lp *loop) Call(ctx context.Context, n plan.Node, timeout time.Duration, call func(context.Context, procedure.NodeAPI) error) error {
	api, err := lp.callee(n)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return call(ctx, api)
}

// nodeAPI is every call the leader makes on a node: this agent's own
// (*node.Node) and a peer's (*peer.Client) serve the same calls.
type nodeAPI interface {
	procedure.NodeAPI
	membership.NodeAPI
	maintenance.Member
}

// callee is node n's calls: this agent's own node, or a client of the
// peer's.
func (lp *loop) callee(n plan.Node) (nodeAPI, error) {
	if n.ID == lp.node.ID() {
		return lp.node, nil
	}
	return lp.peerClient(n.Address)
}

// storeRecords are the procedure runner's records: command statuses in
// the loop's store.
type storeRecords struct{ lp *loop }

func (r storeRecords) SetCommandStatus(ctx context.Context, id string, term int64, st spec.CommandStatus, now time.Time) error {
	s, err := r.lp.openStore(ctx)
	if err != nil {
		return err
	}
	return s.SetCommandStatusAt(ctx, id, term, st, now)
}

func (r storeRecords) CreateChoice(ctx context.Context, id string, c spec.Choice) (spec.Choice, error) {
	s, err := r.lp.openStore(ctx)
	if err != nil {
		return c, err
	}
	return s.CreateChoice(ctx, id, c)
}

func (r storeRecords) DeleteCommand(ctx context.Context, id string) error {
	s, err := r.lp.openStore(ctx)
	if err != nil {
		return err
	}
	return s.DeleteCommand(ctx, id)
}

// procedureBackups are the backups procedures read and take, through the
// loop's store and backup taker.
type procedureBackups struct{ lp *loop }

func (b procedureBackups) Validate(ctx context.Context, name string, p spec.RestorePoint) (procedure.Validated, error) {
	s, err := b.lp.openStore(ctx)
	if err != nil {
		return procedure.Validated{}, err
	}
	dir, err := node.TempDir(b.lp.cfg.DataDir, "validate-")
	if err != nil {
		return procedure.Validated{}, err
	}
	defer os.RemoveAll(dir)
	opts := b.lp.cfg.fetchOptions(b.lp.backups.Status, b.lp.env.Keys)
	opts.Meter = b.lp.env.Transfers
	got, err := history.Fetch(ctx, s, name, p, dir, opts, b.lp.log)
	v := procedure.Validated{Meta: got.Meta, Keys: got.Keys, Forward: got.Forward, Digest: got.Digest}
	if st, serr := os.Stat(got.Path); err == nil && serr == nil {
		v.Size = st.Size()
	}
	return v, err
}

func (b procedureBackups) Fits(meta backup.Meta, name string) error {
	return b.lp.cfg.fetchOptions(b.lp.backups.Status, b.lp.env.Keys).Fits(b.lp.cfg.DataDir, meta, name)
}

func (b procedureBackups) RecordBranch(ctx context.Context, br changelog.Branch) error {
	s, err := b.lp.openStore(ctx)
	if err != nil {
		return err
	}
	return changelog.WriteBranch(ctx, s, br)
}

func (b procedureBackups) Take(ctx context.Context, from procedure.Source, kind, reason string) (backup.Info, error) {
	s, err := b.lp.openStore(ctx)
	if err != nil {
		return backup.Info{}, err
	}
	return b.lp.backups.Take(ctx, s, backup.Request{
		Client:       clientv3.Config{DialTimeout: 5 * time.Second, TLS: b.lp.env.EtcdTLS},
		Endpoint:     from.Endpoint,
		TempDir:      filepath.Join(b.lp.cfg.DataDir, "tmp"),
		EtcdVersion:  from.EtcdVersion,
		ClusterSpec:  from.Spec,
		ClusterToken: from.ClusterToken,
		Kind:         kind,
	}, 0, reason)
}
