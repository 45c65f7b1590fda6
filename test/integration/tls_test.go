package integration

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/internal/store"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// storeCA reads the CA the agents generated into the env's store.
func storeCA(t *testing.T, env *harness.Env) *pki.CA {
	t.Helper()
	s, err := store.Open(t.Context(), env.StoreURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ca, err := pki.LoadStoreCA(t.Context(), s, func(err error) bool { return errors.Is(err, store.ErrNotFound) }, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// clientCertFiles writes a client certificate from ca, issued at issued
// for validity, with ca.crt of trust, and returns the folder.
func clientCertFiles(t *testing.T, ca, trust *pki.CA, role string, issued time.Time, validity time.Duration) string {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(pki.CertRequest{CommonName: "test-client", Role: role, Validity: validity}, nil, issued)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"ca.crt": trust.CertPEM, "client.crt": certPEM, "client.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func tlsFromDir(t *testing.T, dir string) *tls.Config {
	t.Helper()
	return harness.ClientTLSFromFiles(t, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
}

// By default everything is TLS from the cluster's CA: the peer API, etcd
// and the ctl. Without a certificate, with one from another CA, or with an
// expired one, each is refused, and says why.
func TestTLSRefusals(t *testing.T) {
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{})
	ca := storeCA(t, env)
	other, err := pki.GenerateCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	good := clientCertFiles(t, ca, ca, pki.RoleClient, now, time.Hour)
	foreign := clientCertFiles(t, other, ca, pki.RoleClient, now, time.Hour)
	expired := clientCertFiles(t, ca, ca, pki.RoleClient, now.Add(-2*time.Hour), time.Hour)
	certArgs := func(dir string) []string {
		return []string{"--cacert=" + filepath.Join(dir, "ca.crt"), "--cert=" + filepath.Join(dir, "client.crt"), "--key=" + filepath.Join(dir, "client.key")}
	}

	t.Run("ctl", func(t *testing.T) {
		harness.WaitFor(t, 20*time.Second, "status with a good client certificate to show the leader", func() bool {
			out, _, err := env.Ctl(append(certArgs(good), "status")...)
			return err == nil && strings.Contains(out, " leader ")
		})
		for _, tt := range []struct {
			name string
			args []string
			want string
		}{
			{"no certificate (--insecure)", []string{"--insecure", "status"}, "no agent accepted the connection"},
			{"another CA", append(certArgs(foreign), "status"), "was not issued by this cluster's CA"},
			{"expired", append(certArgs(expired), "status"), "expired at"},
		} {
			_, stderr, err := env.Ctl(tt.args...)
			if err == nil || !strings.Contains(stderr, tt.want) {
				t.Errorf("%s: err=%v, stderr %q, want %q", tt.name, err, stderr, tt.want)
			}
		}
	})

	t.Run("peer API", func(t *testing.T) {
		call := func(cfg *tls.Config, join bool) error {
			creds := credentials.NewTLS(cfg)
			c, err := dialPeer(agents[0].PeerAPI, creds)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if join {
				return c.Join(ctx)
			}
			return c.Info(ctx)
		}
		if err := call(tlsFromDir(t, good), false); err != nil {
			t.Fatalf("Info with a client certificate from the CA: %v", err)
		}
		if err := call(tlsFromDir(t, good), true); status.Code(err) != codes.PermissionDenied {
			t.Errorf("Join with an operator's client certificate: %v, want PermissionDenied", err)
		}
		noCert := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
		for name, cfg := range map[string]*tls.Config{"no certificate": noCert, "another CA": tlsFromDir(t, foreign), "expired": tlsFromDir(t, expired)} {
			if err := call(cfg, false); err == nil {
				t.Errorf("%s: Info was answered", name)
			}
		}
		logs := allLogs(agents)
		for _, want := range []string{"the client presented no certificate", "was not issued by this cluster's CA", "expired at"} {
			if !strings.Contains(logs, want) {
				t.Errorf("no agent logged a refusal saying %q", want)
			}
		}
	})

	t.Run("etcd", func(t *testing.T) {
		try := func(cfg *tls.Config) error {
			c, err := clientv3.New(clientv3.Config{Endpoints: []string{agents[0].ClientURL}, TLS: cfg, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			_, err = c.Put(ctx, "/tls/probe", "x")
			return err
		}
		if err := try(tlsFromDir(t, good)); err != nil {
			t.Fatalf("etcd refused a client certificate from the CA: %v", err)
		}
		if err := try(&tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}); err == nil {
			t.Error("etcd took a write from a client without a certificate")
		}
		if err := try(tlsFromDir(t, foreign)); err == nil {
			t.Error("etcd took a write from a client of another CA")
		}
		// issue-client-cert gives an operator what etcdctl needs.
		dir := t.TempDir()
		out := env.MustCtl("issue-client-cert", "--out", dir)
		if !strings.Contains(out, "client.key") {
			t.Errorf("issue-client-cert printed %q", out)
		}
		if st, err := os.Stat(filepath.Join(dir, "client.key")); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("client.key: %v, mode %v", err, st.Mode().Perm())
		}
		cmd := exec.Command(filepath.Join(env.BinDir, "etcd-v"+harness.DefaultEtcdVersion, "etcdctl"),
			"--endpoints="+agents[0].ClientURL, "--cacert="+filepath.Join(dir, "ca.crt"),
			"--cert="+filepath.Join(dir, "client.crt"), "--key="+filepath.Join(dir, "client.key"), "get", "/tls/probe")
		if got, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(got), "/tls/probe") {
			t.Errorf("etcdctl with issue-client-cert's files: %v\n%s", err, got)
		}
	})

	t.Run("an agent of another CA cannot join", func(t *testing.T) {
		pkiDir := t.TempDir()
		key, _ := other.KeyPEM()
		for name, data := range map[string][]byte{"ca.crt": other.CertPEM, "ca.key": key} {
			if err := os.WriteFile(filepath.Join(pkiDir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		env.MustCtl("--member-count=5", "configure-cluster")
		rogue := env.StartAgent("rogue", harness.AgentOptions{ExtraArgs: []string{"--pki-dir=" + pkiDir}})
		rogue.WaitLog("agent starting", 1, 30*time.Second)
		time.Sleep(8 * time.Second) // many cycles in which a join could happen
		if rogue.EtcdPID() != 0 {
			t.Fatal("the agent of another CA runs an etcd member")
		}
		cs := harness.Observe(agents)
		if len(cs.Voters) != 3 {
			t.Fatalf("members: %v; the agent of another CA must not be added", cs.Voters)
		}
		// Each side refuses the other's certificate: the cluster's status
		// lists the rogue agent as unreachable.
		if out := env.MustCtl("status"); !strings.Contains(out, "unreachable: "+rogue.PeerAPI) {
			t.Errorf("status does not list the other CA's agent as unreachable:\n%s", out)
		}
	})
}

// peerCaller calls one agent's peer API as the test.
type peerCaller struct{ c *peer.Client }

func dialPeer(addr string, creds credentials.TransportCredentials) (peerCaller, error) {
	c, err := peer.Dial(addr, "test", creds)
	return peerCaller{c}, err
}

func (p peerCaller) Close() error { return p.c.Close() }

func (p peerCaller) Info(ctx context.Context) error {
	_, err := p.c.Info(ctx)
	return err
}

// Join asks the node to adopt a membership; only a node certificate may.
func (p peerCaller) Join(ctx context.Context) error {
	return p.c.Join(ctx, peer.JoinRequest{LeaderID: "test", Member: etcdproc.MemberState{ClusterToken: "not-a-cluster", Pending: true}})
}

// Node certificates valid for one minute are renewed every 40 s or so,
// with no restart, while a client writes: every write is acknowledged,
// none is lost, and connections made after the first certificates
// expired (a restarted agent's etcd, new clients, the ctl) still work.
func TestCertRotation(t *testing.T) {
	env, agents, _ := startCluster(t, 3, 3, harness.AgentOptions{ExtraArgs: []string{"--cert-validity=1m"}})
	first, err := os.ReadFile(filepath.Join(agents[0].DataDir, "pki", "node.crt"))
	if err != nil {
		t.Fatal(err)
	}
	firstCert, err := pki.ParseCertPEM(first)
	if err != nil {
		t.Fatal(err)
	}
	w := startWriter(t, agents, 20000)
	harness.WaitFor(t, 3*time.Minute, "every agent to renew its certificate twice", func() bool {
		for _, a := range agents {
			if strings.Count(a.Log(), "issued the node certificate") < 3 {
				return false
			}
		}
		return true
	})
	if time.Now().Before(firstCert.NotAfter) {
		harness.WaitFor(t, time.Minute, "the first certificate to expire", func() bool { return time.Now().After(firstCert.NotAfter) })
	}
	// Every write made while the certificates rotated was acknowledged
	// and kept. The writer stops here: the restart below stops a member
	// on purpose, and a write in flight on it may time out, which says
	// nothing about the rotation.
	w.check(t, clusterClient(t, agents))
	if w.failed > 0 {
		t.Errorf("%d writes failed during rotation; the cluster must stay writable", w.failed)
	}
	// New connections everywhere: a restarted agent's etcd rejoins its
	// peers, and a new client and the ctl get in.
	agents[1].Stop()
	agents[1].Start()
	harness.WaitSettled(t, agents, 3, settleTimeout)
	put(t, clusterClient(t, agents), "/rotation/after", "ok")
	if out := env.MustCtl("status"); strings.Count(out, "healthy") < 3 || !strings.Contains(out, "CERT EXPIRES") {
		t.Errorf("status after rotation:\n%s", out)
	}
	// status shows each node's certificate in use, renewed, and one CA.
	var st cli.ClusterStatus
	if err := json.Unmarshal([]byte(env.MustCtl("status", "--output=json")), &st); err != nil {
		t.Fatal(err)
	}
	cas := map[string]bool{}
	for _, a := range st.Agents {
		if a.Cert == nil || !a.Cert.NotAfter.After(firstCert.NotAfter) || a.Cert.CANotAfter.Before(time.Now().Add(24*time.Hour)) {
			t.Errorf("agent %s: status shows the certificate %+v, want one renewed after %s from a CA valid for long", a.ID, a.Cert, firstCert.NotAfter)
			continue
		}
		cas[a.Cert.CA] = true
	}
	if len(cas) != 1 {
		t.Errorf("status shows the CAs %v, want one", cas)
	}
	if now, _ := os.ReadFile(filepath.Join(agents[0].DataDir, "pki", "node.crt")); string(now) == string(first) {
		t.Error("node.crt on disk was never replaced")
	}
}

// A cluster started with --insecure --etcd-insecure is switched to TLS:
// the operator restarts the agents one by one with TLS, and the leader
// switches each member's peer URLs from http to https, one at a time. The
// keys are kept, the cluster ID stays, and every member ends on https.
func TestInsecureToSecureSwitch(t *testing.T) {
	env := harness.NewEnv(t)
	env.Insecure = true
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	before := harness.Observe(agents)
	c := clusterClient(t, agents)
	for i := range 50 {
		put(t, c, fmt.Sprintf("/switch/%02d", i), "kept")
	}
	c.Close()

	// The operator's rolling restart, with TLS.
	for _, a := range agents {
		a.Stop()
		a.Reconfigure(true)
		a.Start()
		harness.WaitFor(t, time.Minute, "agent "+a.Name+" to run etcd again", func() bool { return a.EtcdPID() != 0 })
	}
	env.Insecure = false // the ctl and the test's clients use TLS from here on
	harness.WaitFor(t, 3*time.Minute, "every member to be registered with https peer URLs", func() bool {
		cs := harness.Observe(agents)
		if len(cs.Voters) != 3 || cs.Healthy != 3 {
			return false
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: harness.Endpoints(agents), TLS: agents[0].TLS(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return false
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		ml, err := cli.MemberList(ctx)
		if err != nil {
			return false
		}
		for _, m := range ml.Members {
			for _, u := range m.PeerURLs {
				if !strings.HasPrefix(u, "https://") {
					return false
				}
			}
		}
		return true
	})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	after := harness.Observe(agents)
	if fmt.Sprint(keys(after.ClusterIDs)) != fmt.Sprint(keys(before.ClusterIDs)) {
		t.Fatalf("the cluster changed: %v -> %v", before.ClusterIDs, after.ClusterIDs)
	}
	c = clusterClient(t, agents)
	resp, err := c.Get(t.Context(), "/switch/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 50 {
		t.Fatalf("after the switch: %v, %d keys, want 50", err, len(resp.Kvs))
	}
	put(t, c, "/switch/after", "ok")
	if n := strings.Count(allLogs(agents), "restarting etcd to serve new peer URLs"); n != 3 {
		t.Errorf("%d members switched their peer URLs, want 3", n)
	}
	// Once all serve https with node certificates, the leader has each
	// member's peer port take only node certificates.
	waitCmdline(t, agents, []string{"--peer-cert-allowed-hostname=" + pki.NodeMarker("test")}, nil)
	// Plain http is gone.
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{strings.Replace(agents[0].ClientURL, "https://", "http://", 1)}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err == nil {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		if _, err := plain.Put(ctx, "/switch/plain", "x"); err == nil {
			t.Error("etcd still takes plaintext writes after the switch")
		}
		cancel()
		plain.Close()
	}
}

// A CA supplied as files (--pki-dir) instead of the generated one: the
// agents use it, nothing is written under the store's pki/, and the ctl
// works with the same --pki-dir.
func TestSuppliedCA(t *testing.T) {
	ca, err := pki.GenerateCA(time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key, _ := ca.KeyPEM()
	for name, data := range map[string][]byte{"ca.crt": ca.CertPEM, "ca.key": key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := harness.NewEnv(t)
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{ExtraArgs: []string{"--pki-dir=" + dir}})
	harness.WaitFor(t, settleTimeout, "the cluster to serve with the supplied CA's certificates", func() bool {
		c, err := clientv3.New(clientv3.Config{Endpoints: harness.Endpoints(agents), DialTimeout: time.Second, Logger: zap.NewNop(),
			TLS: tlsFromDir(t, clientCertFiles(t, ca, ca, pki.RoleClient, time.Now(), time.Hour))})
		if err != nil {
			return false
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err = c.Put(ctx, "/supplied", "ca")
		return err == nil
	})
	// No CA is made in the store; only the node certificates' serials
	// are recorded there, for revoke-node.
	for _, name := range []string{pki.StoreCAKey, pki.StoreCACert} {
		if _, err := os.Stat(filepath.Join(env.StoreDir, name)); !os.IsNotExist(err) {
			t.Errorf("the store's %s was written although the CA was supplied: %v", name, err)
		}
	}
	if issued, _ := filepath.Glob(filepath.Join(env.StoreDir, pki.StoreIssuedPrefix, "*", "*")); len(issued) < 3 {
		t.Errorf("the store records %d node certificates issued from the supplied CA, want one per agent: %v", len(issued), issued)
	}
	// The node certificates carry the node marker whatever the CA, and
	// the peer ports require it.
	waitCmdline(t, agents, []string{"--peer-cert-allowed-hostname=" + pki.NodeMarker("test")}, nil)
	harness.WaitFor(t, 20*time.Second, "status with --pki-dir to show 3 healthy members", func() bool {
		out, _, err := env.Ctl("--pki-dir="+dir, "status")
		return err == nil && strings.Count(out, " healthy ") == 3
	})
	// Without --pki-dir, the ctl finds no CA in the store and says so.
	if _, stderr, err := env.Ctl("status"); err == nil || !strings.Contains(stderr, "no CA in the backup store") {
		t.Errorf("status without the CA: %v, %q", err, stderr)
	}
}

// A move to TLS held up by a member that stays down. Agents started
// without TLS say so at start. The leader waits for the member, and past
// --member-failure-grace status says the switch is stalled, naming the
// member and the members still on plain http peer URLs; once the member
// is back with TLS, the switch completes and the warning goes.
func TestStalledPeerURLSwitchWarns(t *testing.T) {
	env := harness.NewEnv(t)
	env.Insecure = true
	env.MustCtl("--member-count=3", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(3, harness.AgentOptions{ExtraArgs: []string{"--member-failure-grace=5s"}})
	harness.WaitSettled(t, agents, 3, settleTimeout)
	if n := strings.Count(allLogs(agents), "TLS is turned off: that traffic is plaintext and unauthenticated"); n != 3 {
		t.Errorf("%d agents warned at start that TLS is off, want 3", n)
	}

	down := agents[2]
	downID := down.NodeID()
	down.Stop()
	for _, a := range agents[:2] {
		a.Stop()
		a.Reconfigure(true)
		a.Start()
		harness.WaitFor(t, time.Minute, "agent "+a.Name+" to run etcd again", func() bool { return a.EtcdPID() != 0 })
	}
	env.Insecure = false
	// Both members wait, the status line names them in node ID order.
	waiting := []string{agents[0].NodeID(), agents[1].NodeID()}
	slices.Sort(waiting)
	want := "peer URL switch stalled: member " + downID + " has been unhealthy for "
	wantWaiting := "until it is healthy or replaced, " + strings.Join(waiting, ", ") + " keep the old peer URLs http://"
	var out string
	harness.WaitFor(t, 2*time.Minute, "status to say the peer URL switch is stalled", func() bool {
		out, _, _ = env.Ctl("status")
		return strings.Contains(out, want) && strings.Contains(out, wantWaiting)
	})
	for _, want := range []string{"warnings from the leader:", "raft traffic to them is still plain http"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(allLogs(agents[:2]), plan.MsgPeerURLSwitchStalled) {
		t.Error("the leader did not log the stalled switch")
	}

	down.Reconfigure(true)
	down.Start()
	// The warning goes once the member is healthy; the switch of all
	// three takes a few cycles more.
	harness.WaitFor(t, 3*time.Minute, "the switch to complete and the warning to go", func() bool {
		if strings.Count(allLogs(agents), "restarting etcd to serve new peer URLs") < 3 {
			return false
		}
		out, _, err := env.Ctl("status")
		return err == nil && strings.Count(out, " healthy ") == 3 && !strings.Contains(out, "stalled")
	})
	if n := strings.Count(allLogs(agents), "restarting etcd to serve new peer URLs"); n != 3 {
		t.Errorf("%d members switched their peer URLs, want 3", n)
	}
}

// An agent given an out-of-date CA with --pki-dir refuses to start, and
// says why with the CA's dates.
func TestOutOfDatePKIDirIsRefusedAtStart(t *testing.T) {
	ca, err := pki.GenerateCA(time.Now().Add(-48*time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key, _ := ca.KeyPEM()
	for name, data := range map[string][]byte{"ca.crt": ca.CertPEM, "ca.key": key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := harness.NewEnv(t)
	a := env.StartAgent("expired-ca", harness.AgentOptions{ExtraArgs: []string{"--pki-dir=" + dir}})
	harness.WaitFor(t, 30*time.Second, "the agent to exit", func() bool { return !a.Running() })
	if a.ExitErr() == nil {
		t.Error("the agent exited cleanly")
	}
	log := a.Log()
	for _, want := range []string{"pki: CA expired", "expired at " + ca.Cert.NotAfter.UTC().Format(time.RFC3339), "--pki-dir " + dir} {
		if !strings.Contains(log, want) {
			t.Errorf("the agent's output lacks %q:\n%s", want, log)
		}
	}
}

// etcd gets an explicit environment: what it needs to run, never the
// agent's cloud credentials or a stray ETCD_* variable (which etcd would
// read as a flag). Read from /proc, as the kernel gave it to etcd.
func TestEtcdEnvironmentIsExplicit(t *testing.T) {
	env := harness.NewEnv(t)
	env.ExtraEnv = append(env.ExtraEnv, "AWS_SECRET_ACCESS_KEY=not-for-etcd", "GOOGLE_APPLICATION_CREDENTIALS=/not/for/etcd",
		"ETCD_QUOTA_BACKEND_BYTES=1", "AZURE_STORAGE_KEY=not-for-etcd")
	env.MustCtl("--member-count=1", "--etcd-version="+harness.DefaultEtcdVersion, "configure-cluster")
	agents := env.StartAgents(1, harness.AgentOptions{})
	harness.WaitSettled(t, agents, 1, settleTimeout)
	pid := agents[0].EtcdPID()
	if pid <= 0 {
		t.Fatal("no etcd runs")
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
	hasPath := false
	for _, v := range vars {
		k, _, _ := strings.Cut(v, "=")
		hasPath = hasPath || k == "PATH"
		if !slices.Contains([]string{"PATH", "HOME", "TMPDIR", "GOMAXPROCS", "ETCD_UNSUPPORTED_ARCH"}, k) {
			t.Errorf("etcd's environment holds %s", k)
		}
	}
	if !hasPath {
		t.Errorf("etcd's environment has no PATH: %q", vars)
	}
	// The stray ETCD_QUOTA_BACKEND_BYTES=1 would have made every write fail.
	put(t, clusterClient(t, agents), "/env/ok", "v")
}
