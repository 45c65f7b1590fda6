package etcdproc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The bounds on the etcd calls the agents make again and again, declared
// once here.
const (
	// StatusTimeout bounds one member's Status: the member answers from
	// memory, so a member that takes longer is as good as down.
	StatusTimeout = 2 * time.Second
	// HashKVTimeout bounds one member's HashKV: etcd reads and hashes its
	// whole keyspace, about a second per GiB.
	HashKVTimeout = 2 * time.Minute
	// CallTimeout bounds any other call the agents make on etcd (member
	// changes, leadership moves, alarms): a call that hangs (leadership
	// moving mid-call) must never stall the loop.
	CallTimeout = 10 * time.Second
	// CompactTimeout bounds a compaction to the head, which waits for
	// each member to free the history physically.
	CompactTimeout = 2 * time.Minute
)

// Statuser is the part of an etcd client AskStatus needs.
type Statuser interface {
	Status(ctx context.Context, endpoint string) (*clientv3.StatusResponse, error)
}

// AskStatus asks the member at endpoint for its status, within
// StatusTimeout.
func AskStatus(ctx context.Context, c Statuser, endpoint string) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, StatusTimeout)
	defer cancel()
	return c.Status(ctx, endpoint)
}

// HashKVer is the part of an etcd client a HashKV call needs.
type HashKVer interface {
	HashKV(ctx context.Context, endpoint string, rev int64) (*clientv3.HashKVResponse, error)
}

// HashKV asks the member at endpoint for the hash of its keyspace at rev,
// within HashKVTimeout. A rev of 0 or less is an error: etcd would hash
// whatever revision the member is at, which no caller means to compare.
func HashKV(ctx context.Context, c HashKVer, endpoint string, rev int64) (*clientv3.HashKVResponse, error) {
	if rev <= 0 {
		return nil, fmt.Errorf("etcdproc: HashKV of %s: no revision to read it at", endpoint)
	}
	ctx, cancel := context.WithTimeout(ctx, HashKVTimeout)
	defer cancel()
	return c.HashKV(ctx, endpoint, rev)
}

// Compacter compacts etcd's history.
type Compacter interface {
	Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error)
}

// CompactToHead compacts etcd's history to the revision endpoint's member
// is at, physically, and returns it; a history already compacted that far
// is no error.
func CompactToHead(ctx context.Context, st Statuser, c Compacter, endpoint string) (int64, error) {
	s, err := AskStatus(ctx, st, endpoint)
	if err != nil {
		return 0, fmt.Errorf("etcdproc: etcd status: %w", err)
	}
	head := s.Header.Revision
	ctx, cancel := context.WithTimeout(ctx, CompactTimeout)
	defer cancel()
	if _, err := c.Compact(ctx, head, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return head, fmt.Errorf("etcdproc: compact to %d: %w", head, err)
	}
	return head, nil
}
