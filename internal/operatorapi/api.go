package operatorapi

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Errors a Client returns, besides transport ones. Check them with
// errors.Is.
var (
	// ErrStoreInUse means the store holds another cluster's spec.
	ErrStoreInUse = errors.New("operatorapi: the store belongs to another cluster")
	// ErrRefused means the agent refused the request, and would refuse
	// it again: an invalid spec, a backup that cannot be restored.
	ErrRefused = errors.New("operatorapi: refused")
	// ErrNotNow means the agent cannot do it now, such as handing on a
	// leadership its etcd does not hold.
	ErrNotNow = errors.New("operatorapi: not now")
)

// SpecRequest asks for the store's spec and owner.
type SpecRequest struct {
	ClusterName string `json:"clusterName"`
}

// SpecReply is the store's spec, nil when it has none, and its owner.
type SpecReply struct {
	Spec *spec.ClusterSpec `json:"spec,omitempty"`
	// Invalid says why the agents refuse the store's spec, when they do:
	// they change nothing until it is replaced.
	Invalid string `json:"invalid,omitempty"`
	// Owner is the store's owner record, nil when it has none.
	Owner *spec.ClusterOwner `json:"owner,omitempty"`
	// Created says the store holds the creation marker.
	Created bool `json:"created,omitempty"`
}

// WriteSpecRequest writes the whole spec for Owner.
type WriteSpecRequest struct {
	ClusterName string            `json:"clusterName"`
	Spec        spec.ClusterSpec  `json:"spec"`
	Owner       spec.ClusterOwner `json:"owner"`
	// TakeOver replaces another owner's record; Unowned owns a store
	// whose spec has no owner record (see storeops.Claim).
	TakeOver bool `json:"takeOver,omitempty"`
	Unowned  bool `json:"unowned,omitempty"`
}

// QueueRequest queues one command: a backup now, or a restore of a named
// backup. Nothing else is taken from the operator.
type QueueRequest struct {
	ClusterName string `json:"clusterName"`
	BackupNow   bool   `json:"backupNow,omitempty"`
	// RestoreBackup names the backup to restore, which the agent checks
	// first.
	RestoreBackup string `json:"restoreBackup,omitempty"`
}

// QueueReply is the queued command's ID.
type QueueReply struct {
	ID string `json:"id"`
}

// ListRequest asks for the command queue or the backups.
type ListRequest struct {
	ClusterName string `json:"clusterName"`
}

// CommandsReply is the command queue as list-commands shows it.
type CommandsReply struct {
	Commands []cli.CommandRow `json:"commands"`
}

// BackupsReply is the backups as list-backups shows them, oldest first.
type BackupsReply struct {
	Backups []cli.BackupRow `json:"backups"`
}

// MoveLeaderRequest has the agent whose etcd leads hand raft leadership
// to the member of ID To.
type MoveLeaderRequest struct {
	ClusterName string `json:"clusterName"`
	To          uint64 `json:"to"`
}

// Handler is what an agent does for the operator's calls. Calls come on
// gRPC goroutines. A handler's errors wrap ErrStoreInUse, ErrRefused or
// ErrNotNow where those apply.
type Handler interface {
	Spec(ctx context.Context) (SpecReply, error)
	WriteSpec(ctx context.Context, req WriteSpecRequest) error
	Queue(ctx context.Context, req QueueRequest) (string, error)
	Commands(ctx context.Context) ([]cli.CommandRow, error)
	Backups(ctx context.Context) ([]cli.BackupRow, error)
	MoveLeader(ctx context.Context, to uint64) error
}

const serviceName = "etcdmanager.operator.v1.Operator"

// Register serves h's calls on the agent's peer API server, for the
// cluster clusterName.
func Register(s *peer.Server, clusterName string, h Handler) {
	check := func(ctx context.Context, name string) error {
		if name != clusterName {
			return status.Errorf(codes.PermissionDenied, "operatorapi: this agent serves cluster %q, not %q", clusterName, name)
		}
		return authorize(ctx, clusterName)
	}
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "Spec", Handler: unary(func(ctx context.Context, r *SpecRequest) (any, error) {
				if err := check(ctx, r.ClusterName); err != nil {
					return nil, err
				}
				rep, err := h.Spec(ctx)
				return &rep, toStatus(err)
			})},
			{MethodName: "WriteSpec", Handler: unary(func(ctx context.Context, r *WriteSpecRequest) (any, error) {
				if err := check(ctx, r.ClusterName); err != nil {
					return nil, err
				}
				return &peer.Empty{}, toStatus(h.WriteSpec(ctx, *r))
			})},
			{MethodName: "Queue", Handler: unary(func(ctx context.Context, r *QueueRequest) (any, error) {
				if err := check(ctx, r.ClusterName); err != nil {
					return nil, err
				}
				if r.BackupNow == (r.RestoreBackup != "") {
					return nil, status.Error(codes.InvalidArgument, "operatorapi: queue one command: a backup now or a restore")
				}
				id, err := h.Queue(ctx, *r)
				return &QueueReply{ID: id}, toStatus(err)
			})},
			{MethodName: "Commands", Handler: unary(func(ctx context.Context, r *ListRequest) (any, error) {
				if err := check(ctx, r.ClusterName); err != nil {
					return nil, err
				}
				rows, err := h.Commands(ctx)
				return &CommandsReply{Commands: rows}, toStatus(err)
			})},
			{MethodName: "Backups", Handler: unary(func(ctx context.Context, r *ListRequest) (any, error) {
				if err := check(ctx, r.ClusterName); err != nil {
					return nil, err
				}
				rows, err := h.Backups(ctx)
				return &BackupsReply{Backups: rows}, toStatus(err)
			})},
			{MethodName: "MoveLeader", Handler: unary(func(ctx context.Context, r *MoveLeaderRequest) (any, error) {
				if err := check(ctx, r.ClusterName); err != nil {
					return nil, err
				}
				return &peer.Empty{}, toStatus(h.MoveLeader(ctx, r.To))
			})},
		},
	}, h)
}

