package controller

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// A node takes up the store's CA and trust only when they are what the
// leader read: otherwise it refuses and changes nothing. Taken up, a new
// issuing CA brings a new key and certificate; the same one twice
// changes nothing. An agent on --pki-dir refuses outright.
func TestCAKeeperSync(t *testing.T) {
	a, _ := testAgent(t)
	if err := a.setupTLS(t.Context()); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(t.Context(), a.cfg.BackupStore, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old, err := pki.LoadStoreCA(t.Context(), s, isNotFound, time.Now())
	if err != nil {
		t.Fatal(err)
	}
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

	// The leader read the old CA as the issuer: refused, nothing written.
	err = k.Sync(t.Context(), both, pki.Fingerprint(old.Cert))
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
