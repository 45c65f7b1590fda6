package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// fakeMarker is a creation marker whose create reports it exists already,
// written with the token of the first create (a retry of a write that did
// succeed) or with another creator's.
type fakeMarker struct {
	theirs string // the marker's token if another creator won; "" for ours
	token  string
}

func (f *fakeMarker) Term() int64                         { return 1 }
func (f *fakeMarker) Hold(context.Context) (int64, error) { return 1, nil }
func (f *fakeMarker) CreateCreated(_ context.Context, c spec.ClusterCreated) error {
	f.token = c.ClusterToken
	return fmt.Errorf("%w: control/etcd-cluster-created", store.ErrExists)
}
func (f *fakeMarker) ReadCreated(context.Context) (spec.ClusterCreated, error) {
	if f.theirs != "" {
		return spec.ClusterCreated{ClusterToken: f.theirs}, nil
	}
	return spec.ClusterCreated{ClusterToken: f.token}, nil
}

// recordingNode records the calls made on nodes.
type recordingNode struct {
	id    string
	calls *[]string
}

func (r recordingNode) Join(_ context.Context, req peer.JoinRequest) error {
	*r.calls = append(*r.calls, "join "+r.id)
	return nil
}
func (r recordingNode) Leave(_ context.Context, req peer.LeaveRequest) error {
	*r.calls = append(*r.calls, "leave "+r.id)
	return nil
}
func (r recordingNode) SetVersion(context.Context, peer.VersionRequest) error   { return nil }
func (r recordingNode) SetPeerURLs(context.Context, peer.PeerURLsRequest) error { return nil }

// The creation marker already there is checked against its token: our
// own (an SDK retry of a write that did succeed) is success; another
// creator's rolls the creation back.
func TestCreateChecksTheMarkersToken(t *testing.T) {
	for _, tt := range []struct {
		name     string
		theirs   string
		wantErr  bool
		wantCall []string
	}{
		{name: "our own marker", wantCall: []string{"join a", "join b"}},
		{name: "another creator's", theirs: "other-token", wantErr: true, wantCall: []string{"join a", "join b", "leave a", "leave b"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var calls []string
			m := &members{
				log: slog.New(slog.NewTextHandler(io.Discard, nil)), now: time.Now, selfID: "a",
				call: func(ctx context.Context, n plan.Node, call func(context.Context, memberAPI) error) error {
					return call(ctx, recordingNode{id: n.ID, calls: &calls})
				},
				creation: &fakeMarker{theirs: tt.theirs},
			}
			obs := plan.Observed{Peers: []plan.Node{{ID: "a", PeerURLs: []string{"http://a:2380"}}, {ID: "b", PeerURLs: []string{"http://b:2380"}}}}
			err := m.create(t.Context(), obs, plan.CreateCluster{Members: []string{"a", "b"}, Version: "3.6.16"})
			if (err != nil) != tt.wantErr || (err != nil && !strings.Contains(err.Error(), "created the cluster first")) {
				t.Fatalf("create: %v, want error %v", err, tt.wantErr)
			}
			if !slices.Equal(calls, tt.wantCall) {
				t.Errorf("calls = %q, want %q", calls, tt.wantCall)
			}
		})
	}
}
