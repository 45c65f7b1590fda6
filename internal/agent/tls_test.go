package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// logRecorder is a slog handler that keeps every record, for tests that
// assert what an agent logged.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

// find returns the records with the message, each as "LEVEL k=v k=v".
func (h *logRecorder) find(msg string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.records {
		if r.Message != msg {
			continue
		}
		line := r.Level.String()
		r.Attrs(func(a slog.Attr) bool {
			line += fmt.Sprintf(" %s=%v", a.Key, a.Value)
			return true
		})
		out = append(out, line)
	}
	return out
}

// testAgent is an agent with TLS on, a fresh data dir, and a log that
// records.
func testAgent(t *testing.T) (*Agent, *logRecorder) {
	t.Helper()
	c := validConfig()
	c.Insecure, c.EtcdInsecure = false, false
	c.DataDir = t.TempDir()
	c.BackupStore = "file://" + filepath.Join(t.TempDir(), "store")
	rec := &logRecorder{}
	a := NewAgent(c, slog.New(rec))
	a.nodeID = "node-1"
	return a, rec
}

func writeCADir(t *testing.T, ca *pki.CA) string {
	t.Helper()
	dir := t.TempDir()
	key, _ := ca.KeyPEM()
	for name, data := range map[string][]byte{"ca.crt": ca.CertPEM, "ca.key": key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func mustGenerateCA(t *testing.T, at time.Time, validity time.Duration) *pki.CA {
	t.Helper()
	ca, err := pki.GenerateCA(at, validity)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// An agent given an out-of-date CA with --pki-dir refuses to start, with
// the CA's dates in the error, instead of retrying for ever.
func TestSetupTLSRefusesAnOutOfDatePKIDir(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name     string
		ca       *pki.CA
		wantIs   error
		wantText string
	}{
		{"expired", mustGenerateCA(t, now.Add(-48*time.Hour), 24*time.Hour), pki.ErrCAExpired, "expired at " + now.Add(-24*time.Hour).UTC().Format("2006-01-02T15")},
		{"not valid yet", mustGenerateCA(t, now.Add(48*time.Hour), 24*time.Hour), pki.ErrCANotYetValid, "check this machine's clock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _ := testAgent(t)
			a.cfg.PKIDir = writeCADir(t, tt.ca)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err := a.setupTLS(ctx)
			if !errors.Is(err, tt.wantIs) || !strings.Contains(err.Error(), tt.wantText) || !strings.Contains(err.Error(), "--pki-dir "+a.cfg.PKIDir) {
				t.Fatalf("setupTLS: %v, want %v naming the folder and saying %q", err, tt.wantIs, tt.wantText)
			}
		})
	}
}

// An expired CA in the store is not used, and the agent says why on every
// attempt, at error level, naming the object and what to do.
func TestSetupTLSReportsAnExpiredStoreCA(t *testing.T) {
	a, rec := testAgent(t)
	s, err := store.Open(t.Context(), a.cfg.BackupStore, store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	old := mustGenerateCA(t, time.Now().Add(-48*time.Hour), 24*time.Hour)
	key, _ := old.KeyPEM()
	if err := s.Create(t.Context(), pki.StoreCAKey, append(key, old.CertPEM...)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	if err := a.setupTLS(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("setupTLS: %v, want it to keep retrying until cancelled", err)
	}
	lines := rec.find("cannot issue the node certificate; retrying")
	if len(lines) == 0 {
		t.Fatal("nothing logged about the expired CA")
	}
	for _, want := range []string{"ERROR", "CA expired", "backup store's pki/ca.key", "move pki/ca.key and pki/ca.crt aside"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("%q does not say %q", lines[0], want)
		}
	}
	if _, err := os.Stat(a.pkiFiles().Cert()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a node certificate was issued from the expired CA: %v", err)
	}
}

// A CA that went out of date while the agent ran is read again at the
// next renewal, so that a replaced CA is picked up.
func TestRenewCertReadsAnOutOfDateCAAgain(t *testing.T) {
	a, _ := testAgent(t)
	current := mustGenerateCA(t, time.Now(), 24*time.Hour)
	a.cfg.PKIDir = writeCADir(t, current)
	a.ca = mustGenerateCA(t, time.Now().Add(-48*time.Hour), 24*time.Hour)
	if err := a.renewCert(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !a.ca.Cert.Equal(current.Cert) {
		t.Error("the agent kept the expired CA")
	}
}

// An agent with TLS off for its peer API, etcd or both says so at start,
// once, at warning level, with what is off and what it means.
func TestSetupTLSWarnsWhenTLSIsOff(t *testing.T) {
	tests := []struct {
		name                   string
		insecure, etcdInsecure bool
		want                   []string // in the warning; nil: no warning
	}{
		{"TLS everywhere", false, false, nil},
		{"--insecure alone", true, false, []string{"off=peer API", "flags=--insecure", "still-secured=etcd", "make it join, leave or restore"}},
		{"--etcd-insecure alone", false, true, []string{"off=etcd", "flags=--etcd-insecure", "still-secured=peer API", "read and write every key"}},
		{"both", true, true, []string{"off=peer API and etcd", "flags=--insecure --etcd-insecure", "still-secured=nothing", "join, leave or restore", "every key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, rec := testAgent(t)
			a.cfg.Insecure, a.cfg.EtcdInsecure = tt.insecure, tt.etcdInsecure
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			_ = a.setupTLS(ctx) // with TLS on for a part, it issues a certificate from a new CA in the store
			lines := rec.find(msgTLSOff)
			if tt.want == nil {
				if len(lines) != 0 {
					t.Fatalf("warned with TLS on everywhere: %v", lines)
				}
				return
			}
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "WARN") {
				t.Fatalf("logged %v, want one warning", lines)
			}
			for _, w := range tt.want {
				if !strings.Contains(lines[0], w) {
					t.Errorf("%q does not say %q", lines[0], w)
				}
			}
		})
	}
}

// Each node certificate's serial is in the store before the certificate
// is used, and etcd's CRL file beside it lists what the store revokes,
// signed by the CA; a revocation rewrites it and is in force at once.
func TestSerialsRecordedAndCRLWritten(t *testing.T) {
	a, _ := testAgent(t)
	ctx := t.Context()
	c := setUpCert(t, a)
	s, err := store.Open(ctx, a.cfg.BackupStore, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	keys, err := s.List(ctx, pki.StoreIssuedPrefix, "")
	if err != nil || len(keys) != 1 || keys[0] != pki.StoreIssuedPrefix+"node-1/"+pki.SerialHex(c.SerialNumber) {
		t.Fatalf("issued records %v (%v), want the certificate's serial %s", keys, err, pki.SerialHex(c.SerialNumber))
	}
	crl := func() *x509.RevocationList {
		t.Helper()
		der, err := os.ReadFile(a.pkiFiles().CRL())
		if err != nil {
			t.Fatal(err)
		}
		l, err := x509.ParseRevocationList(der)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.CheckSignatureFrom(a.ca.Cert); err != nil {
			t.Errorf("the CRL is not the CA's: %v", err)
		}
		return l
	}
	if n := len(crl().RevokedCertificateEntries); n != 0 {
		t.Errorf("the CRL lists %d certificates before any revocation", n)
	}
	a.takeRevocations(pki.Revocations{Nodes: []pki.RevokedNode{{NodeID: "node-2", RevokedAt: time.Now(), Serials: []string{"abc"}}}})
	if got := crl().RevokedCertificateEntries; len(got) != 1 || pki.SerialHex(got[0].SerialNumber) != "abc" {
		t.Errorf("the CRL lists %v, want serial abc", got)
	}
	if !a.revoked.NodeRevoked("node-2") {
		t.Error("the revocation is not in force")
	}
}

// The node certificate carries the cluster's node marker and its store's
// marker, the same for every agent of the store however its URL is
// spelled.
func TestCertCarriesTheStoreMarker(t *testing.T) {
	a, _ := testAgent(t)
	b, _ := testAgent(t)
	b.cfg.BackupStore = a.cfg.BackupStore + "/"
	c := setUpCert(t, a)
	id, err := store.Identity(a.cfg.BackupStore)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{a.nodeMarker(), pki.StoreMarker(id)} {
		if !pki.CarriesName(c, name) {
			t.Errorf("the node certificate %v lacks %s", c.DNSNames, name)
		}
	}
	if a.storeMarker() != b.storeMarker() {
		t.Errorf("store markers %s and %s for one store", a.storeMarker(), b.storeMarker())
	}
}

// The revocation list read last is saved, and in force from the next
// start, before the store is read; a damaged saved list is reported and
// refuses no one.
func TestRevocationsSavedAcrossRestarts(t *testing.T) {
	a, _ := testAgent(t)
	a.takeRevocations(pki.Revocations{Nodes: []pki.RevokedNode{{NodeID: "node-2", RevokedAt: time.Now()}}})
	b, _ := testAgent(t)
	b.cfg.DataDir = a.cfg.DataDir
	b.loadRevocations()
	if !b.revoked.NodeRevoked("node-2") {
		t.Error("the saved revocation is not in force at the next start")
	}
	if err := os.WriteFile(b.revokedFile(), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, rec := testAgent(t)
	c.cfg.DataDir = a.cfg.DataDir
	c.loadRevocations()
	const msg = "cannot read the revocation list this agent saved; the store's is in force from the first cycle"
	if c.revoked.NodeRevoked("node-2") || len(rec.find(msg)) != 1 {
		t.Errorf("a damaged saved list: in force %v, logged %q", c.revoked.Get(), rec.find(msg))
	}
}

// setUpCert sets the agent's TLS up, and returns the node certificate it
// issued itself.
func setUpCert(t *testing.T, a *Agent) *x509.Certificate {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := a.setupTLS(ctx); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(a.pkiFiles().Cert())
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.ParseCertPEM(data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
