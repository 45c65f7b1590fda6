package pki

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/secretfile"
)

// Roles, carried as the certificate's organization. The peer API lets a
// client certificate (a person's, or the ctl's) read status only; an
// operator certificate (the Kubernetes operator's) may make the operator's
// calls (see package peer), and never a node's.
const (
	RoleNode     = "etcd-manager-node"
	RoleClient   = "etcd-manager-client"
	RoleOperator = "etcd-manager-operator"
)

// Defaults.
const (
	DefaultCAValidity = 10 * 365 * 24 * time.Hour
	// DefaultCertValidity is a node certificate's life: a stolen one is
	// good for at most 90 days, and it renews 30 days before it expires.
	DefaultCertValidity = 90 * 24 * time.Hour
	// RenewFraction is how far into its life a certificate is renewed.
	RenewFraction = 2.0 / 3.0
)

// Errors.
var (
	ErrNoCA = errors.New("pki: no CA")
	// ErrReservedName means a certificate other than a node's would
	// carry a name under ReservedDomain.
	ErrReservedName = errors.New("pki: name reserved for node certificates")
	// ErrCAExpired and ErrCANotYetValid mean the CA's certificate is not
	// valid now: nothing it issues would be accepted.
	ErrCAExpired     = errors.New("pki: CA expired")
	ErrCANotYetValid = errors.New("pki: CA not valid yet")
)

// MaxStoreCASize bounds the read of the store's CA object (a key and a
// certificate in PEM: a few KiB even with a large RSA key).
const MaxStoreCASize = 64 << 10

// CA is a certificate authority: its certificate and private key.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	Key     crypto.Signer
}

// GenerateCA makes a new self-signed CA, valid from now for validity.
func GenerateCA(now time.Time, validity time.Duration) (*CA, error) {
	return GenerateNamedCA(now, validity, "etcd-manager CA", time.Minute)
}

// GenerateNamedCA makes a new self-signed CA named name, valid from
// backdate before now until validity after it: a CA made on one machine
// for others, whose clocks may be behind, is backdated more.
func GenerateNamedCA(now time.Time, validity time.Duration, name string, backdate time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"etcd-manager"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return &CA{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), Key: key}, nil
}

// ParseCA reads a CA from PEM: its certificate, and its private key in
// PKCS#8, EC or PKCS#1 form. The key must match the certificate, and the
// certificate must be a CA.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCertPEM(certPEM)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("pki: %q is not a CA certificate", cert.Subject.CommonName)
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, errors.New("pki: the CA key does not match the CA certificate")
	}
	return &CA{Cert: cert, CertPEM: firstBlock(certPEM, "CERTIFICATE"), Key: key}, nil
}

// ValidAt checks that the CA's certificate is valid at now. The error
// names the CA by subject and serial and gives its dates.
func (ca *CA) ValidAt(now time.Time) error {
	c := ca.Cert
	switch {
	case now.After(c.NotAfter):
		return fmt.Errorf("%w: %s expired at %s, after being valid from %s", ErrCAExpired, Describe(c),
			c.NotAfter.UTC().Format(time.RFC3339), c.NotBefore.UTC().Format(time.RFC3339))
	case now.Before(c.NotBefore):
		return fmt.Errorf("%w: %s is valid from %s to %s, and this machine's clock says %s", ErrCANotYetValid, Describe(c),
			c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return nil
}

// Describe names a certificate for people: its subject's common name and
// its serial.
func Describe(c *x509.Certificate) string {
	return fmt.Sprintf("%q (serial %s)", c.Subject.CommonName, Serial(c))
}

// ShortName names a CA in a line of status: its common name and the
// first four bytes of its fingerprint, enough to tell two CAs apart.
func ShortName(c *x509.Certificate) string {
	return fmt.Sprintf("%q %s", c.Subject.CommonName, Fingerprint(c)[:11])
}

// Serial is a certificate's serial number in the form openssl prints:
// upper-case hex pairs joined by colons.
func Serial(c *x509.Certificate) string {
	b := c.SerialNumber.Bytes()
	if len(b) == 0 {
		b = []byte{0}
	}
	return colonHex(b)
}

// Fingerprint is the SHA-256 of a certificate's DER, in the form
// openssl x509 -noout -fingerprint -sha256 prints, so that the two can
// be compared.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return colonHex(sum[:])
}

func colonHex(b []byte) string {
	s := strings.ToUpper(hex.EncodeToString(b))
	var out strings.Builder
	for i := 0; i < len(s); i += 2 {
		if i > 0 {
			out.WriteByte(':')
		}
		out.WriteString(s[i : i+2])
	}
	return out.String()
}

// LoadCADir reads dir/ca.crt and dir/ca.key (--pki-dir), and refuses a
// CA that is not valid at now.
func LoadCADir(dir string, now time.Time) (*CA, error) {
	crt, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("pki: --pki-dir: %w", err)
	}
	key, err := readPrivate(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, fmt.Errorf("pki: --pki-dir: %w", err)
	}
	ca, err := ParseCA(crt, key)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, dir)
	}
	if err := ca.ValidAt(now); err != nil {
		return nil, fmt.Errorf("%w (in --pki-dir %s); %s", err, dir, validityAdvice(err, "put a current CA's ca.crt and ca.key there"))
	}
	return ca, nil
}