func unary[Req any](fn func(context.Context, *Req) (any, error)) grpc.MethodHandler {
	return func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		req := new(Req)
		if err := dec(req); err != nil {
			return nil, err
		}
		return fn(ctx, req)
	}
}

// authorize takes a call over TLS only from an operator certificate for
// this cluster; the certificate itself was verified in the handshake.
// Plaintext (--insecure) has no identities to check.
func authorize(ctx context.Context, clusterName string) error {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	certs := info.State.PeerCertificates
	if len(certs) == 0 || !pki.CarriesOperatorMarker(certs[0], clusterName) {
		name := ""
		if len(certs) > 0 {
			name = certs[0].Subject.CommonName
		}
		return status.Errorf(codes.PermissionDenied, "operatorapi: %q is not an operator certificate for cluster %q; only the operator may make these calls", name, clusterName)
	}
	return nil
}

// toStatus carries a handler's error as a status the client maps back.
func toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrStoreInUse):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, ErrRefused):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrNotNow):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

// fromStatus maps a call's status back to the package's errors.
func fromStatus(what, target string, err error) error {
	if err == nil {
		return nil
	}
	var kind error
	switch status.Code(err) {
	case codes.AlreadyExists:
		kind = ErrStoreInUse
	case codes.InvalidArgument:
		kind = ErrRefused
	case codes.FailedPrecondition:
		kind = ErrNotNow
	}
	if kind == nil {
		return fmt.Errorf("operatorapi: %s on %s: %w", what, target, err)
	}
	return fmt.Errorf("%w: %s on %s: %s", kind, what, target, status.Convert(err).Message())
}

// Client makes the operator's calls on one agent, over a connection it
// shares with the agent's peer API (see peer.Client.Conn).
type Client struct {
	conn        grpc.ClientConnInterface
	target      string
	clusterName string
}

// NewClient returns a client for the agent at the end of conn.
func NewClient(conn grpc.ClientConnInterface, target, clusterName string) *Client {
	return &Client{conn: conn, target: target, clusterName: clusterName}
}

func (c *Client) invoke(ctx context.Context, method string, req, reply any) error {
	err := c.conn.Invoke(ctx, "/"+serviceName+"/"+method, req, reply, grpc.CallContentSubtype(peer.CodecName))
	return fromStatus(method, c.target, err)
}

// Spec reads the store's spec and owner.
func (c *Client) Spec(ctx context.Context) (SpecReply, error) {
	var rep SpecReply
	return rep, c.invoke(ctx, "Spec", &SpecRequest{ClusterName: c.clusterName}, &rep)
}

// WriteSpec writes the store's spec.
func (c *Client) WriteSpec(ctx context.Context, req WriteSpecRequest) error {
	req.ClusterName = c.clusterName
	return c.invoke(ctx, "WriteSpec", &req, &peer.Empty{})
}

// Queue queues a command and returns its ID.
func (c *Client) Queue(ctx context.Context, req QueueRequest) (string, error) {
	req.ClusterName = c.clusterName
	var rep QueueReply
	if err := c.invoke(ctx, "Queue", &req, &rep); err != nil {
		return "", err
	}
	if rep.ID == "" || len(rep.ID) > 128 {
		return "", fmt.Errorf("operatorapi: queue on %s: the agent answered %s, not a command ID", c.target, spec.QuoteShort(rep.ID))
	}
	return rep.ID, nil
}

// Commands reads the command queue.
func (c *Client) Commands(ctx context.Context) ([]cli.CommandRow, error) {
	var rep CommandsReply
	return rep.Commands, c.invoke(ctx, "Commands", &ListRequest{ClusterName: c.clusterName}, &rep)
}

// Backups lists the backups, oldest first.
func (c *Client) Backups(ctx context.Context) ([]cli.BackupRow, error) {
	var rep BackupsReply
	return rep.Backups, c.invoke(ctx, "Backups", &ListRequest{ClusterName: c.clusterName}, &rep)
}

// MoveLeader hands raft leadership from the agent's etcd to member to.
func (c *Client) MoveLeader(ctx context.Context, to uint64) error {
	return c.invoke(ctx, "MoveLeader", &MoveLeaderRequest{ClusterName: c.clusterName, To: to}, &peer.Empty{})
}
