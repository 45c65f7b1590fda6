package pki

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func storeWith(t *testing.T, ca *CA, r *Rotation) *memStore {
	t.Helper()
	kp, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	s := &memStore{objects: map[string][]byte{StoreCAKey: append(kp, ca.CertPEM...)}}
	if r != nil {
		s.objects[StoreRotation] = r.Encode()
	}
	return s
}

func TestRotationTrustByPhase(t *testing.T) {
	old, fresh := mustCA(t), mustCA(t)
	isNF := func(err error) bool { return errors.Is(err, errMissing) }
	both := []string{Fingerprint(old.Cert), Fingerprint(fresh.Cert)}
	slices.Sort(both)
	for _, tt := range []struct {
		phase   string
		issuer  *CA
		trust   []string
		wantErr string
	}{
		{PhaseTrustBoth, old, both, ""},
		{PhaseTrusted, old, both, ""},
		// rotate-ca continue writes the new CA before the phase: a crash
		// between the two leaves this, which is consistent.
		{PhaseTrusted, fresh, both, ""},
		{PhaseReissue, fresh, both, ""},
		{PhaseReissued, fresh, both, ""},
		{PhaseDropOld, fresh, []string{Fingerprint(fresh.Cert)}, ""},
		{PhaseReissue, old, nil, "still holds the old CA"},
		{PhaseDropOld, old, nil, "still holds the old CA"},
		{PhaseTrustBoth, mustCA(t), nil, "is neither of its CAs"},
	} {
		t.Run(tt.phase, func(t *testing.T) {
			r := NewRotation(old.Cert, fresh.Cert, t0)
			r.Phase = tt.phase
			st, err := LoadStoreTrust(t.Context(), storeWith(t, tt.issuer, r), isNF, t0)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrBadRotation) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := Fingerprints(st.Trust); !slices.Equal(got, tt.trust) {
				t.Errorf("trust %v, want %v", got, tt.trust)
			}
			if !st.CA.Cert.Equal(tt.issuer.Cert) || st.Rotation == nil || st.Rotation.Phase != tt.phase {
				t.Errorf("issuer or rotation wrong: %+v", st)
			}
		})
	}
	// Without a record the CA trusts itself alone.
	st, err := LoadStoreTrust(t.Context(), storeWith(t, old, nil), isNF, t0)
	if err != nil || st.Rotation != nil || !bytes.Equal(st.Trust, old.CertPEM) {
		t.Fatalf("no rotation: %+v, %v", st, err)
	}
}

// A record from the store is untrusted: each kind of junk is refused
// with ErrBadRotation, and none panics.
func TestDecodeRotationRefusesJunk(t *testing.T) {
	old, fresh := mustCA(t), mustCA(t)
	good := NewRotation(old.Cert, fresh.Cert, t0)
	leaf, _, err := old.Issue(nodeReq(time.Hour), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(r *Rotation)) []byte {
		r := *good
		f(&r)
		return r.Encode()
	}
	for _, tt := range []struct {
		name string
		data []byte
		want string
	}{
		{"not JSON", []byte("{"), "unexpected EOF"},
		{"too large", bytes.Repeat([]byte(" "), MaxRotationSize+1), "over"},
		{"a newer format", edit(func(r *Rotation) { r.Format = RotationFormat + 1 }), "newer"},
		{"an unknown phase", edit(func(r *Rotation) { r.Phase = "../../x" }), "unknown phase"},
		{"no new CA", edit(func(r *Rotation) { r.NewCA = "" }), "newCA"},
		{"a leaf for a CA", edit(func(r *Rotation) { r.OldCA = string(leaf) }), "oldCA"},
		{"two CAs in one field", edit(func(r *Rotation) { r.NewCA = string(Bundle(old.Cert, fresh.Cert)) }), "exactly one"},
		{"the same CA twice", edit(func(r *Rotation) { r.NewCA = r.OldCA }), "the same"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeRotation(tt.data)
			if !errors.Is(err, ErrBadRotation) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want ErrBadRotation with %q", err, tt.want)
			}
		})
	}
	r, err := DecodeRotation(good.Encode())
	if err != nil || !r.Old().Equal(old.Cert) || !r.New().Equal(fresh.Cert) || r.Phase != PhaseTrustBoth {
		t.Fatalf("round trip: %+v, %v", r, err)
	}
}

// serveTLS serves TLS on loopback with cfg, and returns a dial that
// reports whether the server took the client: under TLS 1.3 the server
// checks the client's certificate after the client's handshake returns,
// so the server writes a byte once its own handshake passed.
func serveTLS(t *testing.T, cfg *tls.Config) func(*tls.Config) error {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() == nil {
					_, _ = c.Write([]byte("k"))
				}
			}()
		}
	}()
	return func(cfg *tls.Config) error {
		c, err := tls.Dial("tcp", l.Addr().String(), cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		return err
	}
}

