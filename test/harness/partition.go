package harness

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Mesh puts a TCP proxy on every directed path between agents' peer APIs,
// so a test can cut any agent off from the others. Each agent discovers
// the others only through its own proxies (static discovery). etcd's own
// traffic is not proxied. Proxies listen on loopback addresses only.
type Mesh struct {
	t       testing.TB
	names   []string
	proxies map[[2]string]*proxy // [from, to] -> proxy
	ips     map[string]string    // agent -> its loopback address
}

// NewMesh prepares proxies for agents named names; start the agents with
// m.Options(name) so their discovery goes through the mesh.
func NewMesh(t testing.TB, names []string) *Mesh {
	t.Helper()
	m := &Mesh{t: t, names: names, proxies: map[[2]string]*proxy{}, ips: map[string]string{}}
	for _, n := range names {
		m.ips[n] = AllocIP(t)
	}
	for _, from := range names {
		for _, to := range names {
			if from == to {
				continue
			}
			// The proxy listens on the sender's address, on a port named
			// after the receiver's position, so it is known up front.
			listen := fmt.Sprintf("%s:%d", m.ips[from], 9000+slices.Index(names, to))
			p, err := startProxy(listen, fmt.Sprintf("%s:8000", m.ips[to]))
			if err != nil {
				t.Fatalf("harness: proxy: %v", err)
			}
			m.proxies[[2]string{from, to}] = p
			t.Cleanup(p.close)
		}
	}
	return m
}

// Options returns the agent options that put name on its address and
// route its discovery through its proxies.
func (m *Mesh) Options(name string) AgentOptions {
	var list []string
	for _, to := range m.names {
		if to != name {
			list = append(list, m.proxies[[2]string{name, to}].addr)
		}
	}
	return AgentOptions{IP: m.ips[name], ExtraArgs: []string{"--discovery=static:" + strings.Join(list, ",")}}
}

// Isolate cuts name off from every other agent, both ways.
func (m *Mesh) Isolate(name string) { m.set(name, true) }

// Heal restores name's paths.
func (m *Mesh) Heal(name string) { m.set(name, false) }

func (m *Mesh) set(name string, cut bool) {
	for key, p := range m.proxies {
		if key[0] == name || key[1] == name {
			p.setCut(cut)
		}
	}
}

// proxy forwards TCP connections from addr to a target. While cut, it
// blackholes: live connections are dropped and new ones are accepted but
// never answered, as packets lost in a partition.
type proxy struct {
	addr string
	to   string
	l    net.Listener

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

func startProxy(addr, to string) (*proxy, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &proxy{addr: addr, to: to, l: l, conns: map[net.Conn]bool{}}
	go p.serve()
	return p, nil
}

func (p *proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.conns[c] = true
		p.mu.Unlock()
		if cut {
			// Hold the connection and swallow what it sends.
			go func() { _, _ = io.Copy(io.Discard, c); p.drop(c) }()
			continue
		}
		go p.forward(c)
	}
}

func (p *proxy) forward(c net.Conn) {
	defer p.drop(c)
	up, err := net.Dial("tcp", p.to)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.conns[up] = true
	p.mu.Unlock()
	defer p.drop(up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

func (p *proxy) drop(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// setCut changes the state and drops every live connection, so that
// clients reconnect into the new state.
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (p *proxy) close() {
	p.l.Close()
	p.setCut(true)
}
