package operatorapi_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/operatorapi"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// calls records what reached the handlers.
type calls struct {
	mu   sync.Mutex
	seen []string
}

func (c *calls) add(s string) { c.mu.Lock(); c.seen = append(c.seen, s); c.mu.Unlock() }
func (c *calls) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.seen, " ")
}

// node stands in for the node's handler: only the calls the test makes.
type node struct {
	peer.Handler
	c *calls
}

func (n node) Info(context.Context) (peer.NodeInfo, error) {
	n.c.add("Info")
	return peer.NodeInfo{NodeID: "main-0"}, nil
}
func (n node) Leave(context.Context, peer.LeaveRequest) error     { n.c.add("Leave"); return nil }
func (n node) Recover(context.Context, peer.RecoverRequest) error { n.c.add("Recover"); return nil }
func (n node) Fence(context.Context, peer.FenceRequest) error     { n.c.add("Fence"); return nil }
func (n node) Restore(context.Context, peer.RestoreRequest) error { n.c.add("Restore"); return nil }
func (n node) SetPeerCertCheck(context.Context, peer.PeerCertCheckRequest) error {
	n.c.add("SetPeerCertCheck")
	return nil
}

// ops is a handler that records and answers, and refuses what it is told.
type ops struct {
	c      *calls
	refuse error
}

