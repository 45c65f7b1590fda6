package harness

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/pki"
)

// TLSFiles are PEM files for a test's etcd: a CA, a server certificate for
// loopback addresses, and a client certificate.
type TLSFiles struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
}

// NewTLSFiles makes a fresh CA and certificates under dir, with package
// pki. The server certificate is valid for ips and localhost, as server
// and as client (etcd's peers dial each other with it).
func NewTLSFiles(t testing.TB, dir string, ips ...string) TLSFiles {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca, err := pki.GenerateCA(now.Add(-time.Hour), 25*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []net.IP
	for _, ip := range ips {
		addrs = append(addrs, net.ParseIP(ip))
	}
	srvCert, srvKey, err := ca.Issue(pki.CertRequest{CommonName: "etcd-server", Role: pki.RoleNode,
		DNSNames: []string{"localhost"}, IPs: addrs, Validity: 24 * time.Hour}, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	cliCert, cliKey, err := ca.Issue(pki.CertRequest{CommonName: "backup-client", Role: pki.RoleClient, Validity: 24 * time.Hour}, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	f := TLSFiles{
		CA:         filepath.Join(dir, "ca.crt"),
		ServerCert: filepath.Join(dir, "server.crt"), ServerKey: filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"), ClientKey: filepath.Join(dir, "client.key"),
	}
	for path, data := range map[string][]byte{f.CA: ca.CertPEM, f.ServerCert: srvCert, f.ServerKey: srvKey, f.ClientCert: cliCert, f.ClientKey: cliKey} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// ClientTLSFromFiles is the TLS of a client that presents the certificate
// in certFile and keyFile and trusts the CA in caFile.
func ClientTLSFromFiles(t testing.TB, caFile, certFile, keyFile string) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("harness: %s holds no PEM certificate", caFile)
	}
	return pki.StaticClientConfig(pair, pool)
}
