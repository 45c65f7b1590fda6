package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"os"
	"testing"
	"time"
)

// Node certificates carry the cluster's node marker, which etcd's peer
// port requires; no other certificate Issue signs can carry it, nor any
// name under the reserved domain, in any spelling.
func TestNodeMarkerOnlyInNodeCertificates(t *testing.T) {
	ca := mustCA(t)
	marker := NodeMarker("main")
	if marker != "node.main.etcd-manager.internal" {
		t.Fatalf("NodeMarker(main) = %q", marker)
	}
	node := nodeReq(time.Hour)
	node.DNSNames = append(node.DNSNames, marker)
	certPEM, _, err := ca.Issue(node, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := ParseCertPEM(certPEM)
	if !CarriesName(c, marker) {
		t.Errorf("a node certificate issued with the marker does not pass etcd's hostname check for it: DNS names %v", c.DNSNames)
	}
	if CarriesName(c, NodeMarker("events")) {
		t.Error("a node certificate of cluster main passes the check of cluster events")
	}

	plain, _, err := ca.Issue(CertRequest{CommonName: "etcd-manager-client", Role: RoleClient, Validity: time.Hour}, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	pc, _ := ParseCertPEM(plain)
	if CarriesName(pc, marker) || len(pc.DNSNames) != 0 || len(pc.IPAddresses) != 0 {
		t.Errorf("an operator's certificate carries names %v %v", pc.DNSNames, pc.IPAddresses)
	}

	for _, tt := range []struct{ name, cn, dns string }{
		{"the marker as a DNS name", "etcd-manager-client", marker},
		{"the marker as the common name", marker, ""},
		{"in capitals, with a trailing dot", "ops", "NODE.Main.ETCD-MANAGER.internal."},
		{"a wildcard under the domain", "ops", "*.main.etcd-manager.internal"},
		{"the domain itself", "etcd-manager.internal", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := CertRequest{CommonName: tt.cn, Role: RoleClient, Validity: time.Hour}
			if tt.dns != "" {
				req.DNSNames = []string{tt.dns}
			}
			if _, _, err := ca.Issue(req, nil, t0); !errors.Is(err, ErrReservedName) {
				t.Errorf("Issue of a client certificate: %v, want ErrReservedName", err)
			}
		})
	}
	for _, name := range []string{"etcd-manager-client", "node.main.etcd-manager.internal.example.com", "etcd-manager.internals"} {
		if IsReservedName(name) {
			t.Errorf("IsReservedName(%q) = true", name)
		}
	}
}

// etcd's check matches SANs only: a certificate whose common name is the
// marker (signed by hand with the CA key, as Issue refuses it) does not
// pass.
func TestCarriesNameIgnoresTheCommonName(t *testing.T) {
	ca := mustCA(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := newSerial()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: NodeMarker("main"), Organization: []string{RoleClient}},
		NotBefore:    t0, NotAfter: t0.Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	if CarriesName(c, NodeMarker("main")) {
		t.Error("a certificate with the marker as its common name only passes the check")
	}
}

// A node certificate from before the marker is reissued with it at the
// agent's start (its names changed), and each renewal keeps it.
func TestEnsureNodeCertAddsAndKeepsTheMarker(t *testing.T) {
	ca := mustCA(t)
	f := NodeFiles{Dir: t.TempDir()}
	old := nodeReq(30 * time.Minute)
	if _, _, err := EnsureNodeCert(ca, nil, f, old, t0); err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(f.Key())
	marked := old
	marked.DNSNames = append([]string{NodeMarker("main")}, old.DNSNames...)
	c, fresh, err := EnsureNodeCert(ca, nil, f, marked, t0.Add(time.Minute))
	if err != nil || !fresh || !CarriesName(c, NodeMarker("main")) {
		t.Fatalf("upgrade: fresh=%v, names %v, %v; want a new certificate with the marker", fresh, c.DNSNames, err)
	}
	if _, fresh, err = EnsureNodeCert(ca, nil, f, marked, t0.Add(2*time.Minute)); err != nil || fresh {
		t.Fatalf("a marked certificate was reissued before it was due: fresh=%v, %v", fresh, err)
	}
	for i, at := range []time.Time{t0.Add(22 * time.Minute), t0.Add(43 * time.Minute)} {
		c, fresh, err = EnsureNodeCert(ca, nil, f, marked, at)
		if err != nil || !fresh {
			t.Fatalf("renewal %d: fresh=%v, %v", i+1, fresh, err)
		}
		if !CarriesName(c, NodeMarker("main")) {
			t.Fatalf("renewal %d dropped the marker: %v", i+1, c.DNSNames)
		}
	}
	if k, _ := os.ReadFile(f.Key()); string(k) != string(key) {
		t.Error("adding the marker replaced the key")
	}
}

// Only an operator certificate carries the operator marker, and it
// carries no other reserved name: it never passes for a node, nor for
// the operator of another cluster.
func TestOperatorMarker(t *testing.T) {
	ca := mustCA(t)
	t0 := time.Now()
	crt, _, err := ca.Issue(CertRequest{CommonName: "etcd-manager-operator", Role: RoleOperator, DNSNames: []string{OperatorMarker("main")}, Validity: time.Hour}, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := ParseCertPEM(crt)
	if !CarriesOperatorMarker(c, "main") || CarriesOperatorMarker(c, "events") || CarriesName(c, NodeMarker("main")) || PeerRole(c) != RoleOperator {
		t.Errorf("operator certificate: marker for main %v, for events %v, node marker %v, role %q",
			CarriesOperatorMarker(c, "main"), CarriesOperatorMarker(c, "events"), CarriesName(c, NodeMarker("main")), PeerRole(c))
	}
	for _, tt := range []struct {
		name string
		req  CertRequest
	}{
		{"a client certificate with the operator marker", CertRequest{CommonName: "x", Role: RoleClient, DNSNames: []string{OperatorMarker("main")}}},
		{"an operator certificate with the node marker", CertRequest{CommonName: "x", Role: RoleOperator, DNSNames: []string{NodeMarker("main")}}},
		{"an operator certificate with a wildcard", CertRequest{CommonName: "x", Role: RoleOperator, DNSNames: []string{"operator.*.etcd-manager.internal"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Validity = time.Hour
			if _, _, err := ca.Issue(tt.req, nil, t0); !errors.Is(err, ErrReservedName) {
				t.Errorf("Issue: %v, want ErrReservedName", err)
			}
		})
	}
	// A node certificate with the operator marker is no operator's.
	nc, _, err := ca.Issue(CertRequest{CommonName: "n", Role: RoleNode, DNSNames: []string{OperatorMarker("main")}, Validity: time.Hour}, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := ParseCertPEM(nc); CarriesOperatorMarker(n, "main") {
		t.Error("a node certificate passes as the operator's")
	}
}
