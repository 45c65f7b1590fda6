package peer

import (
	"context"
	"crypto/tls"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/pki"
)

// The peer API grants node powers by the role in the certificate's
// organization, never by its name: an operator's certificate named as a
// node, or as the node marker would read, reads status and nothing more.
// (issue-client-cert sets the common name only; the organization is
// always the client role.)
func TestPeerAPIAuthorizesByRoleNotName(t *testing.T) {
	a := newAuthServer(t)
	addr, rec := a.serve(t, time.Time{})
	dial := func(t *testing.T, req pki.CertRequest) *Client { return a.dial(t, addr, req) }
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, cn := range []string{"n1", "etcd-manager-node", "harness"} {
		t.Run("operator certificate named "+cn, func(t *testing.T) {
			c := dial(t, pki.CertRequest{CommonName: cn, Role: pki.RoleClient, Validity: time.Hour})
			if _, err := c.Info(ctx); err != nil {
				t.Fatalf("Info: %v", err)
			}
			calls := map[string]error{
				"Join":             c.Join(ctx, JoinRequest{LeaderID: "x", Member: etcdproc.MemberState{ClusterToken: "tok"}}),
				"SetPeerCertCheck": c.SetPeerCertCheck(ctx, PeerCertCheckRequest{Token: "tok"}),
				"Leave":            c.Leave(ctx, LeaveRequest{Token: "tok"}),
			}
			for name, err := range calls {
				if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "is not a node certificate") {
					t.Errorf("%s: %v, want PermissionDenied", name, err)
				}
			}
		})
	}
	t.Run("a node certificate", func(t *testing.T) {
		c := dial(t, pki.CertRequest{CommonName: "n2", Role: pki.RoleNode, DNSNames: []string{pki.NodeMarker("main")}, Validity: time.Hour})
		if err := c.SetPeerCertCheck(ctx, PeerCertCheckRequest{LeaderID: "n2", Token: "tok", Hostname: pki.NodeMarker("main")}); err != nil {
			t.Fatalf("SetPeerCertCheck: %v", err)
		}
	})
	if got := strings.Join(rec.calls, " "); strings.Count(got, "Info()") != 3 || !strings.HasSuffix(got, "SetPeerCertCheck(tok,node.main.etcd-manager.internal)") ||
		strings.Contains(got, "Join") || strings.Contains(got, "Leave") {
		t.Errorf("the handler saw %q; only the operators' Info and the node's call should reach it", got)
	}
}

// A node certificate of another cluster that shares the CA, one issued
// before markers existed, or one whose name is not the node the request
// says makes it, changes nothing: PermissionDenied, and the handler never
// runs. Another cluster's node certificate does not read Info either.
func TestPeerAPIBindsCallsToTheCluster(t *testing.T) {
	a := newAuthServer(t)
	now := a.now
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	calls := func(c *Client, leader string) map[string]error {
		return map[string]error{
			"Leave":            c.Leave(ctx, LeaveRequest{LeaderID: leader, Token: "tok"}),
			"Restore":          c.Restore(ctx, RestoreRequest{LeaderID: leader, Member: etcdproc.MemberState{ClusterToken: "tok"}}),
			"Recover":          c.Recover(ctx, RecoverRequest{LeaderID: leader, Token: "tok"}),
			"Fence":            c.Fence(ctx, FenceRequest{LeaderID: leader, Term: 1}),
			"SetPeerCertCheck": c.SetPeerCertCheck(ctx, PeerCertCheckRequest{LeaderID: leader, Token: "tok"}),
		}
	}
	unmarked := pki.CertRequest{CommonName: "n2", Role: pki.RoleNode, DNSNames: []string{"localhost"}, Validity: time.Hour}
	for _, tt := range []struct {
		name, want string
		req        pki.CertRequest
		leader     string
		until      time.Time
		info       bool // Info is read
	}{
		{name: "another cluster's node", want: "another cluster (node.other.etcd-manager.internal)",
			req: pki.CertRequest{CommonName: "n2", Role: pki.RoleNode, DNSNames: []string{pki.NodeMarker("other")}, Validity: time.Hour}, leader: "n2"},
		{name: "a node certificate from before markers", want: "carries no cluster marker", req: unmarked, leader: "n2", info: true},
		{name: "one from before markers, past the time allowed", want: "carries no cluster marker", req: unmarked, leader: "n2", until: now.Add(-time.Minute), info: true},
		{name: "a node of this cluster calling as another", want: `says node "n3" makes it, but comes with the certificate of node "n2"`,
			req: pki.CertRequest{CommonName: "n2", Role: pki.RoleNode, DNSNames: []string{pki.NodeMarker("main")}, Validity: time.Hour}, leader: "n3", info: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr, rec := a.serve(t, tt.until)
			c := a.dial(t, addr, tt.req)
			for name, err := range calls(c, tt.leader) {
				if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("%s: %v, want PermissionDenied saying %q", name, err, tt.want)
				}
			}
			_, err := c.Info(ctx)
			if tt.info != (err == nil) {
				t.Errorf("Info: %v, want it read: %v", err, tt.info)
			}
			if want := map[bool]string{true: "Info()", false: ""}[tt.info]; strings.Join(rec.calls, " ") != want {
				t.Errorf("the handler saw %q, want %q", strings.Join(rec.calls, " "), want)
			}
		})
	}
	t.Run("one from before markers, within the time allowed", func(t *testing.T) {
		addr, rec := a.serve(t, now.Add(time.Hour))
		c := a.dial(t, addr, unmarked)
		if err := c.SetPeerCertCheck(ctx, PeerCertCheckRequest{LeaderID: "n2", Token: "tok"}); err != nil {
			t.Errorf("SetPeerCertCheck: %v", err)
		}
		if err := c.SetPeerCertCheck(ctx, PeerCertCheckRequest{LeaderID: "n1", Token: "tok"}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("SetPeerCertCheck as another node: %v, want PermissionDenied", err)
		}
		if got := strings.Join(rec.calls, " "); got != "SetPeerCertCheck(tok,)" {
			t.Errorf("the handler saw %q", got)
		}
	})
}

