package peer

import (
	"context"
	"crypto/tls"
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
	now := time.Now()
	ca, err := pki.GenerateCA(now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srvFiles := pki.NodeFiles{Dir: t.TempDir()}
	nodeReq := pki.CertRequest{CommonName: "n1", Role: pki.RoleNode, DNSNames: []string{"localhost", pki.NodeMarker("main")},
		IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: time.Hour}
	if _, _, err := pki.EnsureNodeCert(ca, nil, srvFiles, nodeReq, now); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := NewServer(credentials.NewTLS(pki.ServerConfig(srvFiles, pki.TrustPool(ca.Pool()), nil)), "main", rec)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)

	dial := func(t *testing.T, req pki.CertRequest) *Client {
		t.Helper()
		certPEM, keyPEM, err := ca.Issue(req, nil, now)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg := pki.StaticClientConfig(pair, ca.Pool())
		cfg.ServerName = "localhost"
		c, err := Dial(l.Addr().String(), "main", credentials.NewTLS(cfg))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
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
		if err := c.SetPeerCertCheck(ctx, PeerCertCheckRequest{Token: "tok", Hostname: pki.NodeMarker("main")}); err != nil {
			t.Fatalf("SetPeerCertCheck: %v", err)
		}
	})
	if got := strings.Join(rec.calls, " "); strings.Count(got, "Info()") != 3 || !strings.HasSuffix(got, "SetPeerCertCheck(tok,node.main.etcd-manager.internal)") ||
		strings.Contains(got, "Join") || strings.Contains(got, "Leave") {
		t.Errorf("the handler saw %q; only the operators' Info and the node's call should reach it", got)
	}
}