// The agent's etcd and peer API clients take a node certificate of their
// own cluster, or one from before the node marker, and refuse another
// cluster's (a CA shared through --pki-dir) and an operator's.
func TestClientConfigChecksTheMarker(t *testing.T) {
	now := time.Now()
	ca := mustCAAt(t, now)
	marker, other := NodeMarker("main"), NodeMarker("events")
	cli := NodeFiles{Dir: t.TempDir()}
	ip := []net.IP{net.ParseIP("127.0.0.1")}
	if _, _, err := EnsureNodeCert(ca, nil, cli, CertRequest{CommonName: "c", Role: RoleNode, DNSNames: []string{marker}, IPs: ip, Validity: time.Hour}, now); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		req  CertRequest
		ok   bool
	}{
		{"this cluster's node", CertRequest{CommonName: "s", Role: RoleNode, DNSNames: []string{marker}, IPs: ip, Validity: time.Hour}, true},
		{"a node from before the marker", CertRequest{CommonName: "s", Role: RoleNode, IPs: ip, Validity: time.Hour}, true},
		{"another cluster's node", CertRequest{CommonName: "s", Role: RoleNode, DNSNames: []string{other}, IPs: ip, Validity: time.Hour}, false},
		{"an operator's certificate", CertRequest{CommonName: "s", Role: RoleClient, IPs: ip, Validity: time.Hour}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := NodeFiles{Dir: t.TempDir()}
			certPEM, keyPEM, err := ca.Issue(tt.req, nil, now)
			if err != nil {
				t.Fatal(err)
			}
			if err := WriteFilesAtomic(FileData{srv.CA(), ca.CertPEM, 0o644}, FileData{srv.Cert(), certPEM, 0o644}, FileData{srv.Key(), keyPEM, 0o600}); err != nil {
				t.Fatal(err)
			}
			dial := serveTLS(t, ServerConfig(srv, TrustFile(srv.CA()), nil))
			for name, cfg := range map[string]*tls.Config{"etcd client": ClientConfig(cli, TrustFile(cli.CA()), marker), "peer client": NodeClientConfig(cli, TrustFile(cli.CA()), marker)} {
				if err := dial(cfg); (err == nil) != tt.ok {
					t.Errorf("%s: %v, want ok=%v", name, err, tt.ok)
				}
			}
		})
	}
}

// The peer API and the agent's etcd clients take up a change of the
// trust file at the next handshake, with no restart: a server with a
// certificate from a CA added to the file is accepted, and one from a CA
// dropped from it refused.
func TestTrustFileReloads(t *testing.T) {
	now := time.Now()
	old, fresh := mustCAAt(t, now), mustCAAt(t, now)
	srvDir, cliDir := t.TempDir(), t.TempDir()
	srv, cli := NodeFiles{Dir: srvDir}, NodeFiles{Dir: cliDir}
	req := CertRequest{CommonName: "n", Role: RoleNode, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: time.Hour}
	if _, _, err := EnsureNodeCert(old, nil, srv, req, now); err != nil {
		t.Fatal(err)
	}
	if _, _, err := EnsureNodeCert(old, nil, cli, req, now); err != nil {
		t.Fatal(err)
	}
	dial := serveTLS(t, ServerConfig(srv, TrustFile(srv.CA()), nil))
	etcdClient := ClientConfig(cli, TrustFile(cli.CA()), "")
	peerClient := NodeClientConfig(cli, TrustFile(cli.CA()), "")
	if err := dial(etcdClient); err != nil {
		t.Fatalf("same CA: %v", err)
	}
	// The server moves to the new CA (trusting both); the client trusts
	// the old one alone: refused.
	if _, _, err := EnsureNodeCert(fresh, Bundle(old.Cert, fresh.Cert), srv, req, now); err != nil {
		t.Fatal(err)
	}
	if err := dial(etcdClient); err == nil {
		t.Fatal("a server certificate from a CA the client does not trust was accepted")
	}
	// The client's file gains the new CA: accepted at once, by both.
	if _, _, err := EnsureNodeCert(old, Bundle(old.Cert, fresh.Cert), cli, req, now); err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*tls.Config{"etcd client": etcdClient, "peer client": peerClient} {
		if err := dial(cfg); err != nil {
			t.Errorf("%s after the trust file gained the new CA: %v", name, err)
		}
	}
	// The server drops the old CA: the client's old certificate is
	// refused.
	if _, _, err := EnsureNodeCert(fresh, fresh.CertPEM, srv, req, now); err != nil {
		t.Fatal(err)
	}
	if err := dial(peerClient); err == nil {
		t.Error("a client certificate from a dropped CA was accepted")
	}
	// A trust file that does not hold the issuing CA is refused before
	// anything is written.
	before, _ := os.ReadFile(cli.CA())
	if _, _, err := EnsureNodeCert(fresh, old.CertPEM, cli, req, now); err == nil || !strings.Contains(err.Error(), "do not include") {
		t.Errorf("trust without the issuer: %v", err)
	}
	if after, _ := os.ReadFile(cli.CA()); !bytes.Equal(before, after) {
		t.Error("a refused trust was written")
	}
}