// readPrivate reads the file at path, which holds a key: one that others
// could read, or write, is refused (see secretfile.Check).
func readPrivate(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := secretfile.Check(f, path); err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(f, maxKeyFile))
}

// maxKeyFile bounds a key file read: a PEM key is a few KiB.
const maxKeyFile = 1 << 20

// validityAdvice says what to do about a CA that is not valid now.
func validityAdvice(err error, replace string) string {
	if errors.Is(err, ErrCANotYetValid) {
		return "check this machine's clock, or use a CA that is valid now"
	}
	return replace
}

// KeyPEM is the CA's private key in PKCS#8 PEM.
func (ca *CA) KeyPEM() ([]byte, error) { return keyPEM(ca.Key) }

// Pool is a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// CertRequest describes a certificate to issue.
type CertRequest struct {
	CommonName string
	Role       string
	DNSNames   []string
	IPs        []net.IP
	Validity   time.Duration
	// Serial, when set, is the certificate's serial number; else Issue
	// picks a random one.
	Serial *big.Int
	// Record, when set, is told the serial of a certificate that
	// EnsureNodeCert is about to issue, before it signs it; an error
	// stops the issue. Agents record their serials in the store, so
	// that revoke-node can list every certificate a node holds.
	Record func(serial *big.Int) error
}

// Issue signs a certificate for key (a new P-256 key when nil) and
// returns the certificate and key in PEM. Node certificates serve and
// authenticate as clients; client certificates only authenticate. Only
// a node certificate may carry a name under ReservedDomain, such as the
// NodeMarker that etcd's peer port requires: any other is refused with
// ErrReservedName.
func (ca *CA) Issue(req CertRequest, key crypto.Signer, now time.Time) (certPEM, keyPEMOut []byte, err error) {
	if req.Validity <= 0 {
		return nil, nil, errors.New("pki: a certificate needs a positive validity")
	}
	if req.Role != RoleNode {
		for _, name := range append([]string{req.CommonName}, req.DNSNames...) {
			if req.Role == RoleOperator && isOperatorMarker(name) {
				continue
			}
			if IsReservedName(name) {
				return nil, nil, fmt.Errorf("%w: %q is under %s, which only node certificates may carry", ErrReservedName, name, ReservedDomain)
			}
		}
	}
	if key == nil {
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, nil, fmt.Errorf("pki: key: %w", err)
		}
	}
	serial := req.Serial
	if serial == nil {
		if serial, err = newSerial(); err != nil {
			return nil, nil, err
		}
	}
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if req.Role == RoleNode {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	notAfter := now.Add(req.Validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter // a certificate cannot outlive its CA
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: []string{req.Role}},
		// A little slack for clocks that differ between nodes, but never
		// more than a tenth of a short test validity.
		NotBefore:   now.Add(-min(time.Minute, req.Validity/10)),
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: usage,
		DNSNames:    req.DNSNames,
		IPAddresses: req.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: sign %q: %w", req.CommonName, err)
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), kp, nil
}

// ReservedDomain holds the names only node certificates carry. .internal
// is reserved for private use (ICANN, 2024): no public CA issues names
// under it and no host on the Internet has one.
const ReservedDomain = "etcd-manager.internal"

