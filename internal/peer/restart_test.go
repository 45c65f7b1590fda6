package peer

import (
	"context"
	"net"
	"testing"
	"time"
)

// A peer that restarts on the same address is reachable at once after
// Redial, though the connection to its predecessor was refused
// moments before and waits in gRPC's reconnect backoff.
func TestPeerRestartOnSameAddress(t *testing.T) {
	rec := &recorder{}
	creds := InsecureCredentials()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	srv := NewServer(creds, "main", rec)
	go srv.Serve(l)
	c, err := Dial(addr, "main", creds)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	call := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		_, err := c.Info(ctx)
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	// Calls while the peer is gone: refused, and the backoff grows.
	for range 6 {
		if err := call(); err == nil {
			t.Fatal("a call to a stopped peer succeeded")
		}
		time.Sleep(150 * time.Millisecond)
	}
	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv2 := NewServer(creds, "main", rec)
	go srv2.Serve(l2)
	defer srv2.Stop()
	errBefore := call()
	t.Logf("a call at once, before any reset: %v", errBefore)
	c.Redial()
	if err := call(); err != nil {
		t.Fatalf("a call after Redial to the restarted peer: %v", err)
	}
}
