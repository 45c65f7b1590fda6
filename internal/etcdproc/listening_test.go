package etcdproc

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestListening(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := "https://" + l.Addr().String()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "https://" + closed.Addr().String()
	closed.Close()
	defer l.Close()
	tests := []struct {
		name, url string
		ok        bool
	}{
		{"a listener", open, true},
		{"a closed port", refused, false},
		{"no host", "https://", false},
		{"junk", "::", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if err := Listening(ctx, tt.url); (err == nil) != tt.ok {
				t.Fatalf("Listening(%q) = %v, want ok=%v", tt.url, err, tt.ok)
			}
		})
	}
}
