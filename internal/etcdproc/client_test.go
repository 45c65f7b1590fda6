package etcdproc

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
)

// The buffers gRPC reads messages into fit them: a snapshot chunk (32 KiB
// of data and its header) takes a 64 KiB buffer, not gRPC's default 1 MiB,
// which was cleared whole for every chunk.
func TestBufferPoolFitsMessages(t *testing.T) {
	for _, tt := range []struct{ size, maxCap int }{
		{100, 256},
		{4 << 10, 4 << 10},
		{32<<10 + 40, 64 << 10}, // a snapshot chunk
		{300 << 10, 512 << 10},
	} {
		b := mem.DefaultBufferPool().Get(tt.size)
		if len(*b) != tt.size || cap(*b) > tt.maxCap {
			t.Errorf("a %d-byte message got a buffer of %d bytes (capacity %d), want at most %d", tt.size, len(*b), cap(*b), tt.maxCap)
		}
		mem.DefaultBufferPool().Put(b)
	}
}

// PeerMembers reads etcd's peer-port member list, and refuses what no
// etcd sends: a failed request, a body that does not parse, or one too
// large.
func TestPeerMembers(t *testing.T) {
	list := `[{"id":9029009101211547941,"peerURLs":["https://127.0.0.1:2380"],"name":"a","clientURLs":["https://127.0.0.1:4001"]},` +
		`{"id":2,"peerURLs":["https://127.0.0.2:2380"],"isLearner":true}]`
	for _, tt := range []struct {
		name   string
		status int
		body   string
		want   []PeerMember
		err    string
	}{
		{name: "a list", status: 200, body: list, want: []PeerMember{
			{ID: 9029009101211547941, Name: "a", PeerURLs: []string{"https://127.0.0.1:2380"}},
			{ID: 2, PeerURLs: []string{"https://127.0.0.2:2380"}, IsLearner: true}}},
		{name: "an error status", status: 500, body: "no", err: "500"},
		{name: "not JSON", status: 200, body: "<html>", err: "invalid character"},
		{name: "too large", status: 200, body: "[" + strings.Repeat(" ", maxPeerMembersBytes) + "]", err: "over"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The server offers HTTP/2, as a Go server does; etcd's peer
			// port answers HTTP/1.1 only, so the client must not take it.
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/members" || r.ProtoMajor != 1 {
					http.Error(w, "bad request", http.StatusBadRequest)
					return
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}))
			srv.EnableHTTP2 = true
			srv.StartTLS()
			defer srv.Close()
			hc := NewPeerHTTPClient(srv.Client().Transport.(*http.Transport).TLSClientConfig)
			got, err := PeerMembers(t.Context(), hc, srv.URL)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one with %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for i := range got {
				g, w := got[i], tt.want[i]
				if g.ID != w.ID || g.Name != w.Name || g.IsLearner != w.IsLearner || strings.Join(g.PeerURLs, ",") != strings.Join(w.PeerURLs, ",") {
					t.Errorf("member %d = %+v, want %+v", i, g, w)
				}
			}
		})
	}
}
