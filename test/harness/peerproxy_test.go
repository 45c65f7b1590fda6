package harness

import (
	"bufio"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer answers every line with the same line, on loopback.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// roundTrip sends a line and waits up to wait for its echo.
func roundTrip(c net.Conn, wait time.Duration) (time.Duration, error) {
	start := time.Now()
	if err := c.SetDeadline(start.Add(wait)); err != nil {
		return 0, err
	}
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, err
	}
	if line != "ping\n" {
		return 0, errors.New("echo garbled: " + line)
	}
	return time.Since(start), nil
}

// TestPeerFirewall runs each rule on a proxy whose connections come from
// this test's own process, registered as member "src".
func TestPeerFirewall(t *testing.T) {
	target := echoServer(t)
	f := NewPeerFirewall(t)
	self := func() int { return os.Getpid() }
	if err := f.front("dst", "127.0.0.1:0", target, false, func() int { return 0 }); err != nil {
		t.Fatal(err)
	}
	if err := f.front("dst", "127.0.0.3:0", target, true, func() int { return 0 }); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.sources["src"] = []func() int{self}
	f.mu.Unlock()
	addr := f.proxies["127.0.0.1:0"].l.Addr().String()
	agentAddr := f.proxies["127.0.0.3:0"].l.Addr().String()
	dialTo := func(addr string) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial := func() net.Conn { return dialTo(addr) }

	c := dial()
	if _, err := roundTrip(c, 5*time.Second); err != nil {
		t.Fatalf("pass: %v", err)
	}
	if got := f.Tagged()["src"]; got != 1 {
		t.Fatalf("connections tagged as from src = %d, want 1 (tags %v)", got, f.Tagged())
	}

	// A delay on the source holds each direction for it.
	f.Set("src", LinkRule{Delay: 150 * time.Millisecond})
	if d, err := roundTrip(c, 5*time.Second); err != nil || d < 300*time.Millisecond {
		t.Fatalf("delay 150ms each way: round trip %s, %v; want at least 300ms", d, err)
	}

	// A blackhole on the source swallows the live connection's bytes
	// and keeps it open; lifting it closes the broken connection.
	f.Set("src", LinkRule{Blackhole: true})
	if _, err := roundTrip(c, 500*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackhole: got %v, want a timeout", err)
	}
	fresh := dial()
	if _, err := roundTrip(fresh, 500*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackhole, new connection: got %v, want a timeout", err)
	}
	f.Heal()
	if _, err := roundTrip(c, 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("after the blackhole lifted, the broken connection: got %v, want it closed", err)
	}
	if _, err := roundTrip(dial(), 5*time.Second); err != nil {
		t.Fatalf("after heal: %v", err)
	}

	// A rule on the destination covers every source; a drop resets.
	f.Set("dst", LinkRule{Drop: true})
	if _, err := roundTrip(dial(), 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("drop: got %v, want the connection closed", err)
	}
	f.Heal()
	if _, err := roundTrip(dial(), 5*time.Second); err != nil {
		t.Fatalf("after heal: %v", err)
	}

	// A rule on another member leaves src's links alone.
	f.Set("other", LinkRule{Blackhole: true})
	if _, err := roundTrip(dial(), 5*time.Second); err != nil {
		t.Fatalf("rule on another member: %v", err)
	}
	f.Heal()

	// Agents' links follow only the rules that say so.
	f.Set("src", LinkRule{Drop: true})
	if _, err := roundTrip(dialTo(agentAddr), 5*time.Second); err != nil {
		t.Fatalf("an etcd-only rule on an agent's link: %v", err)
	}
	f.Set("src", LinkRule{Drop: true, Agents: true})
	if _, err := roundTrip(dialTo(agentAddr), 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("a rule for agents on an agent's link: got %v, want the connection closed", err)
	}
	f.Heal()
	if _, err := roundTrip(dialTo(agentAddr), 5*time.Second); err != nil {
		t.Fatalf("agent link after heal: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
