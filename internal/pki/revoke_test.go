package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"
)

func TestParseRevocations(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		wantErr string
	}{
		{name: "empty", data: `{"nodes":[]}`},
		{name: "a node with serials", data: `{"nodes":[{"nodeId":"a-1_B.c","revokedAt":"2026-12-06T00:00:00Z","serials":["abc","1"]}]}`},
		{name: "not JSON", data: `nodes`, wantErr: "invalid revocation list"},
		{name: "a bad node ID", data: `{"nodes":[{"nodeId":"../x"}]}`, wantErr: "only letters"},
		{name: "an empty node ID", data: `{"nodes":[{"nodeId":""}]}`, wantErr: "1 to 128"},
		{name: "a node twice", data: `{"nodes":[{"nodeId":"a"},{"nodeId":"a"}]}`, wantErr: "listed twice"},
		{name: "a serial in capitals", data: `{"nodes":[{"nodeId":"a","serials":["ABC"]}]}`, wantErr: "lower-case hex"},
		{name: "a serial too long", data: `{"nodes":[{"nodeId":"a","serials":["` + strings.Repeat("f", 41) + `"]}]}`, wantErr: "lower-case hex"},
		{name: "too big", data: `{"nodes":[],"x":"` + strings.Repeat("x", MaxRevokedSize) + `"}`, wantErr: "over"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRevocations([]byte(tt.data))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("ParseRevocations: %v", err)
			case tt.wantErr != "" && (err == nil || !errors.Is(err, ErrBadRevocations) || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("ParseRevocations: %v, want ErrBadRevocations saying %q", err, tt.wantErr)
			}
		})
	}
}

// Revoke adds a node, or merges serials into its entry, keeping its
// first time and reason; the list marshals and reads back the same.
func TestRevokeMerges(t *testing.T) {
	t0, t1 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	r := Revocations{}.Revoke(RevokedNode{NodeID: "a", RevokedAt: t0, Reason: "stolen", Serials: []string{"2", "1"}})
	r = r.Revoke(RevokedNode{NodeID: "a", RevokedAt: t1, Reason: "again", Serials: []string{"3", "1"}})
	r = r.Revoke(RevokedNode{NodeID: "b", RevokedAt: t1})
	data, err := r.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseRevocations(data)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := back.Node("a")
	if !ok || !a.RevokedAt.Equal(t0) || a.Reason != "stolen" || strings.Join(a.Serials, ",") != "1,2,3" {
		t.Errorf("node a: %+v", a)
	}
	if got := strings.Join(back.NodeIDs(), ","); got != "a,b" {
		t.Errorf("nodes %s, want a,b", got)
	}
}

// The CRL lists every serial, signed by the CA, in the DER form etcd
// reads (x509.ParseRevocationList); an empty list is a valid CRL too.
func TestRevocationsCRL(t *testing.T) {
	now := time.Now()
	ca, err := GenerateCA(now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		r    Revocations
		want []string
	}{
		{name: "empty", r: Revocations{}},
		{name: "two nodes", r: Revocations{Nodes: []RevokedNode{{NodeID: "a", RevokedAt: now, Serials: []string{"abc", "1f"}}, {NodeID: "b", RevokedAt: now, Serials: []string{"7"}}}},
			want: []string{"abc", "1f", "7"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			der, err := tt.r.CRL(ca, now)
			if err != nil {
				t.Fatal(err)
			}
			crl, err := x509.ParseRevocationList(der)
			if err != nil {
				t.Fatalf("etcd's parser refuses the CRL: %v", err)
			}
			if err := crl.CheckSignatureFrom(ca.Cert); err != nil {
				t.Errorf("signature: %v", err)
			}
			var got []string
			for _, e := range crl.RevokedCertificateEntries {
				got = append(got, SerialHex(e.SerialNumber))
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("serials %v, want %v", got, tt.want)
			}
		})
	}
}

// EnsureNodeCert records a new certificate's serial before it signs it,
// and issues nothing when the record fails; a current certificate is
// not recorded again.
func TestEnsureNodeCertRecordsTheSerial(t *testing.T) {
	now := time.Now()
	ca, err := GenerateCA(now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	files := NodeFiles{Dir: t.TempDir()}
	var recorded []string
	req := CertRequest{CommonName: "n1", Role: RoleNode, DNSNames: []string{"localhost"}, Validity: time.Hour,
		Record: func(serial *big.Int) error { recorded = append(recorded, SerialHex(serial)); return nil }}
	refused := req
	refused.Record = func(*big.Int) error { return errors.New("store down") }
	if _, _, err := EnsureNodeCert(ca, nil, files, refused, now); err == nil || !strings.Contains(err.Error(), "store down") {
		t.Fatalf("EnsureNodeCert with the record failing: %v", err)
	}
	c, fresh, err := EnsureNodeCert(ca, nil, files, req, now)
	if err != nil || !fresh {
		t.Fatalf("EnsureNodeCert: fresh %t, %v", fresh, err)
	}
	if len(recorded) != 1 || recorded[0] != SerialHex(c.SerialNumber) {
		t.Errorf("recorded %v, issued %s", recorded, SerialHex(c.SerialNumber))
	}
	if _, fresh, err := EnsureNodeCert(ca, nil, files, req, now); err != nil || fresh || len(recorded) != 1 {
		t.Errorf("a current certificate: fresh %t, %v, recorded %v", fresh, err, recorded)
	}
}

// A client made WithRevocations refuses a server whose certificate is
// revoked, once the list says so.
func TestWithRevocationsRefusesARevokedServer(t *testing.T) {
	now := time.Now()
	ca, err := GenerateCA(now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srvFiles, cliFiles := NodeFiles{Dir: t.TempDir()}, NodeFiles{Dir: t.TempDir()}
	for cn, f := range map[string]NodeFiles{"srv": srvFiles, "cli": cliFiles} {
		req := CertRequest{CommonName: cn, Role: RoleNode, DNSNames: []string{"localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: time.Hour}
		if _, _, err := EnsureNodeCert(ca, nil, f, req, now); err != nil {
			t.Fatal(err)
		}
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", ServerConfig(srvFiles, TrustPool(ca.Pool()), nil))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	set := &RevocationSet{}
	dial := func() error {
		c, err := tls.Dial("tcp", l.Addr().String(), WithRevocations(NodeClientConfig(cliFiles, TrustPool(ca.Pool()), ""), set))
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(); err != nil {
		t.Fatalf("before the revocation: %v", err)
	}
	set.Set(Revocations{Nodes: []RevokedNode{{NodeID: "srv", RevokedAt: now}}})
	if err := dial(); err == nil || !strings.Contains(err.Error(), "node srv is revoked") {
		t.Errorf("after the revocation: %v, want a refusal", err)
	}
}
