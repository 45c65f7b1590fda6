package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/node"
	"github.com/etcd-manager/etcd-manager/internal/operatorapi"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/storeops"
)

// operatorCalls carries out the Kubernetes operator's calls (package
// operatorapi) with the agent's own store credentials. It opens the store
// once, on the first call, apart from the loop's.
type operatorCalls struct {
	a *Agent
	n *node.Node

	mu    sync.Mutex
	store *store.Store
}

var _ operatorapi.Handler = (*operatorCalls)(nil)

// operatorCallTimeout bounds one call's work on the store or etcd; the
// operator's own deadline is usually shorter.
const operatorCallTimeout = 30 * time.Second

func (o *operatorCalls) open(ctx context.Context) (*store.Store, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.store != nil {
		return o.store, nil
	}
	s, err := store.Open(ctx, o.a.cfg.BackupStore, store.Options{Create: true})
	if err != nil {
		return nil, err
	}
	o.store = s
	return s, nil
}

func (o *operatorCalls) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.store != nil {
		_ = o.store.Close()
		o.store = nil
	}
}

// opError maps the store operations' refusals to the API's.
func opError(err error) error {
	switch {
	case errors.Is(err, storeops.ErrStoreInUse):
		return fmt.Errorf("%w: %w", operatorapi.ErrStoreInUse, err)
	case errors.Is(err, storeops.ErrRefused):
		return fmt.Errorf("%w: %w", operatorapi.ErrRefused, err)
	}
	return err
}

func (o *operatorCalls) Spec(ctx context.Context) (operatorapi.SpecReply, error) {
	ctx, cancel := context.WithTimeout(ctx, operatorCallTimeout)
	defer cancel()
	s, err := o.open(ctx)
	if err != nil {
		return operatorapi.SpecReply{}, err
	}
	var rep operatorapi.SpecReply
	switch cs, err := s.ReadSpec(ctx); {
	case err == nil:
		rep.Spec = &cs
		if _, verr := cs.Validate(); verr != nil {
			rep.Invalid = verr.Error()
		}
	case errors.Is(err, store.ErrNotFound):
	case errors.Is(err, store.ErrUnreachable):
		return rep, err
	default:
		// Unparsable: the agents ignore it.
		rep.Invalid = err.Error()
	}
	switch owner, err := s.ReadOwner(ctx); {
	case err == nil:
		rep.Owner = &owner
	case errors.Is(err, store.ErrNotFound):
	case errors.Is(err, store.ErrUnreachable):
		return rep, err
	default:
		// An owner record that cannot be read owns the store all the
		// same: only a take-over replaces it.
		rep.Owner = &spec.ClusterOwner{Kind: "unreadable", Name: err.Error()}
	}
	switch _, err := s.ReadCreated(ctx); {
	case err == nil:
		rep.Created = true
	case errors.Is(err, store.ErrUnreachable):
		return rep, err
	case !errors.Is(err, store.ErrNotFound):
		rep.Created = true // a damaged marker still marks the cluster created
	}
	return rep, nil
}

func (o *operatorCalls) WriteSpec(ctx context.Context, req operatorapi.WriteSpecRequest) error {
	ctx, cancel := context.WithTimeout(ctx, operatorCallTimeout)
	defer cancel()
	s, err := o.open(ctx)
	if err != nil {
		return err
	}
	if err := storeops.WriteOwnedSpec(ctx, s, req.Spec, req.Owner, storeops.Claim{TakeOver: req.TakeOver, Unowned: req.Unowned}); err != nil {
		return opError(err)
	}
	o.a.log.Info("cluster spec written for the operator", "spec", req.Spec.String(), "owner", req.Owner.String())
	o.a.poke()
	return nil
}

func (o *operatorCalls) Queue(ctx context.Context, req operatorapi.QueueRequest) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, operatorCallTimeout)
	defer cancel()
	s, err := o.open(ctx)
	if err != nil {
		return "", err
	}
	var id string
	if req.BackupNow {
		id, err = s.AddCommand(ctx, spec.Command{BackupNow: &spec.BackupNowCommand{}}, o.a.now())
	} else {
		id, err = storeops.QueueRestore(ctx, s, req.RestoreBackup, o.a.now())
	}
	if err != nil {
		return "", opError(err)
	}
	o.a.log.Info("command queued for the operator", "command", id)
	o.a.poke()
	return id, nil
}

func (o *operatorCalls) Commands(ctx context.Context) ([]cli.CommandRow, error) {
	ctx, cancel := context.WithTimeout(ctx, operatorCallTimeout)
	defer cancel()
	s, err := o.open(ctx)
	if err != nil {
		return nil, err
	}
	return storeops.CommandRows(ctx, s)
}

func (o *operatorCalls) Backups(ctx context.Context) ([]cli.BackupRow, error) {
	ctx, cancel := context.WithTimeout(ctx, operatorCallTimeout)
	defer cancel()
	s, err := o.open(ctx)
	if err != nil {
		return nil, err
	}
	return storeops.BackupRows(ctx, s, o.a.now())
}

// MoveLeader asks the local etcd, which must lead, to hand raft leadership
// to the member to.
func (o *operatorCalls) MoveLeader(ctx context.Context, to uint64) error {
	info, _ := o.n.Info(ctx)
	if info.Member == nil || len(info.ClientURLs) == 0 {
		return fmt.Errorf("%w: this agent's etcd is no member", operatorapi.ErrNotNow)
	}
	c, err := etcdproc.NewClient(info.ClientURLs[:1], o.a.etcdTLS)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, etcdproc.CallTimeout)
	defer cancel()
	if _, err := c.MoveLeader(ctx, to); err != nil {
		if errors.Is(err, rpctypes.ErrNotLeader) || errors.Is(err, rpctypes.ErrGRPCNotLeader) {
			return fmt.Errorf("%w: this agent's etcd does not lead", operatorapi.ErrNotNow)
		}
		return fmt.Errorf("agent: move leadership to %x: %w", to, err)
	}
	o.a.log.Info("raft leadership handed on for the operator", "to", fmt.Sprintf("%x", to))
	return nil
}
