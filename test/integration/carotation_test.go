package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/internal/testhook"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// reloadingTLS is the TLS of a client that reads its files in dir (as
// issue-client-cert writes them) at every new connection, as a client
// does that takes up new certificates without a restart: its
// certificate, and the CAs it trusts.
func reloadingTLS(dir string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
			return &c, err
		},
		InsecureSkipVerify: true, // replaced by VerifyConnection, which reads ca.crt each time
		VerifyConnection: func(cs tls.ConnectionState) error {
			data, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
			if err != nil {
				return err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(data) {
				return errors.New("ca.crt holds no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: cs.ServerName})
			return err
		},
	}
}

// caFingerprints are the fingerprints of the CAs in a PEM file.
func caFingerprints(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return pki.Fingerprints(data)
}

// nodeIssuers are the fingerprints of the CAs that issued each agent's
// node certificate, as status reports them.
func nodeIssuers(t *testing.T, env *harness.Env) map[string]string {
	t.Helper()
	var st cli.ClusterStatus
	if err := json.Unmarshal([]byte(env.MustCtl("status", "--output=json")), &st); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range st.Agents {
		if a.Cert != nil {
			out[a.ID] = a.Cert.CAFingerprint
		}
	}
	return out
}

// TestCARotation replaces the cluster's CA live, under a writer that
// takes up the client files issue-client-cert writes at each gate: every
// node comes to trust both CAs (etcd by a rolling restart), gets a new
// key and a certificate from the new CA, then trusts the new CA alone. No
// write fails twice, and afterwards the old CA's certificates are
// refused. Then the CA is rotated once more, and the manager leader is
// killed in the middle of the reissue (right after its first node took a
// certificate from the newest CA): the rotation goes on under the next
// leader, and no acknowledged write is lost.
func TestCARotation(t *testing.T) {
	env := harness.NewEnv(t)
	// The crash point of the second rotation, taken by whichever agent
	// leads then, once; the claim file held until then keeps it off.
	claim := filepath.Join(t.TempDir(), "claim")
	if err := os.WriteFile(claim, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	env.ExtraEnv = append(env.ExtraEnv, testhook.Env+"=ca-rotation-synced-reissue@"+claim)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	clientDir := filepath.Join(t.TempDir(), "client")
	env.MustCtl("issue-client-cert", "--out", clientDir, "--name", "writer")
	oldClientDir := filepath.Join(t.TempDir(), "old-client")
	env.MustCtl("issue-client-cert", "--out", oldClientDir, "--name", "old")
	w := startWriterTLS(t, agents, 50000, true, reloadingTLS(clientDir))
	w.waitAcked(t, 20)

	// rotate-ca continue before its time is refused.
	if _, errOut, err := env.Ctl("rotate-ca", "continue"); err == nil || !strings.Contains(errOut, "no CA rotation is in progress") {
		t.Errorf("continue without a rotation: %v\n%s", err, errOut)
	}
	newCA := rotateCA(t, env, agents, clientDir, nil)
	w.mu.Lock()
	failed, firstErr, acked := w.failed, w.firstErr, len(w.acked)
	w.mu.Unlock()
	t.Logf("first rotation: %d writes acknowledged, %d failed twice", acked, failed)
	if failed > 0 {
		t.Errorf("%d writes failed twice during the CA rotation (first: %v)", failed, firstErr)
	}
	logs := allLogs(agents)
	if n := strings.Count(logs, "restarting etcd to take up the CAs it is to trust"); n != 6 {
		t.Errorf("%d etcd restarts, want 6: one per member to trust both CAs, one to drop the old", n)
	}
	if !strings.Contains(logs, "before restarting the leader to trust other CAs") {
		t.Error("the leader did not hand leadership on before its restart")
	}

	// The old CA's client certificate is refused now, by etcd.
	old, err := clientv3.New(clientv3.Config{Endpoints: harness.Endpoints(agents), TLS: reloadingTLS(oldClientDir), DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := old.Put(ctx, "/rotation/old", "no"); err == nil {
		t.Error("etcd took a write from a certificate of the old CA after the rotation")
	}
	if out := env.MustCtl("status"); strings.Count(out, pki.Fingerprint(newCA)[:11]) < 3 {
		t.Errorf("status does not show the new CA on every node:\n%s", out)
	}

	// Once more, with the leader agent killed mid-reissue.
	if err := os.Remove(claim); err != nil {
		t.Fatal(err)
	}
	rotateCA(t, env, agents, clientDir, func() {
		var crashed *harness.Agent
		harness.WaitFor(t, 2*time.Minute, "the leader agent to crash after its first reissue", func() bool {
			for _, a := range agents {
				if !a.Running() {
					crashed = a
				}
			}
			return crashed != nil
		})
		if !strings.Contains(crashed.Log(), "test hook: crashing here") {
			t.Fatalf("agent %s stopped, but not at the crash point:\n%s", crashed.Name, crashed.Log())
		}
		crashed.Start()
	})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	w.check(t, clusterClient(t, agents))

	// The history has the rotations' steps, the certificates issued and
	// the restarts, as the agents recorded them.
	harness.WaitFor(t, time.Minute, "the event history to show the rotations", func() bool {
		out, _, err := env.Ctl("events", "--since=1h")
		return err == nil && strings.Count(out, "advance-ca-rotation trust-both trusted") == 2 &&
			strings.Contains(out, "finish-ca-rotation drop-old") && strings.Contains(out, "issue-node-certificate") &&
			strings.Contains(out, "restart-etcd")
	})
}

// rotateCA takes the cluster through a CA rotation with the ctl, as an
// operator would, refreshing the client files in clientDir at each gate,
// and checks each phase's outcome on every agent. midReissue, when set,
// runs right after rotate-ca continue, before the reissue is waited for.
// It returns the new CA.
func rotateCA(t *testing.T, env *harness.Env, agents []*harness.Agent, clientDir string, midReissue func()) *x509.Certificate {
	t.Helper()
	oldFP := pki.Fingerprint(storeCA(t, env).Cert)
	keys := map[string][]byte{}
	for _, a := range agents {
		k, err := os.ReadFile(filepath.Join(a.DataDir, "pki", "node.key"))
		if err != nil {
			t.Fatal(err)
		}
		keys[a.Name] = k
	}

	// 1. Trust both.
	out := env.MustCtl("rotate-ca", "start", "--timeout=5m")
	for _, want := range []string{"started rotating the CA", "phase trust-both", "phase trusted", "give every etcd client the ca.crt"} {
		if !strings.Contains(out, want) {
			t.Errorf("rotate-ca start printed no %q:\n%s", want, out)
		}
	}
	if _, errOut, err := env.Ctl("rotate-ca", "start"); err == nil || !strings.Contains(errOut, "in progress already, at phase trusted") {
		t.Errorf("a second start: %v\n%s", err, errOut)
	}
	if _, errOut, err := env.Ctl("rotate-ca", "finish"); err == nil || !strings.Contains(errOut, "not finished rotate-ca continue") {
		t.Errorf("finish before continue: %v\n%s", err, errOut)
	}
	newCA := nextCA(t, env)
	newFP := pki.Fingerprint(newCA)
	both := []string{oldFP, newFP}
	slices.Sort(both)
	for _, a := range agents {
		if got := caFingerprints(t, filepath.Join(a.DataDir, "pki", "ca.crt")); !slices.Equal(got, both) {
			t.Errorf("agent %s trusts %v after trust-both, want %v", a.Name, got, both)
		}
	}
	if got := storeCACert(t, env); !slices.Equal(got, both) {
		t.Errorf("the store's pki/ca.crt holds %v during the rotation, want both CAs", got)
	}
	for id, fp := range nodeIssuers(t, env) {
		if fp != oldFP {
			t.Errorf("node %s holds a certificate from %s before continue, want the old CA", id, fp)
		}
	}
	// Clients take up both CAs before the nodes' certificates change.
	out = env.MustCtl("issue-client-cert", "--out", clientDir, "--name", "writer")
	if !strings.Contains(out, "ca.crt holds both its CAs") || !strings.Contains(out, "from the old CA") {
		t.Errorf("issue-client-cert during the rotation printed:\n%s", out)
	}
	env.ResetClientTLS()

	// 2. Reissue.
	out = env.MustCtl("rotate-ca", "continue", "--wait=false")
	if !strings.Contains(out, "issues now") {
		t.Errorf("rotate-ca continue printed:\n%s", out)
	}
	if midReissue != nil {
		midReissue()
	}
	out = env.MustCtl("rotate-ca", "continue", "--timeout=5m")
	if !strings.Contains(out, "phase reissued") {
		t.Errorf("rotate-ca continue --wait printed:\n%s", out)
	}
	for _, a := range agents {
		dir := filepath.Join(a.DataDir, "pki")
		k, err := os.ReadFile(filepath.Join(dir, "node.key"))
		if err != nil {
			t.Fatal(err)
		}
		if string(k) == string(keys[a.Name]) {
			t.Errorf("agent %s kept its node key through the rotation", a.Name)
		}
		data, err := os.ReadFile(filepath.Join(dir, "node.crt"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := pki.ParseCertPEM(data)
		if err != nil || c.CheckSignatureFrom(newCA) != nil {
			t.Errorf("agent %s: node.crt is not from the new CA (%v)", a.Name, err)
		}
	}
	for id, fp := range nodeIssuers(t, env) {
		if fp != newFP {
			t.Errorf("status: node %s holds a certificate from %s, want the new CA %s", id, fp, newFP)
		}
	}
	out = env.MustCtl("issue-client-cert", "--out", clientDir, "--name", "writer")
	if !strings.Contains(out, newFP) {
		t.Errorf("issue-client-cert after continue does not use the new CA:\n%s", out)
	}
	env.ResetClientTLS()

	// 3. Drop the old CA.
	out = env.MustCtl("rotate-ca", "finish", "--timeout=5m")
	if !strings.Contains(out, "CA rotation done") {
		t.Errorf("rotate-ca finish printed:\n%s", out)
	}
	for _, a := range agents {
		if got := caFingerprints(t, filepath.Join(a.DataDir, "pki", "ca.crt")); !slices.Equal(got, []string{newFP}) {
			t.Errorf("agent %s trusts %v after the rotation, want the new CA alone", a.Name, got)
		}
	}
	if out := env.MustCtl("rotate-ca", "status"); !strings.Contains(out, "no CA rotation is in progress") {
		t.Errorf("rotate-ca status after the rotation:\n%s", out)
	}
	if got := storeCA(t, env); !got.Cert.Equal(newCA) {
		t.Error("the store's CA is not the new one")
	}
	if got := storeCACert(t, env); !slices.Equal(got, []string{newFP}) {
		t.Errorf("the store's pki/ca.crt holds %v after the rotation, want the new CA alone", got)
	}
	// Clients drop the old CA too.
	env.MustCtl("issue-client-cert", "--out", clientDir, "--name", "writer")
	if got := caFingerprints(t, filepath.Join(clientDir, "ca.crt")); !slices.Equal(got, []string{newFP}) {
		t.Errorf("issue-client-cert after the rotation writes a ca.crt of %v, want the new CA alone", got)
	}
	env.ResetClientTLS()
	return newCA
}

// storeCACert are the fingerprints of the CAs in the store's pki/ca.crt.
func storeCACert(t *testing.T, env *harness.Env) []string {
	t.Helper()
	data, err := openStore(t, env.StoreURL).Read(t.Context(), pki.StoreCACert)
	if err != nil {
		t.Fatal(err)
	}
	return pki.Fingerprints(data)
}

// nextCA is the new CA of the rotation in progress, from the record.
func nextCA(t *testing.T, env *harness.Env) *x509.Certificate {
	t.Helper()
	s := openStore(t, env.StoreURL)
	r, err := pki.LoadRotation(t.Context(), s, func(err error) bool { return errors.Is(err, store.ErrNotFound) })
	if err != nil || r == nil {
		t.Fatalf("no rotation record: %v", err)
	}
	return r.New()
}
