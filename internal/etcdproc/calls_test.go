package etcdproc

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// boundRecorder records the deadline each call was given.
type boundRecorder struct {
	calls    int
	deadline time.Duration
}

func (r *boundRecorder) record(ctx context.Context) {
	r.calls++
	if d, ok := ctx.Deadline(); ok {
		r.deadline = time.Until(d)
	}
}

func (r *boundRecorder) Status(ctx context.Context, _ string) (*clientv3.StatusResponse, error) {
	r.record(ctx)
	return &clientv3.StatusResponse{}, nil
}

func (r *boundRecorder) HashKV(ctx context.Context, _ string, _ int64) (*clientv3.HashKVResponse, error) {
	r.record(ctx)
	return &clientv3.HashKVResponse{}, nil
}

func TestCallsAreBounded(t *testing.T) {
	tests := []struct {
		name      string
		call      func(context.Context, *boundRecorder) error
		wantCalls int
		wantBound time.Duration
		wantErr   bool
	}{
		{"status", func(ctx context.Context, r *boundRecorder) error {
			_, err := AskStatus(ctx, r, "https://127.0.0.1:1")
			return err
		}, 1, StatusTimeout, false},
		{"hashkv", func(ctx context.Context, r *boundRecorder) error {
			_, err := HashKV(ctx, r, "https://127.0.0.1:1", 7)
			return err
		}, 1, HashKVTimeout, false},
		{"hashkv at no revision is refused before the call", func(ctx context.Context, r *boundRecorder) error {
			_, err := HashKV(ctx, r, "https://127.0.0.1:1", 0)
			return err
		}, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &boundRecorder{}
			err := tt.call(context.Background(), r)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if r.calls != tt.wantCalls {
				t.Fatalf("calls = %d, want %d", r.calls, tt.wantCalls)
			}
			if tt.wantCalls > 0 && (r.deadline > tt.wantBound || r.deadline < tt.wantBound-time.Second) {
				t.Fatalf("the call had %v left, want about %v", r.deadline, tt.wantBound)
			}
		})
	}
}

// headEtcd is a member at revision head whose compaction answers err.
type headEtcd struct {
	head      int64
	err       error
	compacted int64
	physical  bool
}

func (h *headEtcd) Status(context.Context, string) (*clientv3.StatusResponse, error) {
	return &clientv3.StatusResponse{Header: &etcdserverpb.ResponseHeader{Revision: h.head}}, nil
}

func (h *headEtcd) Compact(_ context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	h.compacted = rev
	h.physical = len(opts) == 1 // WithCompactPhysical, the only option asked for
	return &clientv3.CompactResponse{}, h.err
}

// A compaction to the head compacts physically to the member's revision;
// one already compacted that far is done.
func TestCompactToHead(t *testing.T) {
	tests := []struct {
		name    string
		err     error
		wantErr bool
	}{
		{name: "compacted", err: nil},
		{name: "compacted already", err: rpctypes.ErrCompacted},
		{name: "refused", err: errors.New("etcdserver: request timed out"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &headEtcd{head: 42, err: tt.err}
			got, err := CompactToHead(t.Context(), h, h, "http://127.0.0.1:2379")
			if (err != nil) != tt.wantErr || got != 42 || h.compacted != 42 || !h.physical {
				t.Errorf("CompactToHead = %d, %v; compacted to %d physically %v", got, err, h.compacted, h.physical)
			}
		})
	}
}
