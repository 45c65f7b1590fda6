package harness

import (
	"bufio"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// PeerFirewall puts a TCP proxy in front of each agent's etcd peer URL,
// and one in front of its peer API: etcd advertises the proxy's address
// (--peer-urls) and binds another (--listen-peer-urls), and so does the
// agent (--peer-api-listen-address), so every raft message between
// members, and every call between agents, crosses a proxy. Each
// connection is tagged with the member whose etcd or agent opened it,
// found through /proc (every source address on loopback is 127.0.0.1),
// so a rule on one member covers its traffic both ways: connections to
// it, at its own proxies, and connections from it, at the others'.
// Proxies listen on loopback only. The backup store is never behind
// them.
type PeerFirewall struct {
	t testing.TB

	mu      sync.Mutex
	rules   map[string]LinkRule
	sources map[string][]func() int // member -> pids of its etcd and its agent
	proxies map[string]*peerProxy   // listen address -> proxy
	tagged  map[string]int          // connections seen, by source member
}

// LinkRule is what happens to the traffic to and from one member.
type LinkRule struct {
	// Blackhole loses every byte both ways while connections stay open,
	// as in a network partition.
	Blackhole bool
	// Drop resets connections as they open, as a rejecting firewall.
	Drop bool
	// Delay holds every chunk of bytes this long before passing it on.
	Delay time.Duration
	// Agents applies the rule to the member's agent as well (its peer
	// API, both ways); without it only etcd's raft links are touched.
	Agents bool
}

func (r LinkRule) String() string {
	s := "pass"
	switch {
	case r.Blackhole:
		s = "blackhole"
	case r.Drop:
		s = "drop"
	case r.Delay > 0:
		s = "delay " + r.Delay.String()
	}
	if r.Agents {
		s += " (etcd and agent)"
	}
	return s
}

// NewPeerFirewall returns a firewall with every link passing; give it to
// agents through AgentOptions.PeerFirewall.
func NewPeerFirewall(t testing.TB) *PeerFirewall {
	return &PeerFirewall{t: t, rules: map[string]LinkRule{}, sources: map[string][]func() int{},
		proxies: map[string]*peerProxy{}, tagged: map[string]int{}}
}

// front starts a proxy for member name, listening on listen and
// forwarding to the bind address target of its etcd (agent false) or its
// agent's peer API (agent true); pid finds the process that dials out
// from it. It is idempotent.
func (f *PeerFirewall) front(name, listen, target string, agent bool, pid func() int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.proxies[listen]; ok {
		return nil
	}
	f.sources[name] = append(f.sources[name], pid)
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("harness: peer proxy for %s: %w", name, err)
	}
	p := &peerProxy{f: f, dst: name, agent: agent, target: target, l: l, conns: map[*proxyConn]bool{}}
	f.proxies[listen] = p
	go p.serve()
	f.t.Cleanup(p.close)
	return nil
}

// Set puts rule on member name's links, applying it to live connections
// at once: a blackhole swallows their bytes from now on, a drop closes
// them. Connections that lost bytes are closed when the blackhole lifts,
// as their streams are broken.
func (f *PeerFirewall) Set(name string, rule LinkRule) {
	f.mu.Lock()
	f.rules[name] = rule
	proxies := f.proxyList()
	f.mu.Unlock()
	for _, p := range proxies {
		p.reapply()
	}
}

// Heal lifts every rule.
func (f *PeerFirewall) Heal() {
	f.mu.Lock()
	f.rules = map[string]LinkRule{}
	proxies := f.proxyList()
	f.mu.Unlock()
	for _, p := range proxies {
		p.reapply()
	}
}

// Tagged returns how many connections each member's etcd has opened
// through the proxies ("" for those whose source was not found).
func (f *PeerFirewall) Tagged() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.tagged)
}

func (f *PeerFirewall) proxyList() []*peerProxy {
	return slices.Collect(maps.Values(f.proxies))
}

// rule is the rule for traffic between src and dst: a blackhole or drop on
// either end wins, and the longer delay applies. Traffic between agents
// (agent) follows only the rules that say so.
func (f *PeerFirewall) rule(src, dst string, agent bool) LinkRule {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, b := f.rules[src], f.rules[dst]
	if agent {
		if !a.Agents {
			a = LinkRule{}
		}
		if !b.Agents {
			b = LinkRule{}
		}
	}
	return LinkRule{Blackhole: a.Blackhole || b.Blackhole, Drop: a.Drop || b.Drop, Delay: max(a.Delay, b.Delay)}
}

