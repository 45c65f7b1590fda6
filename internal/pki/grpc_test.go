package pki

import (
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ServerConfig picks its config per connection (to name the client in a
// refusal); through grpc's credentials, as the peer API uses it, a node
// still gets in, ALPN included, and nothing is reported as refused.
func TestServerConfigServesGRPC(t *testing.T) {
	now := time.Now()
	ca := mustCAAt(t, now.Add(-time.Hour))
	srv, cli := NodeFiles{Dir: t.TempDir()}, NodeFiles{Dir: t.TempDir()}
	for _, f := range []NodeFiles{srv, cli} {
		if _, _, err := EnsureNodeCert(ca, nil, f, nodeReq(time.Hour), now); err != nil {
			t.Fatal(err)
		}
	}
	var refused []error
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(ServerConfig(srv, TrustPool(ca.Pool()), func(_ net.Addr, err error) { refused = append(refused, err) }))))
	healthpb.RegisterHealthServer(s, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(NodeClientConfig(cli, TrustPool(ca.Pool()), ""))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := healthpb.NewHealthClient(cc).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("a node's call over grpc: %v", err)
	}
	if len(refused) != 0 {
		t.Errorf("refusals reported for an accepted node: %v", refused)
	}
}
