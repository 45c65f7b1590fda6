package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
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

	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/plan"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// revoke-node on the raft leader's node, whose key is taken to have
// leaked: within a cycle every other agent refuses its certificate on
// the peer API; its agent stops its etcd; the new leader removes its
// member and the standby takes its place (etcd's member list says so);
// and etcd's client port refuses a new connection made with the revoked
// certificate, while a certificate of the CA that is not revoked still
// works. No key is lost.
func TestRevokedNodeIsReplaced(t *testing.T) {
	env, agents, before := startCluster(t, 3, 4, harness.AgentOptions{})
	c := clusterClient(t, agents)
	put(t, c, "/revoke/before", "kept")

	var victim *harness.Agent
	harness.WaitFor(t, 30*time.Second, "a leader", func() bool {
		for _, a := range agents {
			// Leading, not Leads: a status call that times out under
			// load is a reason to look again, not to fail.
			if leads, err := a.Leading(); err == nil && leads {
				victim = a
				return true
			}
		}
		return false
	})
	victimID := victim.NodeID()
	stolen := pki.NodeFiles{Dir: filepath.Join(victim.DataDir, "pki")}
	// The files as they are now: the leaked certificate and key.
	leaked := pki.NodeFiles{Dir: t.TempDir()}
	for _, f := range [][2]string{{stolen.Cert(), leaked.Cert()}, {stolen.Key(), leaked.Key()}, {stolen.CA(), leaked.CA()}} {
		data, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f[1], data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var rest []*harness.Agent
	for _, a := range agents {
		if a != victim {
			rest = append(rest, a)
		}
	}
	leakedPeer := credentials.NewTLS(pki.NodeClientConfig(leaked, pki.TrustFile(leaked.CA()), pki.NodeMarker("test")))
	infoWithLeaked := func(a *harness.Agent) error {
		p, err := dialPeer(a.PeerAPI, leakedPeer)
		if err != nil {
			return err
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return p.Info(ctx)
	}
	if err := infoWithLeaked(rest[0]); err != nil {
		t.Fatalf("the node's certificate before the revocation: %v", err)
	}

	out := env.MustCtl("revoke-node", victimID, "--reason", "test: its key leaked")
	if !strings.Contains(out, "node "+victimID+" revoked") || !strings.Contains(out, "1 certificate serials") {
		t.Errorf("revoke-node printed:\n%s", out)
	}
	revokedAt := time.Now()
	for _, a := range rest {
		harness.WaitFor(t, 20*time.Second, "agent "+a.Name+" to refuse the revoked certificate", func() bool {
			err := infoWithLeaked(a)
			return status.Code(err) == codes.PermissionDenied && strings.Contains(err.Error(), "node "+victimID+" is revoked")
		})
	}
	t.Logf("every other agent refused the revoked certificate %s after revoke-node", time.Since(revokedAt).Round(time.Millisecond))

	harness.WaitFor(t, 30*time.Second, "the revoked node's etcd to stop", func() bool { return victim.EtcdPID() == 0 })
	if !strings.Contains(victim.Log(), plan.MsgRevoked) {
		t.Error("the revoked node's agent did not say why its etcd stopped")
	}
	after := harness.WaitSettled(t, rest, 3, settleTimeout)
	if slices.Contains(after.Voters, victimID) {
		t.Errorf("etcd's members %v still include the revoked node %s", after.Voters, victimID)
	}
	if len(after.ClusterIDs) != 1 || keys(after.ClusterIDs)[0] != keys(before.ClusterIDs)[0] {
		t.Errorf("cluster ID changed: %v -> %v", keys(before.ClusterIDs), keys(after.ClusterIDs))
	}
	if !strings.Contains(allLogs(rest), "its node is revoked") {
		t.Error("no agent removed the member for its node's revocation")
	}

	// etcd itself: a new connection with the revoked certificate is
	// refused, one with another certificate of the CA is served.
	etcdWith := func(cfg *tls.Config) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{rest[0].ClientURL}, TLS: cfg, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = cli.Get(ctx, "/revoke/before")
		return err
	}
	pair, err := tls.LoadX509KeyPair(leaked.Cert(), leaked.Key())
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(leaked.CA())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	// The same member serves a certificate that is not revoked (retried:
	// the host may be busy), then refuses the revoked one every time.
	harness.WaitFor(t, 30*time.Second, "etcd to serve a certificate that is not revoked", func() bool { return etcdWith(rest[0].TLS()) == nil })
	for i := range 3 {
		if err := etcdWith(pki.StaticClientConfig(pair, pool)); err == nil {
			t.Fatalf("etcd served a new connection made with the revoked certificate (try %d)", i+1)
		}
	}
	c2 := clusterClient(t, rest)
	put(t, c2, "/revoke/after", "new")
	if got := get(t, c2, "/revoke/before"); got != "kept" {
		t.Errorf("/revoke/before = %q after the replacement", got)
	}
}
