package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// peerCall is what etcd's peer port answered a client: the HTTP status of
// each request, or the error that stood in for an answer.
type peerCall struct {
	members, raft int
	err           error
}

// callPeerPort talks to etcd's peer port at peerURL as cfg's certificate:
// it lists the members (GET /members) and sends a raft message (POST
// /raft, a body etcd cannot decode: any answer at all means the message
// reached etcd's raft handler).
func callPeerPort(t *testing.T, peerURL string, cfg *tls.Config) peerCall {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	var out peerCall
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, r := range []struct {
		method, path string
		status       *int
	}{{http.MethodGet, "/members", &out.members}, {http.MethodPost, "/raft", &out.raft}} {
		req, err := http.NewRequestWithContext(ctx, r.method, peerURL+r.path, bytes.NewReader([]byte("not a raft message")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/protobuf")
		resp, err := client.Do(req)
		if err != nil {
			out.err = err
			return out
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		*r.status = resp.StatusCode
	}
	return out
}

// refused reports whether the peer port refused the client outright:
// no answer to either request, for a certificate error in the TLS
// handshake.
func (c peerCall) refused() bool {
	return c.err != nil && c.members == 0 && c.raft == 0 && strings.Contains(c.err.Error(), "certificate")
}

// nodeTLS is the TLS of a client presenting agent a's own node
// certificate, as its etcd does to its peers.
func nodeTLS(t *testing.T, a *harness.Agent) *tls.Config {
	t.Helper()
	dir := filepath.Join(a.DataDir, "pki")
	return harness.ClientTLSFromFiles(t, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key"))
}

// operatorTLS is the TLS of an operator's certificate, from
// issue-client-cert as the docs tell operators to get one.
func operatorTLS(t *testing.T, env *harness.Env) *tls.Config {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ops")
	env.MustCtl("issue-client-cert", "--out", dir, "--name", "ops")
	return tlsFromDir(t, dir)
}

// For every etcd pinned, --peer-cert-allowed-hostname with the node
// marker, as the agents give it, turns away an operator's certificate
// and a node certificate without the marker on the peer port (in the TLS
// handshake, before any request), and takes a node certificate with the
// marker. Without the flag the same etcd takes the operator's
// certificate: that is the hole it closes.
func TestPeerCertCheckInEveryEtcd(t *testing.T) {
	binDir, err := harness.EtcdBinDir()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca, err := pki.GenerateCA(now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	marker := pki.NodeMarker("test")
	ip := harness.AllocIP(t)
	pkiDir := t.TempDir()
	issue := func(name string, req pki.CertRequest) *tls.Config {
		certPEM, keyPEM, err := ca.Issue(req, nil, now)
		if err != nil {
			t.Fatal(err)
		}
		cert, key := filepath.Join(pkiDir, name+".crt"), filepath.Join(pkiDir, name+".key")
		if err := os.WriteFile(cert, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		return harness.ClientTLSFromFiles(t, filepath.Join(pkiDir, "ca.crt"), cert, key)
	}
	if err := os.WriteFile(filepath.Join(pkiDir, "ca.crt"), ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	// As the agents' node certificates do, each names 127.0.0.1, the
	// address the test's connections come from: etcd's peer port also
	// refuses a certificate with SANs that do not name the client's
	// address (one with none, as an operator's, passes that check).
	nodeReq := func(cn string, dns ...string) pki.CertRequest {
		return pki.CertRequest{CommonName: cn, Role: pki.RoleNode, DNSNames: dns, IPs: []net.IP{net.ParseIP(ip), net.ParseIP("127.0.0.1")}, Validity: time.Hour}
	}
	issue("server", nodeReq("n1", append([]string{"localhost"}, marker)...))
	clients := map[string]*tls.Config{
		"a node certificate with the marker":    issue("node", nodeReq("n2", marker)),
		"a node certificate without the marker": issue("old-node", nodeReq("n3", "localhost")),
		"another cluster's node certificate":    issue("events-node", nodeReq("n4", pki.NodeMarker("events"))),
		"an operator's client certificate":      issue("ops", pki.CertRequest{CommonName: "ops", Role: pki.RoleClient, Validity: time.Hour}),
	}
	files := &etcdproc.TLSFiles{CA: filepath.Join(pkiDir, "ca.crt"), Cert: filepath.Join(pkiDir, "server.crt"), Key: filepath.Join(pkiDir, "server.key")}
	peerURL := fmt.Sprintf("https://%s:2380", ip)

	for _, version := range []string{"3.4.23", "3.5.35", "3.6.16", "3.7.3"} {
		t.Run(version, func(t *testing.T) {
			v, err := spec.ParseVersion(version)
			if err != nil {
				t.Fatal(err)
			}
			bins, err := etcdproc.FindBinaries(binDir, v)
			if err != nil {
				t.Fatal(err)
			}
			logPath := filepath.Join(t.TempDir(), "etcd.log")
			logFile, err := os.Create(logPath)
			if err != nil {
				t.Fatal(err)
			}
			defer logFile.Close()
			sup := etcdproc.NewSupervisor(etcdproc.SupervisorConfig{Output: logFile, StopTimeout: 10 * time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			defer func() { _ = sup.Stop(context.Background()) }()
			sp := etcdproc.Spec{
				Binaries: bins, Name: "n1", DataDir: filepath.Join(t.TempDir(), "data"),
				ClientURLs: []string{fmt.Sprintf("https://%s:4001", ip)}, PeerURLs: []string{peerURL},
				InitialCluster: "n1=" + peerURL, NewCluster: true, ClusterToken: "peercert", TLS: files,
			}
			start := func(hostname string) {
				t.Helper()
				sp.PeerCertHostname = hostname
				if err := sup.Start(t.Context(), sp); err != nil {
					t.Fatal(err)
				}
				var last peerCall
				deadline := time.Now().Add(30 * time.Second)
				for last = callPeerPort(t, peerURL, clients["a node certificate with the marker"]); last.members != http.StatusOK; last = callPeerPort(t, peerURL, clients["a node certificate with the marker"]) {
					if time.Now().After(deadline) {
						log, _ := os.ReadFile(logPath)
						t.Fatalf("etcd %s does not answer a node on its peer port: %+v\n%s", version, last, tailLines(string(log), 30))
					}
					time.Sleep(200 * time.Millisecond)
				}
			}

			start("")
			if got := callPeerPort(t, peerURL, clients["an operator's client certificate"]); got.members != http.StatusOK || got.raft == 0 {
				t.Fatalf("without the check, an operator's certificate: %+v; want it let in (the hole the check closes)", got)
			}

			start(marker)
			if !slices.Contains(sup.Status().Spec.Args(), "--peer-cert-allowed-hostname="+marker) {
				t.Fatalf("etcd runs without the check: %v", sup.Status().Spec.Args())
			}
			for name, cfg := range clients {
				got := callPeerPort(t, peerURL, cfg)
				if name == "a node certificate with the marker" {
					if got.members != http.StatusOK || got.raft == 0 || got.err != nil {
						t.Errorf("%s: %+v; want the members listed and the raft message answered", name, got)
					}
					continue
				}
				if !got.refused() {
					t.Errorf("%s: %+v; want the handshake refused", name, got)
				} else {
					t.Logf("%s: refused: %v", name, got.err)
				}
			}
			log, _ := os.ReadFile(logPath)
			if !bytes.Contains(log, []byte("client certificate authentication failed")) {
				t.Errorf("etcd %s did not log why it refused the certificates:\n%s", version, tailLines(string(log), 20))
			}
		})
	}
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// A cluster made by this etcd-manager requires the node marker on its
// peer ports from the start: an operator's certificate from
// issue-client-cert can neither list the members nor send a raft message
// to any member (the TLS handshake fails), while the members' own node
// certificates do, and the cluster serves writes.
func TestPeerPortTakesOnlyNodeCertificates(t *testing.T) {
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{})
	marker := pki.NodeMarker("test")
	waitCmdline(t, agents, []string{"--peer-cert-allowed-hostname=" + marker}, nil)
	ops := operatorTLS(t, env)
	for i, a := range agents {
		if got := callPeerPort(t, a.PeerURL, ops); !got.refused() {
			t.Errorf("%s's peer port with an operator's certificate: %+v; want the handshake refused", a.Name, got)
		}
		other := agents[(i+1)%len(agents)]
		if got := callPeerPort(t, a.PeerURL, nodeTLS(t, other)); got.members != http.StatusOK || got.raft == 0 {
			t.Errorf("%s's peer port with %s's node certificate: %+v; want it answered", a.Name, other.Name, got)
		}
	}
	c := clusterClient(t, agents)
	for i := range 20 {
		put(t, c, fmt.Sprintf("/peercert/%02d", i), "ok")
	}
	if cs := harness.Observe(agents); cs.Healthy != 3 || len(cs.Voters) != 3 {
		t.Errorf("cluster: %+v, want 3 healthy voters", cs)
	}
	if n := strings.Count(allLogs(agents), "restarting etcd to accept only node certificates on its peer port"); n != 0 {
		t.Errorf("%d restarts to turn the check on in a cluster created with it", n)
	}
}

// An upgrade of a running cluster. Agents that do not yet ask for the
// check (--etcd-peer-cert-check=false, which is how they appear to the
// leader, as agents from before the marker do) make a cluster whose peer
// ports take an operator's certificate. The operator restarts them one at
// a time without the flag; once every member's agent asks for it, the
// leader turns the check on one member at a time, itself last after
// handing leadership on, while a client writes: no write fails twice,
// none is lost, and no more than one member is down at once. Then the
// operator's certificate is refused. Setting the flag on one agent again
// turns the check off everywhere (the way down before a downgrade).
func TestPeerCertCheckRollsOnAfterUpgrade(t *testing.T) {
	const off = "--etcd-peer-cert-check=false"
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{ExtraArgs: []string{off}})
	marker := pki.NodeMarker("test")
	flag := "--peer-cert-allowed-hostname=" + marker
	waitCmdline(t, agents, nil, []string{"--peer-cert-allowed-hostname"})
	if n := strings.Count(allLogs(agents), "etcd's peer port is to accept any certificate from the CA"); n != 3 {
		t.Errorf("%d agents warned at start that the check is off, want 3", n)
	}
	ops := operatorTLS(t, env)
	if got := callPeerPort(t, agents[0].PeerURL, ops); got.members != http.StatusOK || got.raft == 0 {
		t.Fatalf("before the upgrade, an operator's certificate on the peer port: %+v; want it let in", got)
	}

	for i, a := range agents {
		a.Stop()
		a.SetExtraArgs()
		a.Start()
		harness.WaitFor(t, time.Minute, "agent "+a.Name+" to run etcd again", func() bool { return a.EtcdPID() != 0 })
		if i < len(agents)-1 {
			harness.WaitSettled(t, agents, 3, settleTimeout)
			// The others still ask for the check off: it stays off.
			if cl := etcdCmdline(a); strings.Contains(cl, flag) {
				t.Fatalf("agent %s's etcd requires the marker while other agents still ask for the check off", a.Name)
			}
		}
	}
	// The leader's roll, under a writer.
	w := startWriterRetrying(t, agents, 20000, true)
	const restartMsg = "restarting etcd to accept only node certificates on its peer port"
	rolledBefore := strings.Count(allLogs(agents), restartMsg)
	var maxDown atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			down := int32(0)
			for _, a := range agents {
				if a.EtcdPID() == 0 || !etcdAlive(a.EtcdPID()) {
					down++
				}
			}
			if down > maxDown.Load() {
				maxDown.Store(down)
			}
		}
	}()
	waitCmdline(t, agents, []string{flag}, nil)
	harness.WaitSettled(t, agents, 3, settleTimeout)
	close(stop)
	wg.Wait()
	w.check(t, clusterClient(t, agents))
	if w.failed > 0 {
		t.Errorf("%d writes failed, retries included, while the check was rolled on (first: %v)", w.failed, w.firstErr)
	}
	t.Logf("members restarted before the writer began: %d; most members down at once: %d", rolledBefore, maxDown.Load())
	if m := maxDown.Load(); m > 1 {
		t.Errorf("%d members were down at once during the roll, want at most 1", m)
	}
	logs := allLogs(agents)
	if n := strings.Count(logs, restartMsg); n != 3 {
		t.Errorf("%d etcd restarts to turn the check on, want 3 (one per member)", n)
	}
	if !strings.Contains(logs, "before restarting the leader with another peer certificate check") {
		t.Error("the leader did not hand leadership on before its own restart")
	}
	for _, a := range agents {
		if got := callPeerPort(t, a.PeerURL, ops); !got.refused() {
			t.Errorf("after the roll, %s's peer port with an operator's certificate: %+v; want the handshake refused", a.Name, got)
		}
	}
	put(t, clusterClient(t, agents), "/peercert/after", "ok")

	// One agent asks for the check off again: every member drops it.
	agents[2].Stop()
	agents[2].SetExtraArgs(off)
	agents[2].Start()
	waitCmdline(t, agents, nil, []string{"--peer-cert-allowed-hostname"})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	if n := strings.Count(allLogs(agents), "restarting etcd to accept any certificate from the CA on its peer port"); n != 3 {
		t.Errorf("%d etcd restarts to turn the check off, want 3", n)
	}
	put(t, clusterClient(t, agents), "/peercert/off", "ok")
}

// etcdAlive reports whether the process pid still runs.
func etcdAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }
