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

// --validity has a default of a day and a maximum of 90 days.
func TestIssueClientCertValidity(t *testing.T) {
	ca := mustCA(t, time.Now(), 365*24*time.Hour)
	pkiDir := writeCADir(t, ca)
	tests := []struct {
		name     string
		args     []string
		want     time.Duration // the certificate's life from now
		wantText string        // in the error, when refused
	}{
		{"the default is a day", nil, 24 * time.Hour, ""},
		{"the maximum", []string{"--validity=2160h"}, 2160 * time.Hour, ""},
		{"over the maximum", []string{"--validity=2161h"}, 0, "--validity 2161h0m0s is over the maximum of 2160h0m0s (90 days)"},
		{"a year", []string{"--validity=8760h"}, 0, "over the maximum of 2160h0m0s"},
		{"zero", []string{"--validity=0"}, 0, "must be positive"},
		{"negative", []string{"--validity=-1h"}, 0, "must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCtlEnv(t)
			out := filepath.Join(t.TempDir(), "certs")
			before := time.Now()
			_, _, err := e.run(t, append([]string{"--pki-dir=" + pkiDir, "issue-client-cert", "--out", out}, tt.args...)...)
			if tt.wantText != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantText) || exitCode(err) != exitUsage {
					t.Fatalf("issue-client-cert %v: %v (exit %d), want a usage error saying %q", tt.args, err, exitCode(err), tt.wantText)
				}
				if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("files were written: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			data, _ := os.ReadFile(filepath.Join(out, "client.crt"))
			c, err := pki.ParseCertPEM(data)
			if err != nil {
				t.Fatal(err)
			}
			if life := c.NotAfter.Sub(before); life < tt.want-time.Minute || life > tt.want+time.Minute {
				t.Errorf("the certificate lasts %s from now, want %s", life, tt.want)
			}
		})
	}
}