// NodeMarker is the name every node certificate of cluster carries as a
// DNS SAN, and that etcd requires of peer certificates
// (--peer-cert-allowed-hostname) once every member's certificate has it.
// Operators' certificates never carry it (see Issue), so they cannot
// send raft traffic. It names the cluster, so that a node of another
// cluster sharing the CA (--pki-dir) is refused too.
func NodeMarker(cluster string) string { return "node." + cluster + "." + ReservedDomain }

// StoreMarker is the name every node certificate carries for the
// backup store its cluster keeps its state in; id is the store's
// identity (store.Identity of its URL). Two clusters of one name that
// share a CA keep different stores, so their nodes' certificates differ
// by it, and neither's agents take the other's calls. Only node
// certificates may carry it (see Issue).
func StoreMarker(id string) string { return "store-" + id + ".node." + ReservedDomain }

// IsStoreMarker reports whether name is a StoreMarker, of any store.
func IsStoreMarker(name string) bool {
	n := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), ".")
	rest, ok := strings.CutPrefix(n, "store-")
	return ok && strings.HasSuffix(rest, ".node."+ReservedDomain)
}

// OperatorMarker is the name an operator certificate for cluster carries
// as a DNS SAN: the agents of that cluster take the operator's calls only
// from a certificate that names it, so that an operator certificate for
// one cluster does not pass on another that shares the CA. Only operator
// certificates may carry it; node certificates never do, so the name
// never passes etcd's peer check.
func OperatorMarker(cluster string) string { return "operator." + cluster + "." + ReservedDomain }

func isOperatorMarker(name string) bool {
	n := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), ".")
	rest, ok := strings.CutPrefix(n, "operator.")
	return ok && strings.HasSuffix(rest, "."+ReservedDomain) && !strings.Contains(strings.TrimSuffix(rest, "."+ReservedDomain), "*")
}

// CarriesOperatorMarker reports whether c is an operator certificate for
// cluster: it carries OperatorMarker(cluster) as a DNS SAN.
func CarriesOperatorMarker(c *x509.Certificate, cluster string) bool {
	return PeerRole(c) == RoleOperator && slices.Contains(c.DNSNames, OperatorMarker(cluster))
}

// IsReservedName reports whether name (a DNS name or a common name, a
// wildcard included) lies under ReservedDomain, whatever its case and a
// trailing dot.
func IsReservedName(name string) bool {
	n := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), ".")
	return n == ReservedDomain || strings.HasSuffix(n, "."+ReservedDomain)
}

// CarriesName reports whether c would pass etcd's
// --peer-cert-allowed-hostname=name check, which is x509's VerifyHostname:
// a DNS SAN (or, for an IP, an IP SAN) that matches; never the common
// name.
func CarriesName(c *x509.Certificate, name string) bool {
	return name != "" && c.VerifyHostname(name) == nil
}

// RenewAt is when a certificate is due for renewal: two thirds into its
// life.
func RenewAt(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(time.Duration(float64(life) * RenewFraction))
}

// Verify checks that c was issued by ca, is valid at now, and has the
// role; the error says which check failed, in words an operator can act
// on.
func (ca *CA) Verify(c *x509.Certificate, role string, now time.Time) error {
	return verifyAgainst(ca.Pool(), c, role, now)
}

func verifyAgainst(pool *x509.CertPool, c *x509.Certificate, role string, now time.Time) error {
	switch {
	case now.After(c.NotAfter):
		return fmt.Errorf("pki: certificate %q expired at %s", c.Subject.CommonName, c.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(c.NotBefore):
		return fmt.Errorf("pki: certificate %q is not valid until %s", c.Subject.CommonName, c.NotBefore.UTC().Format(time.RFC3339))
	}
	_, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return fmt.Errorf("pki: certificate %q was not issued by this cluster's CA: %w", c.Subject.CommonName, err)
	}
	if role != "" && !slices.Contains(c.Subject.Organization, role) {
		return fmt.Errorf("pki: certificate %q is not a %s certificate (organization %v)", c.Subject.CommonName, role, c.Subject.Organization)
	}
	return nil
}

// ParseCertPEM parses the first certificate in PEM data.
func ParseCertPEM(data []byte) (*x509.Certificate, error) {
	der := firstBlock(data, "CERTIFICATE")
	if der == nil {
		return nil, errors.New("pki: no PEM certificate found")
	}
	b, _ := pem.Decode(der)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return c, nil
}

