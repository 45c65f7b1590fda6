package integration

import (
	"context"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// TestMemberStatusAcrossARestart: the agent asks a member for its status
// over one kept connection (etcdproc.MemberStatusOf). While the member
// is down that fails at once, and once it is back the next status
// answers, although by then gRPC's reconnection back-off, left alone,
// would wait seconds before it tried again.
func TestMemberStatusAcrossARestart(t *testing.T) {
	env := harness.NewEnv(t)
	bare := env.NewBareCluster(1, true)
	bare.Start(env.DefaultEtcd())
	m, ep := bare.Members[0], bare.Endpoints()[0]
	c, err := etcdproc.NewClient([]string{ep}, bare.TLS)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	status := func() (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err := etcdproc.MemberStatusOf(ctx, c, ep)
		return time.Since(start), err
	}
	harness.WaitFor(t, 30*time.Second, "etcd to answer its status", func() bool {
		_, err := status()
		return err == nil
	})

	m.Kill()
	down := time.Now()
	for time.Since(down) < 10*time.Second { // gRPC retries, backing off, meanwhile
		took, err := status()
		if err == nil {
			t.Fatal("a status succeeded while etcd was down")
		}
		if took > time.Second {
			t.Fatalf("a status of a member that is down took %v, want a prompt failure", took)
		}
		time.Sleep(500 * time.Millisecond)
	}
	m.Start(env.DefaultEtcd())
	harness.WaitFor(t, 30*time.Second, "etcd to listen again", func() bool {
		return etcdproc.Listening(context.Background(), ep) == nil
	})
	if took, err := status(); err != nil {
		t.Fatalf("the first status once etcd listens again failed after %v: %v", took, err)
	}
}