func (o ops) Spec(context.Context) (operatorapi.SpecReply, error) {
	o.c.add("Spec")
	return operatorapi.SpecReply{Spec: &spec.ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16", EtcdSettings: spec.Settings{"snapshot-count": "5000"}}}, o.refuse
}
func (o ops) WriteSpec(_ context.Context, r operatorapi.WriteSpecRequest) error {
	o.c.add("WriteSpec(" + r.Spec.String() + ";" + r.Owner.String() + ")")
	return o.refuse
}
func (o ops) Queue(_ context.Context, r operatorapi.QueueRequest) (string, error) {
	o.c.add(fmt.Sprintf("Queue(%v,%s)", r.BackupNow, r.RestoreBackup))
	return "2026-12-02T00:00:00Z-000001", o.refuse
}
func (o ops) Commands(context.Context) ([]cli.CommandRow, error) {
	o.c.add("Commands")
	return []cli.CommandRow{{ID: "x", Kind: "backup-now"}}, o.refuse
}
func (o ops) Backups(context.Context) ([]cli.BackupRow, error) {
	o.c.add("Backups")
	return []cli.BackupRow{{Name: "b", Revision: 7}}, o.refuse
}
func (o ops) MoveLeader(_ context.Context, to uint64) error {
	o.c.add(fmt.Sprintf("MoveLeader(%x)", to))
	return o.refuse
}

type server struct {
	ca   *pki.CA
	addr string
	node *calls
	ops  *calls
}

func serve(t *testing.T, refuse error) server {
	t.Helper()
	now := time.Now()
	ca, err := pki.GenerateCA(now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	files := pki.NodeFiles{Dir: t.TempDir()}
	req := pki.CertRequest{CommonName: "main-0", Role: pki.RoleNode, DNSNames: []string{pki.NodeMarker("main")}, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: time.Hour}
	if _, _, err := pki.EnsureNodeCert(ca, nil, files, req, now); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := server{ca: ca, addr: l.Addr().String(), node: &calls{}, ops: &calls{}}
	srv := peer.NewServer(credentials.NewTLS(pki.ServerConfig(files, pki.TrustPool(ca.Pool()), nil)), "main", node{c: s.node})
	operatorapi.Register(srv, "main", ops{c: s.ops, refuse: refuse})
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return s
}

// dial connects as the holder of a certificate the CA issues for req.
func (s server) dial(t *testing.T, req pki.CertRequest) *peer.Client {
	t.Helper()
	certPEM, keyPEM, err := s.ca.Issue(req, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(s.ca.Cert)
	c, err := peer.Dial(s.addr, "main", credentials.NewTLS(pki.AgentClientConfig(pair, pool, pki.NodeMarker("main"))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func operatorCert(cluster string) pki.CertRequest {
	return pki.CertRequest{CommonName: "etcd-manager-operator", Role: pki.RoleOperator, DNSNames: []string{pki.OperatorMarker(cluster)}, Validity: time.Hour}
}

// The operator's certificate makes the operator's calls, which carry
// their messages whole, and none of a node's; no other certificate makes
// the operator's.
func TestOperatorCallsAuthorized(t *testing.T) {
	s := serve(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	pc := s.dial(t, operatorCert("main"))
	oc := operatorapi.NewClient(pc.Conn(), "main-0", "main")
	rep, err := oc.Spec(ctx)
	if err != nil || rep.Spec == nil || rep.Spec.EtcdSettings["snapshot-count"] != "5000" {
		t.Fatalf("Spec: %+v, %v", rep, err)
	}
	want := spec.ClusterSpec{MemberCount: 5, EtcdVersion: "3.6.16", OrdinalMembers: true, AutoCompactionMode: "revision", AutoCompactionRetention: "1000",
		EtcdSettings: spec.Settings{"snapshot-count": "5000"}, Defrag: &spec.DefragPolicy{Window: "0 3 * * *"}}
	if err := oc.WriteSpec(ctx, operatorapi.WriteSpecRequest{Spec: want, Owner: spec.ClusterOwner{Kind: "EtcdCluster", Namespace: "db", Name: "main"}}); err != nil {
		t.Fatalf("WriteSpec: %v", err)
	}
	if id, err := oc.Queue(ctx, operatorapi.QueueRequest{BackupNow: true}); err != nil || id == "" {
		t.Fatalf("Queue: %q, %v", id, err)
	}
	if _, err := oc.Queue(ctx, operatorapi.QueueRequest{BackupNow: true, RestoreBackup: "b"}); !errors.Is(err, operatorapi.ErrRefused) {
		t.Errorf("a queue of two commands: %v, want ErrRefused", err)
	}
	if rows, err := oc.Commands(ctx); err != nil || len(rows) != 1 {
		t.Errorf("Commands: %v, %v", rows, err)
	}
	if rows, err := oc.Backups(ctx); err != nil || len(rows) != 1 || rows[0].Revision != 7 {
		t.Errorf("Backups: %v, %v", rows, err)
	}
	if err := oc.MoveLeader(ctx, 0xabc); err != nil {
		t.Errorf("MoveLeader: %v", err)
	}
	if _, err := pc.Info(ctx); err != nil {
		t.Errorf("Info: %v", err)
	}
	for name, err := range map[string]error{
		"Leave":            pc.Leave(ctx, peer.LeaveRequest{Token: "tok"}),
		"Recover":          pc.Recover(ctx, peer.RecoverRequest{Token: "tok"}),
		"Fence":            pc.Fence(ctx, peer.FenceRequest{Term: 9}),
		"Restore":          pc.Restore(ctx, peer.RestoreRequest{Backup: "b"}),
		"SetPeerCertCheck": pc.SetPeerCertCheck(ctx, peer.PeerCertCheckRequest{Token: "tok"}),
	} {
		if status.Code(errors.Unwrap(err)) != codes.PermissionDenied && status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s with the operator's certificate: %v, want PermissionDenied", name, err)
		}
	}
	if got, want := s.ops.String(), "Spec WriteSpec("+want.String()+";EtcdCluster db/main) Queue(true,) Commands Backups MoveLeader(abc)"; got != want {
		t.Errorf("the operator's handler saw\n%s\nwant\n%s", got, want)
	}

	for name, req := range map[string]pki.CertRequest{
		"a node certificate":                {CommonName: "main-1", Role: pki.RoleNode, DNSNames: []string{pki.NodeMarker("main")}, Validity: time.Hour},
		"a client certificate":              {CommonName: "etcd-manager-operator", Role: pki.RoleClient, Validity: time.Hour},
		"an operator certificate elsewhere": operatorCert("other"),
		"an operator certificate unmarked":  {CommonName: "etcd-manager-operator", Role: pki.RoleOperator, Validity: time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			oc := operatorapi.NewClient(s.dial(t, req).Conn(), "main-0", "main")
			if err := oc.WriteSpec(ctx, operatorapi.WriteSpecRequest{Spec: want}); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
				t.Errorf("WriteSpec: %v, want PermissionDenied", err)
			}
			if _, err := oc.Spec(ctx); err == nil {
				t.Error("Spec was answered")
			}
		})
	}
	if got := s.ops.String(); strings.Count(got, "WriteSpec") != 1 {
		t.Errorf("a refused caller reached the handler: %s", got)
	}
	if got := s.node.String(); got != "Info" {
		t.Errorf("the node's handler saw %q, want only the operator's Info", got)
	}
}

// A handler's refusals come back as the errors they are, so that the
// operator tells a store in use from an agent that cannot be reached.
func TestOperatorCallsRefusals(t *testing.T) {
	for _, want := range []error{operatorapi.ErrStoreInUse, operatorapi.ErrRefused, operatorapi.ErrNotNow} {
		s := serve(t, fmt.Errorf("%w: because", want))
		oc := operatorapi.NewClient(s.dial(t, operatorCert("main")).Conn(), "main-0", "main")
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := oc.WriteSpec(ctx, operatorapi.WriteSpecRequest{Spec: spec.ClusterSpec{MemberCount: 1, EtcdVersion: "3.6.16"}})
		cancel()
		if !errors.Is(err, want) || !strings.Contains(err.Error(), "because") {
			t.Errorf("refused with %v: got %v", want, err)
		}
	}
	s := serve(t, errors.New("store: unreachable"))
	oc := operatorapi.NewClient(s.dial(t, operatorCert("main")).Conn(), "main-0", "main")
	_, err := oc.Backups(t.Context())
	if err == nil || errors.Is(err, operatorapi.ErrRefused) || errors.Is(err, operatorapi.ErrStoreInUse) || errors.Is(err, operatorapi.ErrNotNow) {
		t.Errorf("an unreachable store: %v, want a plain error the operator retries elsewhere", err)
	}
}
