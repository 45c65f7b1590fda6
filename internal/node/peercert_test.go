package node

import (
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
)

// A node refuses to have its etcd require a name of peer certificates
// that its own certificate lacks, or at all without TLS or when its
// agent asked for the check off; it records nothing then.
func TestSetPeerCertCheckRefusals(t *testing.T) {
	now := time.Now()
	ca, err := pki.GenerateCA(now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	marker := pki.NodeMarker("main")
	files := func(names ...string) *etcdproc.TLSFiles {
		f := pki.NodeFiles{Dir: t.TempDir()}
		req := pki.CertRequest{CommonName: "n1", Role: pki.RoleNode, DNSNames: names, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: time.Hour}
		if _, _, err := pki.EnsureNodeCert(ca, nil, f, req, now); err != nil {
			t.Fatal(err)
		}
		return &etcdproc.TLSFiles{CA: f.CA(), Cert: f.Cert(), Key: f.Key()}
	}
	tests := []struct {
		name string
		cfg  Config
		req  peer.PeerCertCheckRequest
		want string
	}{
		{"another cluster", Config{EtcdTLS: files(marker)}, peer.PeerCertCheckRequest{Token: "other", Hostname: marker}, "this node is not its member"},
		{"no TLS for etcd", Config{}, peer.PeerCertCheckRequest{Token: "tok", Hostname: marker}, "without TLS"},
		{"the agent asked for the check off", Config{EtcdTLS: files(marker), PeerCertCheckOff: true}, peer.PeerCertCheckRequest{Token: "tok", Hostname: marker},
			"--etcd-peer-cert-check=false"},
		{"its own certificate lacks the name", Config{EtcdTLS: files("localhost")}, peer.PeerCertCheckRequest{Token: "tok", Hostname: marker},
			"does not carry " + marker},
		{"its certificate carries another cluster's marker", Config{EtcdTLS: files(pki.NodeMarker("events"))}, peer.PeerCertCheckRequest{Token: "tok", Hostname: marker},
			"does not carry " + marker},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			layout := etcdproc.Layout{Root: t.TempDir()}
			st, err := LoadState(layout, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			st.Member = &etcdproc.MemberState{ClusterToken: "tok", EtcdVersion: "3.6.16", HasRun: true}
			tt.cfg.DataDir = layout.Root
			n := New(tt.cfg, layout, st, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now, func() {})
			err = n.SetPeerCertCheck(t.Context(), tt.req)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("SetPeerCertCheck: %v, want an error saying %q", err, tt.want)
			}
			if m := n.Member(); m.PeerCertHostname != "" {
				t.Errorf("the refused check was recorded: %q", m.PeerCertHostname)
			}
		})
	}
}