// identify returns the member whose etcd owns the other end of c, a
// connection accepted on loopback, or "" when none does.
func (f *PeerFirewall) identify(c net.Conn) string {
	ra, ok1 := c.RemoteAddr().(*net.TCPAddr)
	la, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return ""
	}
	// The dialer's socket has our remote address as its local one.
	inode := socketInode(ra, la)
	if inode == "" {
		return ""
	}
	f.mu.Lock()
	sources := maps.Clone(f.sources)
	f.mu.Unlock()
	for name, pids := range sources {
		for _, pid := range pids {
			if p := pid(); p > 0 && ownsSocket(p, inode) {
				return name
			}
		}
	}
	return ""
}

// socketInode finds the inode of the IPv4 TCP socket bound to local and
// connected to remote in /proc/net/tcp.
func socketInode(local, remote *net.TCPAddr) string {
	hex := func(a *net.TCPAddr) string {
		ip := a.IP.To4()
		if ip == nil {
			return ""
		}
		// The kernel prints the address as a native-endian word.
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
	}
	wantL, wantR := hex(local), hex(remote)
	if wantL == "" || wantR == "" {
		return ""
	}
	file, err := os.Open("/proc/net/tcp")
	if err != nil {
		return ""
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 9 && fields[1] == wantL && fields[2] == wantR {
			return fields[9]
		}
	}
	return ""
}

// ownsSocket says whether process pid holds socket inode open.
func ownsSocket(pid int, inode string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	want := "socket:[" + inode + "]"
	for _, e := range entries {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == want {
			return true
		}
	}
	return false
}

// peerProxy is the proxy in front of one member's etcd, or its agent.
type peerProxy struct {
	f      *PeerFirewall
	dst    string
	agent  bool
	target string
	l      net.Listener

	mu    sync.Mutex
	conns map[*proxyConn]bool
}

// proxyConn is one proxied connection, from member src.
type proxyConn struct {
	src      string
	down, up net.Conn

	mu   sync.Mutex
	lost bool // bytes were swallowed: the stream is broken
	once sync.Once
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		c.down.Close()
		if c.up != nil {
			c.up.Close()
		}
	})
}

func (p *peerProxy) serve() {
	for {
		down, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.handle(down)
	}
}

func (p *peerProxy) handle(down net.Conn) {
	src := p.f.identify(down)
	p.f.mu.Lock()
	p.f.tagged[src]++
	p.f.mu.Unlock()
	if p.f.rule(src, p.dst, p.agent).Drop {
		down.Close()
		return
	}
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		down.Close()
		return
	}
	c := &proxyConn{src: src, down: down, up: up}
	p.mu.Lock()
	p.conns[c] = true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { p.pipe(c, down, up); done <- struct{}{} }()
	go func() { p.pipe(c, up, down); done <- struct{}{} }()
	<-done
	c.close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pipe copies from r to w through the current rule: bytes are held for
// the delay, then written, or swallowed under a blackhole.
func (p *peerProxy) pipe(c *proxyConn, r, w net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	ch := make(chan chunk, 256)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := r.Read(buf)
			if n > 0 {
				ch <- chunk{b: buf[:n], due: time.Now().Add(p.f.rule(c.src, p.dst, p.agent).Delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for k := range ch {
		time.Sleep(time.Until(k.due))
		if p.f.rule(c.src, p.dst, p.agent).Blackhole {
			c.mu.Lock()
			c.lost = true
			c.mu.Unlock()
			continue
		}
		if _, err := w.Write(k.b); err != nil {
			c.close()
			break
		}
	}
	c.close()
	for range ch { // let the reader finish
	}
}

// reapply closes the connections the current rules end: dropped ones,
// and broken ones whose blackhole has lifted.
func (p *peerProxy) reapply() {
	conns := p.live()
	for _, c := range conns {
		r := p.f.rule(c.src, p.dst, p.agent)
		c.mu.Lock()
		broken := c.lost && !r.Blackhole
		c.mu.Unlock()
		if r.Drop || broken {
			c.close()
		}
	}
}

// live returns the proxy's open connections.
func (p *peerProxy) live() []*proxyConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Keys(p.conns))
}

func (p *peerProxy) close() {
	p.l.Close()
	conns := p.live()
	for _, c := range conns {
		c.close()
	}
}
