package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// NodeFiles are a node's certificate files under --data-dir: the CA to
// trust, and the node's own certificate and key, which both the peer API
// and etcd use, as server and as client.
type NodeFiles struct{ Dir string }

func (f NodeFiles) CA() string   { return filepath.Join(f.Dir, "ca.crt") }
func (f NodeFiles) Cert() string { return filepath.Join(f.Dir, "node.crt") }
func (f NodeFiles) Key() string  { return filepath.Join(f.Dir, "node.key") }

// EnsureNodeCert makes sure the files hold a certificate from ca for req,
// valid at now and not yet due for renewal, issuing one if not; it
// refuses a CA that is not valid at now. It returns the certificate in
// use and whether it is new. The key is kept
// across renewals, so a renewal replaces node.crt alone, atomically, and
// etcd, which reads the files on every new connection, never sees a
// certificate with the wrong key.
func EnsureNodeCert(ca *CA, f NodeFiles, req CertRequest, now time.Time) (*x509.Certificate, bool, error) {
	if err := ca.ValidAt(now); err != nil {
		return nil, false, fmt.Errorf("%w; cannot issue the node certificate from it", err)
	}
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("pki: %w", err)
	}
	if err := WriteFileAtomic(f.CA(), ca.CertPEM, 0o644); err != nil {
		return nil, false, err
	}
	var key crypto.Signer
	if data, err := os.ReadFile(f.Key()); err == nil {
		key, _ = parseKeyPEM(data) // an unreadable key is replaced
	}
	if key != nil {
		if data, err := os.ReadFile(f.Cert()); err == nil {
			if c, err := ParseCertPEM(data); err == nil && ca.Verify(c, req.Role, now) == nil &&
				publicKeysEqual(c.PublicKey, key.Public()) && SameNames(c, req.DNSNames, req.IPs) && now.Before(RenewAt(c)) {
				return c, false, nil
			}
		}
	} else {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, false, fmt.Errorf("pki: key: %w", err)
		}
		key = k
		kp, err := keyPEM(key)
		if err != nil {
			return nil, false, err
		}
		if err := WriteFileAtomic(f.Key(), kp, 0o600); err != nil {
			return nil, false, err
		}
	}
	certPEM, _, err := ca.Issue(req, key, now)
	if err != nil {
		return nil, false, err
	}
	if err := WriteFileAtomic(f.Cert(), certPEM, 0o644); err != nil {
		return nil, false, err
	}
	c, err := ParseCertPEM(certPEM)
	return c, true, err
}

// keyPair serves a certificate and key from files, reading them again
// when the certificate file changes.
type keyPair struct {
	certFile, keyFile string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	cert    *tls.Certificate
}

func (k *keyPair) get() (*tls.Certificate, error) {
	st, err := os.Stat(k.certFile)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cert != nil && st.ModTime().Equal(k.modTime) && st.Size() == k.size {
		return k.cert, nil
	}
	c, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	k.cert, k.modTime, k.size = &c, st.ModTime(), st.Size()
	return k.cert, nil
}

// ServerConfig is the TLS of a server that requires a client certificate
// from the CA in pool. It verifies the client itself so that a refusal
// says why (expired, another CA, none), and reports each refusal to
// onReject, when it is set, with the client's address (nil if unknown).
// onReject runs on the handshake's goroutine, many at once.
func ServerConfig(f NodeFiles, pool *x509.CertPool, onReject func(remote net.Addr, err error)) *tls.Config {
	kp := &keyPair{certFile: f.Cert(), keyFile: f.Key()}
	verify := func(remote net.Addr) func([][]byte, [][]*x509.Certificate) error {
		return func(raw [][]byte, _ [][]*x509.Certificate) error {
			err := verifyRaw(pool, raw, time.Now())
			if err != nil && onReject != nil {
				onReject(remote, err)
			}
			return err
		}
	}
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return kp.get()
		},
		// Requested, and checked below even when missing, so that every
		// refusal goes through verifyRaw and says why.
		ClientAuth:            tls.RequestClientCert,
		VerifyPeerCertificate: verify(nil),
	}
	cfg := base.Clone()
	// Per connection, so that a refusal names the client.
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		var remote net.Addr
		if hello.Conn != nil {
			remote = hello.Conn.RemoteAddr()
		}
		// grpc's credentials add their ALPN protocol to this config too.
		c := base.Clone()
		c.VerifyPeerCertificate = verify(remote)
		return c, nil
	}
	return cfg
}

// ClientConfig is the TLS of a client that presents the node certificate
// and trusts the CA in pool.
func ClientConfig(f NodeFiles, pool *x509.CertPool) *tls.Config {
	kp := &keyPair{certFile: f.Cert(), keyFile: f.Key()}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    pool,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return kp.get()
		},
	}
}

// NodeClientConfig is the TLS of an agent calling another agent's peer
// API. It trusts any node certificate from the CA, whatever address it was
// reached at: agents find each other through discovery, behind NAT or
// proxies, and every node holds a node certificate from the same CA
// anyway, so the name check would add no assurance.
func NodeClientConfig(f NodeFiles, pool *x509.CertPool) *tls.Config {
	cfg := ClientConfig(f, pool)
	cfg.InsecureSkipVerify = true // replaced by the check below
	cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("pki: the agent presented no certificate")
		}
		c, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return fmt.Errorf("pki: the agent's certificate is unreadable: %w", err)
		}
		return verifyAgainst(pool, c, RoleNode, time.Now())
	}
	return cfg
}

// StaticClientConfig is the TLS of a client that presents cert and trusts
// the CA in pool.
func StaticClientConfig(cert tls.Certificate, pool *x509.CertPool) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{cert}}
}

func verifyRaw(pool *x509.CertPool, raw [][]byte, now time.Time) error {
	if len(raw) == 0 {
		return errors.New("pki: the client presented no certificate")
	}
	c, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return fmt.Errorf("pki: the client's certificate is unreadable: %w", err)
	}
	return verifyAgainst(pool, c, "", now)
}

// PeerRole returns the role of a verified client certificate chain's
// leaf, or "" when there is none.
func PeerRole(c *x509.Certificate) string {
	for _, o := range c.Subject.Organization {
		if o == RoleNode || o == RoleClient {
			return o
		}
	}
	return ""
}