func parseKeyPEM(data []byte) (crypto.Signer, error) {
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errors.New("pki: no PEM private key found")
		}
		var k any
		var err error
		switch b.Type {
		case "PRIVATE KEY":
			k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		case "EC PRIVATE KEY":
			k, err = x509.ParseECPrivateKey(b.Bytes)
		case "RSA PRIVATE KEY":
			k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pki: private key: %w", err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("pki: private key of type %T cannot sign", k)
		}
		return s, nil
	}
}

func keyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return pemBlock("PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// firstBlock returns the first PEM block of the type, re-encoded, or nil.
func firstBlock(data []byte, typ string) []byte {
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil
		}
		if b.Type == typ {
			return pem.EncodeToMemory(b)
		}
	}
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	x, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && x.Equal(b)
}

func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: serial: %w", err)
	}
	return n, nil
}

// Store keeps the generated CA. Create must succeed for exactly one of
// several concurrent callers; ReadMax refuses an object over max bytes,
// naming it.
type Store interface {
	ReadMax(ctx context.Context, key string, max int64) ([]byte, error)
	Create(ctx context.Context, key string, data []byte) error
	Write(ctx context.Context, key string, data []byte) error
}

// Keys of the CA in the backup store. The key object holds the key and
// the certificate, so that creating it once creates the pair; the
// certificate object is a copy for whoever needs only to trust the CA.
const (
	StoreCAKey  = "pki/ca.key"
	StoreCACert = "pki/ca.crt"
)

// LoadStoreCA reads the CA kept in the store, at most MaxStoreCASize
// bytes of it, and refuses one that is not valid at now. isNotFound tells
// the store's missing-object error apart; without a CA it returns
// ErrNoCA.
func LoadStoreCA(ctx context.Context, s Store, isNotFound func(error) bool, now time.Time) (*CA, error) {
	data, err := s.ReadMax(ctx, StoreCAKey, MaxStoreCASize)
	if isNotFound(err) {
		return nil, fmt.Errorf("%w in the backup store (%s)", ErrNoCA, StoreCAKey)
	}
	if err != nil {
		return nil, fmt.Errorf("pki: read the CA: %w", err)
	}
	ca, err := ParseCA(data, data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, StoreCAKey)
	}
	if err := ca.ValidAt(now); err != nil {
		replace := fmt.Sprintf("no certificate it issues is accepted: start the agents with a current CA in --pki-dir, "+
			"or move %s and %s aside so that the agents generate a new CA when they restart (clients then need new certificates)", StoreCAKey, StoreCACert)
		return nil, fmt.Errorf("%w (in the backup store's %s); %s", err, StoreCAKey, validityAdvice(err, replace))
	}
	return ca, nil
}

// EnsureStoreCA returns the store's CA, generating it first if there is
// none. Agents starting together agree on one CA: the first to create the
// key object wins, and the others read it.
func EnsureStoreCA(ctx context.Context, s Store, isNotFound, isExists func(error) bool, now time.Time) (ca *CA, created bool, err error) {
	ca, err = LoadStoreCA(ctx, s, isNotFound, now)
	if err == nil || !errors.Is(err, ErrNoCA) {
		return ca, false, err
	}
	gen, err := GenerateCA(now, DefaultCAValidity)
	if err != nil {
		return nil, false, err
	}
	kp, err := gen.KeyPEM()
	if err != nil {
		return nil, false, err
	}
	err = s.Create(ctx, StoreCAKey, append(kp, gen.CertPEM...))
	switch {
	case isExists(err):
		ca, err = LoadStoreCA(ctx, s, isNotFound, now)
		return ca, false, err
	case err != nil:
		return nil, false, fmt.Errorf("pki: store the CA: %w", err)
	}
	if err := s.Write(ctx, StoreCACert, gen.CertPEM); err != nil {
		return nil, false, fmt.Errorf("pki: store the CA certificate: %w", err)
	}
	return gen, true, nil
}

// SameNames reports whether c carries exactly these DNS names and IPs.
func SameNames(c *x509.Certificate, dns []string, ips []net.IP) bool {
	a, b := slices.Clone(c.DNSNames), slices.Clone(dns)
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) || len(c.IPAddresses) != len(ips) {
		return false
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(c.IPAddresses, func(x net.IP) bool { return x.Equal(ip) }) {
			return false
		}
	}
	return true
}