// Two clusters named alike on one CA keep different stores: a node
// certificate that carries the other store's marker is refused on every
// call, Info included; one of this store's is served; one from before
// store markers makes a node's calls only within the time allowed, and
// still reads Info.
func TestPeerAPIBindsCallsToTheStore(t *testing.T) {
	a := newAuthServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ours, theirs := pki.StoreMarker("0123456789abcdef"), pki.StoreMarker("fedcba9876543210")
	cert := func(names ...string) pki.CertRequest {
		return pki.CertRequest{CommonName: "n2", Role: pki.RoleNode, DNSNames: append([]string{pki.NodeMarker("main")}, names...), Validity: time.Hour}
	}
	for _, tt := range []struct {
		name  string
		req   pki.CertRequest
		until time.Time
		want  string // "" for served
		info  bool
	}{
		{name: "this store's node", req: cert(ours), info: true},
		{name: "a node of the cluster named alike", req: cert(theirs), want: "a cluster named alike that keeps another backup store"},
		{name: "a node certificate from before store markers", req: cert(), want: "carries this cluster's marker but not its store's", info: true},
		{name: "the same within the time allowed", req: cert(), until: a.now.Add(time.Hour), info: true},
		{name: "a node of the cluster named alike within the time allowed (a move to another store)", req: cert(theirs), until: a.now.Add(time.Hour), info: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr, rec := a.serveWith(t, func(s *Server) { s.BindToStore(ours); s.AcceptUnmarkedUntil(tt.until) })
			c := a.dial(t, addr, tt.req)
			for name, err := range map[string]error{
				"Leave": c.Leave(ctx, LeaveRequest{LeaderID: "n2", Token: "tok"}),
				"Fence": c.Fence(ctx, FenceRequest{LeaderID: "n2", Term: 1}),
			} {
				switch {
				case tt.want == "" && err != nil:
					t.Errorf("%s: %v, want it served", name, err)
				case tt.want != "" && (status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tt.want)):
					t.Errorf("%s: %v, want PermissionDenied saying %q", name, err, tt.want)
				}
			}
			if _, err := c.Info(ctx); tt.info != (err == nil) {
				t.Errorf("Info: %v, want it read: %v", err, tt.info)
			}
			if tt.want != "" && strings.Contains(strings.Join(rec.calls, " "), "Leave") {
				t.Errorf("the handler saw %q", rec.calls)
			}
		})
	}
}

