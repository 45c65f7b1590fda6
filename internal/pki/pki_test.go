package pki

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func mustCA(t *testing.T) *CA { return mustCAAt(t, t0) }

func mustCAAt(t *testing.T, at time.Time) *CA {
	t.Helper()
	ca, err := GenerateCA(at, DefaultCAValidity)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func nodeReq(validity time.Duration) CertRequest {
	return CertRequest{CommonName: "node-1", Role: RoleNode, DNSNames: []string{"localhost"},
		IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: validity}
}

func TestVerify(t *testing.T) {
	ca, other := mustCA(t), mustCA(t)
	issue := func(ca *CA, role string, validity time.Duration) []byte {
		req := nodeReq(validity)
		req.Role = role
		c, _, err := ca.Issue(req, nil, t0)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	tests := []struct {
		name    string
		cert    []byte
		role    string
		at      time.Time
		wantErr string
	}{
		{"a node certificate from the CA", issue(ca, RoleNode, time.Hour), RoleNode, t0.Add(time.Minute), ""},
		{"a client certificate where a node one is wanted", issue(ca, RoleClient, time.Hour), RoleNode, t0, "is not a etcd-manager-node certificate"},
		{"expired", issue(ca, RoleNode, time.Hour), RoleNode, t0.Add(2 * time.Hour), "expired at 2026-11-22T13:00:00Z"},
		{"not yet valid", issue(ca, RoleNode, time.Hour), RoleNode, t0.Add(-time.Hour), "is not valid until"},
		{"from another CA", issue(other, RoleNode, time.Hour), RoleNode, t0, "was not issued by this cluster's CA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseCertPEM(tt.cert)
			if err != nil {
				t.Fatal(err)
			}
			err = ca.Verify(c, tt.role, tt.at)
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Verify: %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestParseCARefusesMismatches(t *testing.T) {
	a, b := mustCA(t), mustCA(t)
	bKey, _ := b.KeyPEM()
	if _, err := ParseCA(a.CertPEM, bKey); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("a CA with another CA's key: %v", err)
	}
	leaf, leafKey, _ := a.Issue(nodeReq(time.Hour), nil, t0)
	if _, err := ParseCA(leaf, leafKey); err == nil || !strings.Contains(err.Error(), "is not a CA certificate") {
		t.Errorf("a leaf as CA: %v", err)
	}
	aKey, _ := a.KeyPEM()
	if got, err := ParseCA(a.CertPEM, aKey); err != nil || !got.Cert.Equal(a.Cert) {
		t.Errorf("round trip: %v", err)
	}
}

func TestEnsureNodeCert(t *testing.T) {
	ca := mustCA(t)
	f := NodeFiles{Dir: t.TempDir()}
	req := nodeReq(30 * time.Minute)
	c1, fresh, err := EnsureNodeCert(ca, nil, f, req, t0)
	if err != nil || !fresh {
		t.Fatalf("first: fresh=%v, %v", fresh, err)
	}
	key1, _ := os.ReadFile(f.Key())
	if st, _ := os.Stat(f.Key()); st.Mode().Perm() != 0o600 {
		t.Errorf("node.key mode %v, want 0600", st.Mode().Perm())
	}
	steps := []struct {
		name      string
		at        time.Time
		req       CertRequest
		ca        *CA
		wantFresh bool
		// newKey: a renewal by the same CA keeps the key, so that
		// node.crt alone changes; another CA (a rotation) gets a new one.
		newKey bool
	}{
		{"before two thirds of its life: kept", t0.Add(19 * time.Minute), req, ca, false, false},
		{"past two thirds: renewed", t0.Add(21 * time.Minute), req, ca, true, false},
		{"an added address: reissued", t0.Add(22 * time.Minute), func() CertRequest {
			r := req
			r.IPs = append(r.IPs, net.ParseIP("127.0.0.9"))
			return r
		}(), ca, true, false},
		{"another CA: reissued with a new key", t0.Add(23 * time.Minute), req, mustCA(t), true, true},
	}
	prev, prevKey := c1, key1
	for _, s := range steps {
		c, fresh, err := EnsureNodeCert(s.ca, nil, f, s.req, s.at)
		if err != nil || fresh != s.wantFresh {
			t.Fatalf("%s: fresh=%v, %v", s.name, fresh, err)
		}
		if fresh == c.Equal(prev) {
			t.Fatalf("%s: fresh=%v but the certificate changed=%v", s.name, fresh, !c.Equal(prev))
		}
		if err := s.ca.Verify(c, RoleNode, s.at); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		key, _ := os.ReadFile(f.Key())
		if changed := string(key) != string(prevKey); changed != s.newKey {
			t.Errorf("%s: key replaced=%v, want %v", s.name, changed, s.newKey)
		}
		if pair, err := tls.LoadX509KeyPair(f.Cert(), f.Key()); err != nil || pair.Leaf == nil {
			t.Errorf("%s: the files do not make a pair: %v", s.name, err)
		}
		prev, prevKey = c, key
	}
}

// memStore is a store whose Create succeeds once per key. It records the
// bound of each ReadMax.
type memStore struct {
	mu      sync.Mutex
	objects map[string][]byte
	maxes   []int64
}

var errMissing, errExists, errTooLarge = errors.New("missing"), errors.New("exists"), errors.New("too large")

func (m *memStore) Read(_ context.Context, k string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.objects[k]; ok {
		return d, nil
	}
	return nil, errMissing
}
func (m *memStore) ReadMax(ctx context.Context, k string, max int64) ([]byte, error) {
	m.mu.Lock()
	m.maxes = append(m.maxes, max)
	m.mu.Unlock()
	d, err := m.Read(ctx, k)
	if err == nil && int64(len(d)) > max {
		return nil, fmt.Errorf("%w: %s is %d bytes", errTooLarge, k, len(d))
	}
	return d, err
}
func (m *memStore) Create(_ context.Context, k string, d []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objects[k]; ok {
		return errExists
	}
	m.objects[k] = d
	return nil
}
func (m *memStore) Write(_ context.Context, k string, d []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.objects[k] = d
	return nil
}

func TestEnsureStoreCAOnceUnderRace(t *testing.T) {
	s := &memStore{objects: map[string][]byte{}}
	isNF := func(err error) bool { return errors.Is(err, errMissing) }
	isEx := func(err error) bool { return errors.Is(err, errExists) }
	if _, err := LoadStoreCA(t.Context(), s, isNF, t0); !errors.Is(err, ErrNoCA) {
		t.Fatalf("empty store: %v", err)
	}
	cas := make([]*CA, 8)
	created := make([]bool, 8)
	var wg sync.WaitGroup
	for i := range cas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			cas[i], created[i], err = EnsureStoreCA(t.Context(), s, isNF, isEx, t0)
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	n := 0
	for i := range cas {
		if created[i] {
			n++
		}
		if !cas[i].Cert.Equal(cas[0].Cert) {
			t.Fatal("agents racing to create the CA ended with different CAs")
		}
	}
	if n != 1 {
		t.Fatalf("%d agents created the CA, want 1", n)
	}
	if crt, _ := s.Read(t.Context(), StoreCACert); string(crt) != string(cas[0].CertPEM) {
		t.Error("pki/ca.crt does not hold the CA certificate")
	}
}

// A handshake against ServerConfig: a node certificate from the CA gets
// in; none, another CA's, or an expired one is refused, and the refusal
// says why.
func TestServerConfigRefusals(t *testing.T) {
	now := time.Now()
	ca, other := mustCAAt(t, now.Add(-3*time.Hour)), mustCAAt(t, now.Add(-3*time.Hour))
	srvFiles := NodeFiles{Dir: t.TempDir()}
	if _, _, err := EnsureNodeCert(ca, nil, srvFiles, nodeReq(time.Hour), now); err != nil {
		t.Fatal(err)
	}
	trusted := ca.Pool()
	client := func(ca *CA, issued time.Time, validity time.Duration) *tls.Config {
		req := nodeReq(validity)
		req.Role = RoleClient
		c, k, err := ca.Issue(req, nil, issued)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		// It trusts the server, so that the server's own check is tested.
		return StaticClientConfig(pair, trusted)
	}
	noCert := &tls.Config{RootCAs: ca.Pool()}
	tests := []struct {
		name    string
		cfg     *tls.Config
		wantErr string
	}{
		{"a client certificate from the CA", client(ca, now, time.Hour), ""},
		{"no certificate", noCert, "the client presented no certificate"},
		{"another CA", client(other, now, time.Hour), "was not issued by this cluster's CA"},
		{"expired", client(ca, now.Add(-2*time.Hour), time.Hour), "expired at"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rejected error
			var rejectedFrom net.Addr
			srvCfg := ServerConfig(srvFiles, TrustPool(ca.Pool()), func(remote net.Addr, err error) { rejectedFrom, rejected = remote, err })
			l, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			done := make(chan error, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				done <- c.(*tls.Conn).Handshake()
			}()
			cfg := tt.cfg.Clone()
			cfg.ServerName = "127.0.0.1"
			raw, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			clientAddr := raw.LocalAddr().String()
			c := tls.Client(raw, cfg)
			err = c.Handshake()
			if err == nil {
				// TLS 1.3: a refused client learns it on its first read.
				_, err = c.Read(make([]byte, 1))
				c.Close()
			}
			srvErr := <-done
			if tt.wantErr == "" {
				if srvErr != nil {
					t.Fatalf("refused: %v", srvErr)
				}
				return
			}
			if srvErr == nil || err == nil {
				t.Fatalf("accepted; server %v, client %v", srvErr, err)
			}
			if rejected == nil || !strings.Contains(rejected.Error(), tt.wantErr) {
				t.Fatalf("the refusal reported %v, want %q", rejected, tt.wantErr)
			}
			// The refusal names the client: the address it dialed from.
			if rejectedFrom == nil || rejectedFrom.String() != clientAddr {
				t.Errorf("the refusal named %v, want the client %s", rejectedFrom, clientAddr)
			}
		})
	}
}

// An agent dialing another's peer API trusts any node certificate from
// the CA, whatever name it dialed (discovery may go through proxies or
// NAT), and nothing else.
func TestNodeClientConfig(t *testing.T) {
	now := time.Now()
	ca := mustCAAt(t, now.Add(-time.Hour))
	other := mustCAAt(t, now.Add(-time.Hour))
	self := NodeFiles{Dir: t.TempDir()}
	if _, _, err := EnsureNodeCert(ca, nil, self, nodeReq(time.Hour), now); err != nil {
		t.Fatal(err)
	}
	server := func(ca *CA, role string) NodeFiles {
		f := NodeFiles{Dir: t.TempDir()}
		req := nodeReq(time.Hour)
		req.Role, req.IPs, req.DNSNames = role, nil, []string{"somewhere-else.example"}
		if _, _, err := EnsureNodeCert(ca, nil, f, req, now); err != nil {
			t.Fatal(err)
		}
		return f
	}
	tests := []struct {
		name    string
		files   NodeFiles
		wantErr string
	}{
		{"a node of the CA, under another name", server(ca, RoleNode), ""},
		{"a client certificate serving", server(ca, RoleClient), "is not a etcd-manager-node certificate"},
		{"a node of another CA", server(other, RoleNode), "was not issued by this cluster's CA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The server side accepts any client here: the client's check
			// is under test.
			srv := &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				c, err := tls.LoadX509KeyPair(tt.files.Cert(), tt.files.Key())
				return &c, err
			}}
			l, err := tls.Listen("tcp", "127.0.0.1:0", srv)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go func() {
				if c, err := l.Accept(); err == nil {
					_ = c.(*tls.Conn).Handshake()
					c.Close()
				}
			}()
			c, err := tls.Dial("tcp", l.Addr().String(), NodeClientConfig(self, TrustPool(ca.Pool()), ""))
			if err == nil {
				c.Close()
			}
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("dial: %v, want %q", err, tt.wantErr)
			}
		})
	}
}
