package etcdproc

import (
	"context"
	"fmt"
	"time"

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
