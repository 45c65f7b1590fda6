package membership

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

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
	// joins, when set, receives each join's request.
	joins *[]peer.JoinRequest
}

func (r recordingNode) Join(_ context.Context, req peer.JoinRequest) error {
	*r.calls = append(*r.calls, "join "+r.id)
	if r.joins != nil {
		*r.joins = append(*r.joins, req)
	}
	return nil
}
func (r recordingNode) Leave(_ context.Context, req peer.LeaveRequest) error {
	*r.calls = append(*r.calls, "leave "+r.id)
	return nil
}
func (r recordingNode) SetVersion(context.Context, peer.VersionRequest) error   { return nil }
func (r recordingNode) SetSettings(context.Context, peer.SettingsRequest) error { return nil }
func (r recordingNode) DiscardData(context.Context, peer.DiscardRequest) error  { return nil }
func (r recordingNode) HashData(context.Context, peer.HashDataRequest) (peer.DataHash, error) {
	return peer.DataHash{}, nil
}
func (r recordingNode) Resume(context.Context, peer.ResumeRequest) error        { return nil }
func (r recordingNode) SetPeerURLs(context.Context, peer.PeerURLsRequest) error { return nil }
func (r recordingNode) SetPeerCertCheck(context.Context, peer.PeerCertCheckRequest) error {
	return nil
}
func (r recordingNode) SyncCA(context.Context, peer.CARequest) error { return nil }

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
			m := &Executor{
				Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: time.Now, SelfID: "a",
				Call: func(ctx context.Context, n plan.Node, call func(context.Context, NodeAPI) error) error {
					return call(ctx, recordingNode{id: n.ID, calls: &calls})
				},
				Creation: &fakeMarker{theirs: tt.theirs},
			}
			obs := plan.Observed{Peers: []plan.Node{{ID: "a", PeerURLs: []string{"http://a:2380"}}, {ID: "b", PeerURLs: []string{"http://b:2380"}}}}
			err := m.Create(t.Context(), obs, plan.CreateCluster{Members: []string{"a", "b"}, Version: "3.6.16", On: plan.Targets{Nodes: obs.Peers}})
			if (err != nil) != tt.wantErr || (err != nil && !strings.Contains(err.Error(), "created the cluster first")) {
				t.Fatalf("create: %v, want error %v", err, tt.wantErr)
			}
			if !slices.Equal(calls, tt.wantCall) {
				t.Errorf("calls = %q, want %q", calls, tt.wantCall)
			}
		})
	}
}

// A creation the plan says may require the node marker from the start
// has every member's etcd require it.
func TestCreateCarriesThePeerCertCheck(t *testing.T) {
	var calls []string
	var joins []peer.JoinRequest
	m := &Executor{
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: time.Now, SelfID: "a",
		Call: func(ctx context.Context, n plan.Node, call func(context.Context, NodeAPI) error) error {
			return call(ctx, recordingNode{id: n.ID, calls: &calls, joins: &joins})
		},
		Creation: &fakeMarker{},
	}
	obs := plan.Observed{Peers: []plan.Node{{ID: "a", PeerURLs: []string{"http://a:2380"}}, {ID: "b", PeerURLs: []string{"http://b:2380"}}}}
	const marker = "node.main.etcd-manager.internal"
	if err := m.Create(t.Context(), obs, plan.CreateCluster{Members: []string{"a", "b"}, Version: "3.6.16", PeerCertHostname: marker, On: plan.Targets{Nodes: obs.Peers}}); err != nil {
		t.Fatal(err)
	}
	if len(joins) != 2 {
		t.Fatalf("joins %+v", joins)
	}
	for _, j := range joins {
		if j.Member.PeerCertHostname != marker {
			t.Errorf("join of a new cluster's member requires %q of peers, want %q", j.Member.PeerCertHostname, marker)
		}
	}
}

// fakeCluster answers MemberAddAsLearner as told, and records the call.
type fakeCluster struct {
	clientv3.Cluster
	name  string
	err   error
	calls *[]string
}

func (f fakeCluster) MemberAddAsLearner(_ context.Context, peerURLs []string) (*clientv3.MemberAddResponse, error) {
	*f.calls = append(*f.calls, "add via "+f.name)
	if f.err != nil {
		return nil, f.err
	}
	return &clientv3.MemberAddResponse{Member: &etcdserverpb.Member{ID: 7, PeerURLs: peerURLs}}, nil
}

// A leader whose view of the peers went stale refuses additions as
// "unhealthy"; another started voter, never a learner or the leader
// itself, is asked in turn.
func TestAddThroughOthers(t *testing.T) {
	voters := []*etcdserverpb.Member{
		{Name: "a", ClientURLs: []string{"https://a:4001"}},
		{Name: "b", ClientURLs: []string{"https://b:4001"}, IsLearner: true},
		{Name: "c", ClientURLs: []string{"https://c:4001"}},
		{Name: "d"}, // not started: no client URL
		{Name: "e", ClientURLs: []string{"https://e:4001"}},
	}
	for _, tt := range []struct {
		name     string
		refuse   map[string]error
		unreach  map[string]bool
		wantErr  error
		wantCall []string
	}{
		{name: "the first other voter takes it", wantCall: []string{"add via c"}},
		{name: "a voter that refuses is passed over", refuse: map[string]error{"c": rpctypes.ErrUnhealthy}, wantCall: []string{"add via c", "add via e"}},
		{name: "an unreachable voter is passed over", unreach: map[string]bool{"c": true}, wantCall: []string{"add via e"}},
		{name: "all refuse: the refusal comes back", refuse: map[string]error{"c": rpctypes.ErrUnhealthy, "e": rpctypes.ErrUnhealthy},
			wantErr: rpctypes.ErrUnhealthy, wantCall: []string{"add via c", "add via e"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var calls []string
			m := &Executor{
				Log: slog.New(slog.NewTextHandler(io.Discard, nil)), SelfID: "a",
				Dial: func(endpoints []string) (clientv3.Cluster, func(), error) {
					name := strings.TrimSuffix(strings.TrimPrefix(endpoints[0], "https://"), ":4001")
					if tt.unreach[name] {
						return nil, nil, errors.New("connection refused")
					}
					return fakeCluster{name: name, err: tt.refuse[name], calls: &calls}, func() {}, nil
				},
			}
			resp, err := m.addThroughOthers(t.Context(), voters, []string{"https://new:2380"})
			if !errors.Is(err, tt.wantErr) || (err == nil && resp.Member.ID != 7) {
				t.Fatalf("addThroughOthers: %v, %+v; want error %v", err, resp, tt.wantErr)
			}
			if !isUnhealthy(err) && tt.wantErr != nil {
				t.Errorf("isUnhealthy(%v) = false", err)
			}
			if !slices.Equal(calls, tt.wantCall) {
				t.Errorf("calls = %q, want %q", calls, tt.wantCall)
			}
		})
	}
}
