package agent

import (
	"bytes"
	"crypto/x509"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// agentWithStoreCA sets a's TLS up, which generates the store's CA, and
// returns the store, open, and that CA.
func agentWithStoreCA(t *testing.T, a *Agent) (*store.Store, *pki.CA) {
	t.Helper()
	if err := a.setupTLS(t.Context()); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(t.Context(), a.cfg.BackupStore, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	old, err := pki.LoadStoreCA(t.Context(), s, isNotFound, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s, old
}

// A node takes up the store's CA and trust only when they are what the
// leader read: otherwise it refuses and changes nothing. Taken up, a new
// issuing CA brings a new key and certificate; the same one twice
// changes nothing. An agent on --pki-dir refuses outright.
func TestCAKeeperSync(t *testing.T) {
	a, _ := testAgent(t)
	s, old := agentWithStoreCA(t, a)
	fresh := mustGenerateCA(t, time.Now(), 24*time.Hour)
	r := pki.NewRotation(old.Cert, fresh.Cert, time.Now())
	r.Phase = pki.PhaseReissue
	key, _ := fresh.KeyPEM()
	for k, v := range map[string][]byte{pki.StoreRotation: r.Encode(), pki.StoreCAKey: append(key, fresh.CertPEM...)} {
		if err := s.Write(t.Context(), k, v); err != nil {
			t.Fatal(err)
		}
	}
	files := a.pkiFiles()
	read := func(path string) []byte {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	keyBefore, caBefore := read(files.Key()), read(files.CA())
	both := []string{pki.Fingerprint(old.Cert), pki.Fingerprint(fresh.Cert)}
	k := caKeeper{a}

	// Malformed requests: refused before the store is read.
	for _, bad := range []struct {
		trust  []string
		issuer string
	}{
		{nil, both[0]},
		{append(slices.Clone(both), both[0]), both[0]},
		{[]string{"\x1b[2J" + both[0][4:]}, both[0]},
		{both, strings.Repeat("A", 1<<16)},
	} {
		if err := k.Sync(t.Context(), bad.trust, bad.issuer); !errors.Is(err, ErrBadCARequest) {
			t.Errorf("Sync(%d CAs, issuer of %d bytes): %v, want ErrBadCARequest", len(bad.trust), len(bad.issuer), err)
		}
	}

	// The leader read the old CA as the issuer: refused, nothing written.
	err := k.Sync(t.Context(), both, pki.Fingerprint(old.Cert))
	if !errors.Is(err, ErrCAMismatch) {
		t.Fatalf("a mismatched issuer: %v", err)
	}
	if !bytes.Equal(read(files.Key()), keyBefore) || !bytes.Equal(read(files.CA()), caBefore) {
		t.Fatal("a refused sync changed the node's files")
	}
	if err := k.Sync(t.Context(), both[:1], pki.Fingerprint(fresh.Cert)); !errors.Is(err, ErrCAMismatch) {
		t.Fatalf("a mismatched trust: %v", err)
	}

	// What the store says: both trusted, a new key, a certificate from
	// the new CA.
	if err := k.Sync(t.Context(), []string{both[1], both[0]}, pki.Fingerprint(fresh.Cert)); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(both)
	slices.Sort(want)
	if got := pki.FileFingerprints(files.CA()); !slices.Equal(got, want) {
		t.Errorf("ca.crt holds %v, want %v", got, want)
	}
	keyAfter := read(files.Key())
	if bytes.Equal(keyAfter, keyBefore) {
		t.Error("the node kept its key across a change of CA")
	}
	c, err := pki.ParseCertPEM(read(files.Cert()))
	if err != nil || c.CheckSignatureFrom(fresh.Cert) != nil {
		t.Fatalf("node.crt is not from the new CA: %v", err)
	}
	if got := a.certInfo.Load(); got == nil || got.CAFingerprint != pki.Fingerprint(fresh.Cert) {
		t.Errorf("the reported issuer is %+v", got)
	}
	certAfter := read(files.Cert())
	if err := k.Sync(t.Context(), both, pki.Fingerprint(fresh.Cert)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read(files.Key()), keyAfter) || !bytes.Equal(read(files.Cert()), certAfter) {
		t.Error("a second sync with nothing new replaced the key or certificate")
	}

	a.cfg.PKIDir = t.TempDir()
	if err := k.Sync(t.Context(), both, pki.Fingerprint(fresh.Cert)); err == nil || !strings.Contains(err.Error(), "--pki-dir") {
		t.Errorf("an agent on --pki-dir: %v", err)
	}
}

// An agent cut off from the leader catches up with the store's CA by
// itself while a rotation record links it to its own, or when the store
// trusts a subset of what it trusts; a CA with no such link is not taken
// up, and the agent says so.
func TestRefreshTrust(t *testing.T) {
	a, rec := testAgent(t)
	s, old := agentWithStoreCA(t, a)
	write := func(k string, v []byte) {
		t.Helper()
		if err := s.Write(t.Context(), k, v); err != nil {
			t.Fatal(err)
		}
	}
	asCAKey := func(ca *pki.CA) []byte {
		key, _ := ca.KeyPEM()
		return append(key, ca.CertPEM...)
	}
	files := a.pkiFiles()
	issuer := func() *x509.Certificate {
		t.Helper()
		data, err := os.ReadFile(files.Cert())
		if err != nil {
			t.Fatal(err)
		}
		c, err := pki.ParseCertPEM(data)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// Nothing changed: nothing done.
	if err := a.refreshTrust(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A CA unrelated to the node's replaces the store's: not taken up.
	stranger := mustGenerateCA(t, time.Now(), 24*time.Hour)
	write(pki.StoreCAKey, asCAKey(stranger))
	if err := a.refreshTrust(t.Context()); err != nil {
		t.Fatal(err)
	}
	if issuer().CheckSignatureFrom(old.Cert) != nil || len(rec.find("the store's CA is unrelated to the CAs this node trusts, and no CA rotation links them; not taking it up")) != 1 {
		t.Fatal("an unrelated CA was taken up, or not reported")
	}
	// A rotation at reissue that this agent missed: taken up.
	fresh := mustGenerateCA(t, time.Now(), 24*time.Hour)
	r := pki.NewRotation(old.Cert, fresh.Cert, time.Now())
	r.Phase = pki.PhaseReissue
	write(pki.StoreCAKey, asCAKey(fresh))
	write(pki.StoreRotation, r.Encode())
	if err := a.refreshTrust(t.Context()); err != nil {
		t.Fatal(err)
	}
	if issuer().CheckSignatureFrom(fresh.Cert) != nil || len(pki.FileFingerprints(files.CA())) != 2 {
		t.Fatal("the missed reissue was not taken up")
	}
	// The rotation ended meanwhile: the store trusts a subset.
	if err := s.Delete(t.Context(), pki.StoreRotation); err != nil {
		t.Fatal(err)
	}
	if err := a.refreshTrust(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := pki.FileFingerprints(files.CA()); !slices.Equal(got, []string{pki.Fingerprint(fresh.Cert)}) {
		t.Fatalf("after the rotation ended the node trusts %v, want the new CA alone", got)
	}
}