// The files: the key is 0600 whatever was there, the certificates 0644,
// each whole and matching; a symbolic link in place of any of them is
// refused before anything is written, and its target left alone; --out is
// created 0700 and refused when every user may write to it.
func TestIssueClientCertFiles(t *testing.T) {
	ca := mustCA(t, time.Now(), 365*24*time.Hour)
	pkiDir := writeCADir(t, ca)
	newDir := func(t *testing.T) string { return filepath.Join(t.TempDir(), "certs") }
	existing := func(t *testing.T) string {
		d := newDir(t)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		return d
	}
	victim := func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), "precious")
		if err := os.WriteFile(p, []byte("precious"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		// setup prepares --out and returns it, and the file a link points
		// to, if any.
		setup    func(t *testing.T) (out, target string)
		wantIs   error
		wantText string
	}{
		{"a new folder", func(t *testing.T) (string, string) { return newDir(t), "" }, nil, ""},
		{"an old key readable by all becomes 0600", func(t *testing.T) (string, string) {
			d := existing(t)
			if err := os.WriteFile(filepath.Join(d, "client.key"), []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(d, "client.key"), 0o644); err != nil {
				t.Fatal(err)
			}
			return d, ""
		}, nil, ""},
		{"--out through a link is the operator's choice", func(t *testing.T) (string, string) {
			link := filepath.Join(t.TempDir(), "link")
			if err := os.Symlink(existing(t), link); err != nil {
				t.Fatal(err)
			}
			return link, ""
		}, nil, ""},
		{"a link at client.key", func(t *testing.T) (string, string) {
			d, v := existing(t), victim(t)
			if err := os.Symlink(v, filepath.Join(d, "client.key")); err != nil {
				t.Fatal(err)
			}
			return d, v
		}, pki.ErrSymlink, "client.key"},
		{"a link at ca.crt", func(t *testing.T) (string, string) {
			d, v := existing(t), victim(t)
			if err := os.Symlink(v, filepath.Join(d, "ca.crt")); err != nil {
				t.Fatal(err)
			}
			return d, v
		}, pki.ErrSymlink, "ca.crt"},
		{"a folder every user may write to", func(t *testing.T) (string, string) {
			d := existing(t)
			if err := os.Chmod(d, 0o777); err != nil {
				t.Fatal(err)
			}
			return d, ""
		}, nil, "may be written by every user"},
		{"a folder of another user", func(t *testing.T) (string, string) {
			d := existing(t)
			if err := os.Chown(d, 65534, 65534); err != nil {
				t.Fatalf("chown (the tests run as root): %v", err)
			}
			return d, ""
		}, nil, "belongs to user 65534, not to you"},
		{"--out is a file", func(t *testing.T) (string, string) {
			return victim(t), ""
		}, nil, "is not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newCtlEnv(t)
			out, target := tt.setup(t)
			stdout, _, err := e.run(t, "--pki-dir="+pkiDir, "issue-client-cert", "--out", out)
			if tt.wantIs != nil || tt.wantText != "" {
				if err == nil || (tt.wantIs != nil && !errors.Is(err, tt.wantIs)) || !strings.Contains(err.Error(), tt.wantText) {
					t.Fatalf("issue-client-cert: %v, want %v saying %q", err, tt.wantIs, tt.wantText)
				}
				if target != "" {
					if got, _ := os.ReadFile(target); string(got) != "precious" {
						t.Errorf("the link's target now holds %q", got)
					}
				}
				if _, err := os.Stat(filepath.Join(out, "client.crt")); err == nil {
					t.Error("client.crt was written although the command was refused")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o700 {
				t.Errorf("--out: mode %v, %v; want 0700", st.Mode().Perm(), err)
			}
			for name, mode := range map[string]os.FileMode{"client.key": 0o600, "client.crt": 0o644, "ca.crt": 0o644} {
				st, err := os.Lstat(filepath.Join(out, name))
				if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != mode {
					t.Errorf("%s: %v, %v; want a regular file with mode %v", name, st.Mode(), err, mode)
				}
			}
			// The key and the certificate are whole and belong together,
			// and ca.crt is the CA that signed.
			if _, err := loadClientFiles(filepath.Join(out, "ca.crt"), filepath.Join(out, "client.crt"), filepath.Join(out, "client.key"), time.Now()); err != nil {
				t.Errorf("the files do not work together: %v", err)
			}
			if data, _ := os.ReadFile(filepath.Join(out, "ca.crt")); string(data) != string(ca.CertPEM) {
				t.Error("ca.crt is not the CA")
			}
			if !strings.Contains(stdout, "client.key") {
				t.Errorf("stdout %q", stdout)
			}
			entries, _ := os.ReadDir(out)
			if len(entries) != 3 {
				t.Errorf("--out holds %d entries, want the 3 files and no leftovers", len(entries))
			}
		})
	}
}

// issue-client-cert says which CA signed: its name, serial, SHA-256
// fingerprint (as openssl prints it) and expiry.
func TestIssueClientCertNamesTheCA(t *testing.T) {
	ca := mustCA(t, time.Now(), 365*24*time.Hour)
	e := newCtlEnv(t)
	stdout, _, err := e.run(t, "--pki-dir="+writeCADir(t, ca), "issue-client-cert", "--out", filepath.Join(t.TempDir(), "certs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`issued by CA "etcd-manager CA"`, "serial " + pki.Serial(ca.Cert), "SHA-256 fingerprint " + pki.Fingerprint(ca.Cert),
		"expires " + ca.Cert.NotAfter.UTC().Format(time.RFC3339)} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout %q does not say %q", stdout, want)
		}
	}
}

// issue-client-cert never writes a certificate that etcd's peer port
// would take for a node's: it has no SANs, and a --name under the
// reserved domain is refused before anything is written.
func TestIssueClientCertCannotCarryTheNodeMarker(t *testing.T) {
	ca := mustCA(t, time.Now(), 365*24*time.Hour)
	pkiDir := writeCADir(t, ca)
	for _, name := range []string{pki.NodeMarker("test"), "Node.Test.Etcd-Manager.Internal.", "*.test.etcd-manager.internal"} {
		e := newCtlEnv(t)
		out := filepath.Join(t.TempDir(), "certs")
		_, _, err := e.run(t, "--pki-dir="+pkiDir, "issue-client-cert", "--out", out, "--name", name)
		if err == nil || !strings.Contains(err.Error(), "reserved for node certificates") || exitCode(err) != exitUsage {
			t.Errorf("--name %q: %v, want a usage error saying it is reserved", name, err)
		}
		if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("--name %q: files were written: %v", name, err)
		}
	}
	e := newCtlEnv(t)
	out := filepath.Join(t.TempDir(), "certs")
	if _, _, err := e.run(t, "--pki-dir="+pkiDir, "issue-client-cert", "--out", out, "--name", "ops"); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(out, "client.crt"))
	c, err := pki.ParseCertPEM(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.DNSNames) != 0 || len(c.IPAddresses) != 0 || pki.CarriesName(c, pki.NodeMarker("test")) || pki.PeerRole(c) != pki.RoleClient {
		t.Errorf("the client certificate has names %v %v and role %q; want none, and the client role", c.DNSNames, c.IPAddresses, pki.PeerRole(c))
	}
}
