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
	"slices"
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

// CRL is the revocation list etcd reads at each new connection, in DER.
func (f NodeFiles) CRL() string { return filepath.Join(f.Dir, "crl.der") }

// EnsureNodeCert makes sure the files hold a certificate from ca for req,
// valid at now and not yet due for renewal, issuing one if not, and that
// ca.crt holds trust: the PEM of the CAs the node trusts, which must
// include ca (nil trusts ca alone). It refuses a CA that is not valid at
// now. It returns the certificate in use and whether it is new.
//
// A renewal by the same CA keeps the key, so it replaces node.crt alone,
// atomically, and etcd, which reads the files on every new connection,
// never sees a certificate with the wrong key. A certificate from another
// CA (a CA rotation) gets a new key as well: both files are written
// before either is renamed into place, so a reader sees a mismatched pair
// only for the instant between the two renames, and retries.
func EnsureNodeCert(ca *CA, trust []byte, f NodeFiles, req CertRequest, now time.Time) (*x509.Certificate, bool, error) {
	if err := ca.ValidAt(now); err != nil {
		return nil, false, fmt.Errorf("%w; cannot issue the node certificate from it", err)
	}
	if trust == nil {
		trust = ca.CertPEM
	}
	if !slices.Contains(Fingerprints(trust), Fingerprint(ca.Cert)) {
		return nil, false, fmt.Errorf("pki: the CAs to trust do not include %s, which issues the node certificate", Describe(ca.Cert))
	}
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("pki: %w", err)
	}
	if err := WriteFileAtomic(f.CA(), trust, 0o644); err != nil {
		return nil, false, err
	}
	var key crypto.Signer
	if data, err := os.ReadFile(f.Key()); err == nil {
		key, _ = parseKeyPEM(data) // an unreadable key is replaced
	}
	var old *x509.Certificate
	if data, err := os.ReadFile(f.Cert()); err == nil {
		old, _ = ParseCertPEM(data)
	}
	if key != nil && old != nil && publicKeysEqual(old.PublicKey, key.Public()) && ca.Verify(old, req.Role, now) == nil &&
		SameNames(old, req.DNSNames, req.IPs) && now.Before(RenewAt(old)) {
		return old, false, nil
	}
	// The key is kept only for a certificate of the same CA.
	sameCA := key != nil && old != nil && publicKeysEqual(old.PublicKey, key.Public()) &&
		old.CheckSignatureFrom(ca.Cert) == nil
	files := []FileData{}
	if !sameCA {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, false, fmt.Errorf("pki: key: %w", err)
		}
		key = k
		kp, err := keyPEM(key)
		if err != nil {
			return nil, false, err
		}
		files = append(files, FileData{f.Key(), kp, 0o600})
	}
	if req.Record != nil {
		serial, err := newSerial()
		if err != nil {
			return nil, false, err
		}
		if err := req.Record(serial); err != nil {
			return nil, false, fmt.Errorf("pki: record the serial of the node certificate to issue: %w", err)
		}
		req.Serial = serial
	}
	certPEM, _, err := ca.Issue(req, key, now)
	if err != nil {
		return nil, false, err
	}
	files = append(files, FileData{f.Cert(), certPEM, 0o644})
	if err := WriteFilesAtomic(files...); err != nil {
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
// from a CA that trust holds. It verifies the client itself so that a
// refusal says why (expired, another CA, none), and reports each refusal
// to onReject, when it is set, with the client's address (nil if
// unknown). onReject runs on the handshake's goroutine, many at once.
func ServerConfig(f NodeFiles, trust *Trust, onReject func(remote net.Addr, err error)) *tls.Config {
	kp := &keyPair{certFile: f.Cert(), keyFile: f.Key()}
	verify := func(remote net.Addr) func([][]byte, [][]*x509.Certificate) error {
		return func(raw [][]byte, _ [][]*x509.Certificate) error {
			err := verifyRaw(trust, raw, time.Now())
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
		// A resumed session would skip the check above: after a CA
		// rotation a client of the dropped CA could resume one.
		SessionTicketsDisabled: true,
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

// ClientConfig is the TLS of a node's calls to etcd: it presents the
// node certificate, and takes a server that presents a node certificate
// for serving from a CA that trust holds, and, when it was dialled by
// name, carries that name. Trust is read at each handshake (tls.Config's
// RootCAs would be fixed), so a CA rotation needs no restart.
//
// TLS does not tell this check the address a server was dialled at, so a
// server reached at an IP address is checked for the node role instead,
// as for the peer API (NodeClientConfig): every member holds a node
// certificate from the same CA, so the address would add little. A
// certificate that carries another cluster's node marker (a CA shared
// through --pki-dir) is refused; one with no marker at all, from an
// etcd-manager older than the marker, is taken.
func ClientConfig(f NodeFiles, trust *Trust, marker string) *tls.Config {
	kp := &keyPair{certFile: f.Cert(), keyFile: f.Key()}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by VerifyConnection
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return kp.get()
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("pki: the server presented no certificate")
			}
			c := cs.PeerCertificates[0]
			if err := verifyTrusted(trust, c, RoleNode, time.Now()); err != nil {
				return err
			}
			if !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
				return fmt.Errorf("pki: certificate %q may not serve", c.Subject.CommonName)
			}
			if cs.ServerName != "" {
				if err := c.VerifyHostname(cs.ServerName); err != nil {
					return fmt.Errorf("pki: %w", err)
				}
			}
			return checkMarker(c, marker)
		},
	}
}

