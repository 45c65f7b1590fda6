package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

func mustCA(t *testing.T, at time.Time, validity time.Duration) *pki.CA {
	t.Helper()
	ca, err := pki.GenerateCA(at, validity)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// writeCADir writes ca as a --pki-dir and returns the folder.
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

// putStoreCA writes the store's CA object as the agents would.
func (e ctlEnv) putStoreCA(t *testing.T, data []byte) {
	t.Helper()
	s, err := store.Open(t.Context(), e.store, store.Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Create(t.Context(), pki.StoreCAKey, data); err != nil {
		t.Fatal(err)
	}
}

func storeObject(ca *pki.CA) []byte {
	key, _ := ca.KeyPEM()
	return append(key, ca.CertPEM...)
}

// The ctl refuses a CA that is out of date, from --pki-dir or from the
// store, before it issues anything, and says which CA, its dates, and
// what to do; an oversized CA object in the store is refused by name.
func TestCtlRefusesABadCA(t *testing.T) {
	now := time.Now()
	expired := mustCA(t, now.Add(-48*time.Hour), 24*time.Hour)
	future := mustCA(t, now.Add(48*time.Hour), 24*time.Hour)
	tests := []struct {
		name string
		// setup returns the extra flags.
		setup    func(t *testing.T, e ctlEnv) []string
		wantIs   error
		wantText []string
	}{
		{"an expired --pki-dir", func(t *testing.T, e ctlEnv) []string {
			return []string{"--pki-dir=" + writeCADir(t, expired)}
		}, pki.ErrCAExpired, []string{"expired at " + expired.Cert.NotAfter.UTC().Format(time.RFC3339), "valid from", "--pki-dir"}},
		{"a --pki-dir not valid yet", func(t *testing.T, e ctlEnv) []string {
			return []string{"--pki-dir=" + writeCADir(t, future)}
		}, pki.ErrCANotYetValid, []string{"is valid from " + future.Cert.NotBefore.UTC().Format(time.RFC3339), "check this machine's clock"}},
		{"an expired CA in the store", func(t *testing.T, e ctlEnv) []string {
			e.putStoreCA(t, storeObject(expired))
			return nil
		}, pki.ErrCAExpired, []string{"expired at", "backup store's pki/ca.key"}},
		{"an oversized CA object in the store", func(t *testing.T, e ctlEnv) []string {
			e.putStoreCA(t, make([]byte, pki.MaxStoreCASize+1))
			return nil
		}, store.ErrTooLarge, []string{"pki/ca.key"}},
	}
	for _, tt := range tests {
		for _, cmd := range [][]string{{"issue-client-cert", "--out"}, {"status"}} {
			t.Run(tt.name+"/"+cmd[0], func(t *testing.T) {
				e := newCtlEnv(t)
				args := tt.setup(t, e)
				out := filepath.Join(t.TempDir(), "certs")
				if cmd[0] == "issue-client-cert" {
					args = append(args, cmd[0], "--out", out)
				} else {
					args = append(args, cmd...)
				}
				_, _, err := e.run(t, args...)
				if !errors.Is(err, tt.wantIs) {
					t.Fatalf("%v: %v, want %v", args, err, tt.wantIs)
				}
				for _, w := range tt.wantText {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%q does not say %q", err, w)
					}
				}
				if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("issue-client-cert wrote files: %v", err)
				}
			})
		}
	}
}