// A revoked node's certificate, and any certificate whose serial the
// list names, is refused on every call, Info included, and the handler
// never runs; the list is read at each call, so a revocation holds at
// once, and another node of the cluster is still served.
func TestPeerAPIRefusesRevokedCertificates(t *testing.T) {
	a := newAuthServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	marked := func(cn string) pki.CertRequest {
		return pki.CertRequest{CommonName: cn, Role: pki.RoleNode, DNSNames: []string{pki.NodeMarker("main")}, Validity: time.Hour}
	}
	listed := pki.CertRequest{CommonName: "ops", Role: pki.RoleClient, Serial: big.NewInt(0xabc123), Validity: time.Hour}
	set := &pki.RevocationSet{}
	addr, rec := a.serveWith(t, func(s *Server) { s.RefuseRevoked(set) })
	n2, n3, ops := a.dial(t, addr, marked("n2")), a.dial(t, addr, marked("n3")), a.dial(t, addr, listed)
	if _, err := n2.Info(ctx); err != nil {
		t.Fatalf("Info before the revocation: %v", err)
	}
	set.Set(pki.Revocations{Nodes: []pki.RevokedNode{{NodeID: "n2", RevokedAt: a.now}, {NodeID: "gone", RevokedAt: a.now, Serials: []string{"abc123"}}}})
	rec.calls = nil
	for _, tt := range []struct {
		name string
		c    *Client
		want string
	}{
		{"the revoked node", n2, "node n2 is revoked"},
		{"a listed serial", ops, "(serial abc123) is revoked with node gone"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.c.Info(ctx)
			errs := map[string]error{
				"Info":  err,
				"Leave": tt.c.Leave(ctx, LeaveRequest{LeaderID: "n2", Token: "tok"}),
				"Fence": tt.c.Fence(ctx, FenceRequest{LeaderID: "n2", Term: 1}),
			}
			for name, err := range errs {
				if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("%s: %v, want PermissionDenied saying %q", name, err, tt.want)
				}
			}
		})
	}
	if len(rec.calls) != 0 {
		t.Errorf("the handler saw %q from revoked certificates", rec.calls)
	}
	if _, err := n3.Info(ctx); err != nil {
		t.Errorf("Info from a node not revoked: %v", err)
	}
}

// authServer is a peer API server of cluster "main" over TLS, with a node
// certificate "n1" from a CA of its own, for the authorization tests.
type authServer struct {
	ca    *pki.CA
	files pki.NodeFiles
	now   time.Time
}

func newAuthServer(t *testing.T) authServer {
	t.Helper()
	now := time.Now()
	ca, err := pki.GenerateCA(now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	files := pki.NodeFiles{Dir: t.TempDir()}
	req := pki.CertRequest{CommonName: "n1", Role: pki.RoleNode, DNSNames: []string{"localhost", pki.NodeMarker("main")},
		IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: time.Hour}
	if _, _, err := pki.EnsureNodeCert(ca, nil, files, req, now); err != nil {
		t.Fatal(err)
	}
	return authServer{ca: ca, files: files, now: now}
}

// serve starts a server on loopback, node certificates without a marker
// passing until unmarkedUntil, and returns its address and what its
// handler saw.
func (a authServer) serve(t *testing.T, unmarkedUntil time.Time) (string, *recorder) {
	t.Helper()
	return a.serveWith(t, func(s *Server) { s.AcceptUnmarkedUntil(unmarkedUntil) })
}

// serveWith starts a server on loopback, set up by setup before it
// serves, and returns its address and what its handler saw.
func (a authServer) serveWith(t *testing.T, setup func(*Server)) (string, *recorder) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := NewServer(credentials.NewTLS(pki.ServerConfig(a.files, pki.TrustPool(a.ca.Pool()), nil)), "main", rec)
	setup(srv)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return l.Addr().String(), rec
}

// dial calls addr with a certificate of req from the server's CA. The
// server's own certificate is checked as any TLS client does (the
// agents' own check of its marker is not under test here).
func (a authServer) dial(t *testing.T, addr string, req pki.CertRequest) *Client {
	t.Helper()
	certPEM, keyPEM, err := a.ca.Issue(req, nil, a.now)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg := pki.StaticClientConfig(pair, a.ca.Pool())
	cfg.ServerName = "localhost"
	c, err := Dial(addr, "main", credentials.NewTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
