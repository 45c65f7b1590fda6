package pki

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"
)

// MaxTrustFileSize bounds the read of a node's ca.crt: one or two CA
// certificates in PEM, a few KiB.
const MaxTrustFileSize = 64 << 10

// Trust is the set of CAs a node trusts: the certificates in its ca.crt,
// read again whenever the file changes, so that a CA rotation reaches
// the peer API and the agent's etcd clients without a restart. (etcd
// itself reads the file only when it starts.)
type Trust struct {
	file string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	pool    *x509.CertPool
}

// TrustFile is the trust kept in the PEM file at path.
func TrustFile(path string) *Trust { return &Trust{file: path} }

// TrustPool is a fixed trust, for callers that read no file.
func TrustPool(pool *x509.CertPool) *Trust { return &Trust{pool: pool} }

// Pool returns the CAs trusted now.
func (t *Trust) Pool() (*x509.CertPool, error) {
	if t.file == "" {
		return t.pool, nil
	}
	st, err := os.Stat(t.file)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pool != nil && st.ModTime().Equal(t.modTime) && st.Size() == t.size {
		return t.pool, nil
	}
	data, err := readFileMax(t.file, MaxTrustFileSize)
	if err != nil {
		return nil, err
	}
	certs, err := ParseCertsPEM(data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, t.file)
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	t.pool, t.modTime, t.size = pool, st.ModTime(), st.Size()
	return pool, nil
}

// ParseCertsPEM parses every certificate in PEM data, and refuses data
// with none, or with a block it cannot parse.
func ParseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("pki: no PEM certificate found")
	}
	return out, nil
}

// Fingerprints are the SHA-256 fingerprints of the certificates in PEM
// data, sorted: the set of CAs a trust file holds, in a form two nodes
// can compare. Unreadable data has none.
func Fingerprints(data []byte) []string {
	certs, err := ParseCertsPEM(data)
	if err != nil {
		return nil
	}
	fps := make([]string, 0, len(certs))
	for _, c := range certs {
		fps = append(fps, Fingerprint(c))
	}
	slices.Sort(fps)
	return slices.Compact(fps)
}

// FileFingerprints are the Fingerprints of the file at path, nil when it
// cannot be read.
func FileFingerprints(path string) []string {
	data, err := readFileMax(path, MaxTrustFileSize)
	if err != nil {
		return nil
	}
	return Fingerprints(data)
}

// readFileMax reads the file at path, refusing one over max bytes.
func readFileMax(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("pki: %s is over %d bytes, more than it may hold", path, max)
	}
	return data, nil
}

// ValidFingerprint reports whether s has the form of Fingerprint: 32
// upper-case hex pairs joined by colons.
func ValidFingerprint(s string) bool {
	if len(s) != 32*3-1 {
		return false
	}
	for i, r := range s {
		switch {
		case i%3 == 2:
			if r != ':' {
				return false
			}
		case (r < '0' || r > '9') && (r < 'A' || r > 'F'):
			return false
		}
	}
	return true
}

// Bundle is the PEM of the given certificates, in order, each once.
func Bundle(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	var seen [][]byte
	for _, c := range certs {
		if c == nil || slices.ContainsFunc(seen, func(raw []byte) bool { return bytes.Equal(raw, c.Raw) }) {
			continue
		}
		seen = append(seen, c.Raw)
		b.Write(pemBlock("CERTIFICATE", c.Raw))
	}
	return b.Bytes()
}