// NodeClientConfig is the TLS of an agent calling another agent's peer
// API. It trusts any node certificate of this cluster from a CA that
// trust holds, whatever address it was reached at: agents find each other
// through discovery, behind NAT or proxies, and every node holds a node
// certificate from the same CA anyway, so the name check would add no
// assurance. As for ClientConfig, a certificate with another cluster's
// node marker is refused.
func NodeClientConfig(f NodeFiles, trust *Trust, marker string) *tls.Config {
	kp := &keyPair{certFile: f.Cert(), keyFile: f.Key()}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by the check below
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return kp.get()
		},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("pki: the agent presented no certificate")
			}
			c, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return fmt.Errorf("pki: the agent's certificate is unreadable: %w", err)
			}
			if err := verifyTrusted(trust, c, RoleNode, time.Now()); err != nil {
				return err
			}
			return checkMarker(c, marker)
		},
	}
}

// AgentClientConfig is NodeClientConfig for a caller that is no node:
// the Kubernetes operator, presenting its operator certificate cert. It
// takes any node certificate of the cluster of marker from the CAs in
// pool, at whatever address the agent was reached.
func AgentClientConfig(cert tls.Certificate, pool *x509.CertPool, marker string) *tls.Config {
	trust := TrustPool(pool)
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by the check below
		Certificates:       []tls.Certificate{cert},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("pki: the agent presented no certificate")
			}
			c, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return fmt.Errorf("pki: the agent's certificate is unreadable: %w", err)
			}
			if err := verifyTrusted(trust, c, RoleNode, time.Now()); err != nil {
				return err
			}
			return checkMarker(c, marker)
		},
	}
}

// StaticClientConfig is the TLS of a client that presents cert and trusts
// the CA in pool.
func StaticClientConfig(cert tls.Certificate, pool *x509.CertPool) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{cert}}
}

// checkMarker refuses a node certificate that carries a node marker
// other than marker: another cluster's, from a shared CA. A certificate
// without any (an older etcd-manager's) passes, as does any with an
// empty marker.
func checkMarker(c *x509.Certificate, marker string) error {
	if marker == "" || CarriesName(c, marker) {
		return nil
	}
	for _, name := range c.DNSNames {
		if IsReservedName(name) {
			return fmt.Errorf("pki: certificate %q is a node certificate of another cluster (%s), not of this one (%s)", c.Subject.CommonName, name, marker)
		}
	}
	return nil
}

// verifyTrusted checks c against the CAs trust holds now.
func verifyTrusted(trust *Trust, c *x509.Certificate, role string, now time.Time) error {
	pool, err := trust.Pool()
	if err != nil {
		return err
	}
	return verifyAgainst(pool, c, role, now)
}

func verifyRaw(trust *Trust, raw [][]byte, now time.Time) error {
	if len(raw) == 0 {
		return errors.New("pki: the client presented no certificate")
	}
	c, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return fmt.Errorf("pki: the client's certificate is unreadable: %w", err)
	}
	return verifyTrusted(trust, c, "", now)
}

// PeerRole returns the role of a verified client certificate chain's
// leaf, or "" when there is none.
func PeerRole(c *x509.Certificate) string {
	for _, o := range c.Subject.Organization {
		if o == RoleNode || o == RoleClient || o == RoleOperator {
			return o
		}
	}
	return ""
}
