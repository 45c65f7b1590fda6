package node

import (
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

func TestListenPeerURLs(t *testing.T) {
	tests := []struct {
		name   string
		listen []string
		served []string
		want   []string
	}{
		{name: "not set binds the served URLs", served: []string{"https://10.0.0.1:2380"}},
		{name: "set", listen: []string{"https://0.0.0.0:2380"}, served: []string{"https://10.0.0.1:2380"}, want: []string{"https://0.0.0.0:2380"}},
		{name: "served over http during a switch to TLS", listen: []string{"https://0.0.0.0:2380"}, served: []string{"http://10.0.0.1:2380"}, want: []string{"http://0.0.0.0:2380"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &Node{cfg: Config{ListenPeerURLs: tt.listen}}
			if got := n.listenPeerURLs(tt.served); strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("listenPeerURLs(%v) = %v, want %v", tt.served, got, tt.want)
			}
		})
	}
}

// A node refuses a procedure's call of a term older than one it obeyed,
// and remembers the term across restarts; calls outside a procedure
// (term 0) are not fenced.
func TestNodeRefusesOlderTerms(t *testing.T) {
	layout := etcdproc.Layout{Root: t.TempDir()}
	st, err := LoadState(layout, "", []string{"http://127.0.0.1:2380"})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	n := New(Config{DataDir: layout.Root}, layout, st, nil, log, time.Now, func() {})
	ctx := t.Context()
	calls := []struct {
		term  int64
		stale bool
	}{{5, false}, {5, false}, {3, true}, {0, false}, {7, false}, {6, true}}
	for _, c := range calls {
		err := n.Leave(ctx, peer.LeaveRequest{Term: c.term, Token: "tok"})
		if got := errors.Is(err, peer.ErrStaleTerm); got != c.stale {
			t.Fatalf("Leave under term %d: %v; stale = %v, want %v", c.term, err, got, c.stale)
		}
	}
	for _, call := range []func() error{
		func() error { return n.Quarantine(ctx, peer.QuarantineRequest{Term: 6, Token: "tok"}) },
		func() error { return n.Restore(ctx, peer.RestoreRequest{Term: 6, Backup: "b"}) },
		func() error { return n.Recover(ctx, peer.RecoverRequest{Term: 6, Token: "tok"}) },
	} {
		if err := call(); !errors.Is(err, peer.ErrStaleTerm) {
			t.Errorf("a call under term 6 after term 7: %v, want ErrStaleTerm", err)
		}
	}
	// A new driver fences the node before it calls it.
	if err := n.Fence(ctx, peer.FenceRequest{Term: 10}); err != nil {
		t.Fatal(err)
	}
	if err := n.Leave(ctx, peer.LeaveRequest{Term: 9, Token: "tok"}); !errors.Is(err, peer.ErrStaleTerm) {
		t.Errorf("a call under term 9 after a fence of 10: %v, want ErrStaleTerm", err)
	}
	// A term beyond any agent's, obeyed, would refuse every later driver.
	for _, term := range []int64{spec.MaxTerm + 1, math.MaxInt64, -3} {
		if err := n.Fence(ctx, peer.FenceRequest{Term: term}); err == nil || !strings.Contains(err.Error(), "no agent takes such a term") {
			t.Errorf("a fence of term %d: %v", term, err)
		}
	}
	if n.ObeyedTerm() != 10 {
		t.Errorf("ObeyedTerm = %d, want 10", n.ObeyedTerm())
	}
	again, err := LoadState(layout, "", nil)
	if err != nil || again.ObeyedTerm != 10 {
		t.Fatalf("obeyed term on disk: %d, %v; want 10", again.ObeyedTerm, err)
	}
}

// etcd's initial corruption check runs on a restart only while another
// member's etcd serves its peer port, and always on a new member.
func TestInitialCheckUseful(t *testing.T) {
	serving := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/members" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`[]`))
	}))
	defer serving.Close()
	down := "http://127.0.0.1:1" // nothing listens on port 1
	self := "http://127.0.0.1:2"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tests := []struct {
		name string
		m    etcdproc.MemberState
		want bool
	}{
		{"a new member", etcdproc.MemberState{InitialCluster: "a=" + self + ",b=" + down}, true},
		{"a restart with a peer serving", etcdproc.MemberState{HasRun: true, InitialCluster: "a=" + self + ",b=" + down + ",c=" + serving.URL}, true},
		{"a restart with no peer serving", etcdproc.MemberState{HasRun: true, InitialCluster: "a=" + self + ",b=" + down}, false},
		{"a restart of the only member", etcdproc.MemberState{HasRun: true, InitialCluster: "a=" + self}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &Node{cfg: Config{PeerURLs: []string{self}}, log: log, state: etcdproc.State{NodeID: "a"}}
			if got := n.initialCheckUseful(&tt.m); got != tt.want {
				t.Fatalf("initialCheckUseful = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestAwaitEarlierMembers(t *testing.T) {
	serving := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`[]`))
	}))
	defer serving.Close()
	// starting: bound, as a new etcd's peer port is while it asks its
	// peers, but answering nothing.
	starting, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer starting.Close()
	startingURL := "http://" + starting.Addr().String()
	down := "http://127.0.0.1:1"
	const limit = 300 * time.Millisecond
	tests := []struct {
		name    string
		initial string
		waits   bool // for the whole limit
	}{
		{"earlier members serve", "a=" + serving.URL + ",b=" + serving.URL + ",c=http://self", false},
		{"only later members, one starting", "c=http://self,d=" + startingURL + ",e=" + down, false},
		{"an earlier member starting", "a=" + serving.URL + ",b=" + startingURL + ",c=http://self", true},
		{"an earlier member not started", "a=" + down + ",c=http://self", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			awaitEarlierMembers(t.Context(), http.DefaultClient, tt.initial, "c", limit)
			waited := time.Since(start)
			if tt.waits && waited < limit {
				t.Fatalf("returned after %v, want a wait of %v for the earlier member", waited, limit)
			}
			if !tt.waits && waited >= limit {
				t.Fatalf("waited %v, want no wait", waited)
			}
		})
	}
}

// A member whose restored data is gone is never restored again under the
// same member ID: its peers may have seen its log. One whose etcd never
// ran on it may be.
func TestRestoreRefusesAmnesia(t *testing.T) {
	tests := []struct {
		name   string
		hasRun bool
		refuse bool
	}{
		{name: "ran on the restored data, now gone", hasRun: true, refuse: true},
		{name: "never ran", hasRun: false, refuse: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			layout := etcdproc.Layout{Root: t.TempDir()}
			st, err := LoadState(layout, "a", []string{"http://127.0.0.1:2380"})
			if err != nil {
				t.Fatal(err)
			}
			st.Member = &etcdproc.MemberState{ClusterToken: "restored-1", EtcdVersion: "3.6.16", HasRun: tt.hasRun}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			n := New(Config{DataDir: layout.Root, EtcdBinDir: t.TempDir()}, layout, st, nil, log, time.Now, func() {})
			err = n.Restore(t.Context(), peer.RestoreRequest{Term: 3, Backup: "b",
				Member: etcdproc.MemberState{ClusterToken: "restored-1", EtcdVersion: "3.6.16"}})
			if err == nil {
				t.Fatal("Restore succeeded without binaries or a backup store")
			}
			if got := strings.Contains(err.Error(), "may not come back under the same member ID"); got != tt.refuse {
				t.Errorf("Restore: %v; refused as amnesia = %v, want %v", err, got, tt.refuse)
			}
		})
	}
}
