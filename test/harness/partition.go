package harness

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// Mesh puts a TCP proxy on every directed path between agents' peer APIs,
// so a test can cut any agent off from the others. Each agent discovers
// the others only through its own proxies (static discovery). etcd's own
// traffic is not proxied.
type Mesh struct {
	t       testing.TB
	names   []string
	proxies map[[2]string]proxy.Server // [from, to] -> proxy
	ports   map[string]int             // agent -> peer API port
}

// NewMesh prepares proxies for agents named names; start the agents with
// m.Options(name) so their discovery goes through the mesh.
func NewMesh(t testing.TB, names []string) *Mesh {
	t.Helper()
	m := &Mesh{t: t, names: names, proxies: map[[2]string]proxy.Server{}, ports: map[string]int{}}
	ports := freePorts(t, len(names))
	for i, n := range names {
		m.ports[n] = ports[i]
	}
	for _, from := range names {
		for _, to := range names {
			if from == to {
				continue
			}
			lport := freePorts(t, 1)[0]
			p := proxy.NewServer(proxy.ServerConfig{
				Logger: zap.NewNop(),
				From:   url.URL{Scheme: "tcp", Host: fmt.Sprintf("127.0.0.1:%d", lport)},
				To:     url.URL{Scheme: "tcp", Host: fmt.Sprintf("127.0.0.1:%d", m.ports[to])},
			})
			select {
			case <-p.Ready():
			case err := <-p.Error():
				t.Fatalf("proxy: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("proxy did not start")
			}
			m.proxies[[2]string{from, to}] = p
			t.Cleanup(func() { p.Close() })
		}
	}
	return m
}

// Options returns the agent options that route name's discovery through
// its proxies and fix its peer API port.
func (m *Mesh) Options(name string) AgentOptions {
	list := ""
	for _, to := range m.names {
		if to == name {
			continue
		}
		if list != "" {
			list += ","
		}
		list += strings.TrimPrefix(m.proxies[[2]string{name, to}].From(), "tcp://")
	}
	return AgentOptions{PeerPort: m.ports[name], ExtraArgs: []string{"--discovery=static:" + list}}
}

// Isolate cuts name off from every other agent, both ways.
func (m *Mesh) Isolate(name string) { m.set(name, true) }

// Heal restores name's paths.
func (m *Mesh) Heal(name string) { m.set(name, false) }

func (m *Mesh) set(name string, cut bool) {
	for key, p := range m.proxies {
		if key[0] != name && key[1] != name {
			continue
		}
		if cut {
			p.BlackholeTx()
			p.BlackholeRx()
		} else {
			p.UnblackholeTx()
			p.UnblackholeRx()
		}
	}
}
