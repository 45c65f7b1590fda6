package pki

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// caAt is a CA valid from at (less a minute) for validity.
func caAt(t *testing.T, at time.Time, validity time.Duration) *CA {
	t.Helper()
	ca, err := GenerateCA(at, validity)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// The CA's dates: an expired CA and one not valid yet are refused, and
// the error gives the CA's name and its dates.
func TestCAValidAt(t *testing.T) {
	ca := caAt(t, t0, 24*time.Hour) // valid 11:59 on the 22nd to 12:00 on the 23rd
	tests := []struct {
		name     string
		at       time.Time
		wantIs   error
		wantText []string
	}{
		{"within its dates", t0.Add(time.Hour), nil, nil},
		{"expired", t0.Add(25 * time.Hour), ErrCAExpired,
			[]string{`"etcd-manager CA"`, "expired at 2026-11-23T12:00:00Z", "valid from 2026-11-22T11:59:00Z", Serial(ca.Cert)}},
		{"not valid yet", t0.Add(-time.Hour), ErrCANotYetValid,
			[]string{"valid from 2026-11-22T11:59:00Z to 2026-11-23T12:00:00Z", "clock says 2026-11-22T11:00:00Z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ca.ValidAt(tt.at)
			if !errors.Is(err, tt.wantIs) || (tt.wantIs == nil) != (err == nil) {
				t.Fatalf("ValidAt: %v, want %v", err, tt.wantIs)
			}
			for _, w := range tt.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
}

// The fingerprint and serial read as openssl prints them.
func TestFingerprintAndSerial(t *testing.T) {
	ca := mustCA(t)
	sum := sha256.Sum256(ca.Cert.Raw)
	if got, want := strings.ReplaceAll(Fingerprint(ca.Cert), ":", ""), strings.ToUpper(hex.EncodeToString(sum[:])); got != want {
		t.Errorf("Fingerprint %s, want %s", got, want)
	}
	pairs := regexp.MustCompile(`^[0-9A-F]{2}(:[0-9A-F]{2})*$`)
	if f := Fingerprint(ca.Cert); !pairs.MatchString(f) || len(f) != 32*3-1 {
		t.Errorf("Fingerprint %q is not 32 colon-separated pairs", f)
	}
	if s := Serial(ca.Cert); !pairs.MatchString(s) || strings.ReplaceAll(s, ":", "") != strings.ToUpper(hex.EncodeToString(ca.Cert.SerialNumber.Bytes())) {
		t.Errorf("Serial %q, want the serial %x in colon-separated pairs", s, ca.Cert.SerialNumber)
	}
}

// A CA given as files (--pki-dir) that is out of date is refused when it
// is loaded, naming the folder and the dates and saying what to do.
func TestLoadCADirRefusesAnOutOfDateCA(t *testing.T) {
	write := func(ca *CA) string {
		dir := t.TempDir()
		key, _ := ca.KeyPEM()
		if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "ca.key"), key, 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	current := write(caAt(t, t0, 24*time.Hour))
	tests := []struct {
		name     string
		dir      string
		at       time.Time
		wantIs   error
		wantText []string
	}{
		{"current", current, t0.Add(time.Hour), nil, nil},
		{"expired", current, t0.Add(48 * time.Hour), ErrCAExpired,
			[]string{"expired at 2026-11-23T12:00:00Z", "--pki-dir " + current, "put a current CA's ca.crt and ca.key there"}},
		{"not valid yet", current, t0.Add(-48 * time.Hour), ErrCANotYetValid,
			[]string{"valid from 2026-11-22T11:59:00Z", "--pki-dir " + current, "check this machine's clock"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ca, err := LoadCADir(tt.dir, tt.at)
			if !errors.Is(err, tt.wantIs) || (tt.wantIs == nil) != (err == nil) || (err == nil) != (ca != nil) {
				t.Fatalf("LoadCADir: %v, want %v", err, tt.wantIs)
			}
			for _, w := range tt.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
}

// A --pki-dir ca.key that group or others may read is refused, saying
// how to fix it; a private one is taken.
func TestLoadCADirRefusesAWideKey(t *testing.T) {
	ca := caAt(t, t0, 24*time.Hour)
	key, _ := ca.KeyPEM()
	for _, tt := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o600, true}, {0o400, true}, {0o640, false}, {0o644, false}, {0o606, false}} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "ca.key")
		if err := os.WriteFile(p, key, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, tt.mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadCADir(dir, t0.Add(time.Hour))
		if tt.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "chmod 600 "+p)) {
			t.Errorf("ca.key of mode %04o: %v, want ok %v (or the fix named)", tt.mode, err, tt.ok)
		}
	}
}

// The store's CA object is read with a bound, and an out-of-date one is
// refused, not replaced: replacing the CA is the operator's decision.
func TestLoadStoreCA(t *testing.T) {
	isNF := func(err error) bool { return errors.Is(err, errMissing) }
	isEx := func(err error) bool { return errors.Is(err, errExists) }
	stored := func(ca *CA) []byte {
		k, _ := ca.KeyPEM()
		return append(k, ca.CertPEM...)
	}
	ca := caAt(t, t0, 24*time.Hour)
	tests := []struct {
		name     string
		object   []byte
		at       time.Time
		wantIs   error
		wantText []string
	}{
		{"current", stored(ca), t0.Add(time.Hour), nil, nil},
		{"expired", stored(ca), t0.Add(48 * time.Hour), ErrCAExpired,
			[]string{"expired at 2026-11-23T12:00:00Z", "backup store's pki/ca.key", "--pki-dir", "move pki/ca.key and pki/ca.crt aside"}},
		{"not valid yet", stored(ca), t0.Add(-48 * time.Hour), ErrCANotYetValid,
			[]string{"backup store's pki/ca.key", "check this machine's clock"}},
		{"oversized", make([]byte, MaxStoreCASize+1), t0, errTooLarge, []string{"pki/ca.key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &memStore{objects: map[string][]byte{StoreCAKey: tt.object}}
			_, err := LoadStoreCA(t.Context(), s, isNF, tt.at)
			if !errors.Is(err, tt.wantIs) || (tt.wantIs == nil) != (err == nil) {
				t.Fatalf("LoadStoreCA: %v, want %v", err, tt.wantIs)
			}
			for _, w := range tt.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			if len(s.maxes) != 1 || s.maxes[0] != MaxStoreCASize {
				t.Errorf("read with bounds %v, want one read of at most %d bytes", s.maxes, MaxStoreCASize)
			}
			// EnsureStoreCA does not paper over a bad CA with a new one.
			got, created, err := EnsureStoreCA(t.Context(), s, isNF, isEx, tt.at)
			if created || !errors.Is(err, tt.wantIs) || (err == nil && !got.Cert.Equal(ca.Cert)) {
				t.Errorf("EnsureStoreCA: created=%v, %v", created, err)
			}
			if string(s.objects[StoreCAKey]) != string(tt.object) {
				t.Error("EnsureStoreCA replaced the stored CA")
			}
		})
	}
}

// No node certificate is issued from an out-of-date CA, and nothing is
// written.
func TestEnsureNodeCertRefusesAnOutOfDateCA(t *testing.T) {
	ca := caAt(t, t0, time.Hour)
	f := NodeFiles{Dir: filepath.Join(t.TempDir(), "pki")}
	_, _, err := EnsureNodeCert(ca, nil, f, nodeReq(time.Hour), t0.Add(2*time.Hour))
	if !errors.Is(err, ErrCAExpired) || !strings.Contains(err.Error(), "cannot issue the node certificate") {
		t.Fatalf("EnsureNodeCert with an expired CA: %v", err)
	}
	if _, err := os.Stat(f.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("files were written: %v", err)
	}
}
