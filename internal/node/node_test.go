package node

import (
	"strings"
	"testing"
)

func TestListenPeerURLs(t *testing.T) {
	tests := []struct {
		name   string
		listen []string
		served []string
		want   []string
	}{
		{name: "not set binds the served URLs", served: []string{"https://10.0.0.1:2380"}},
		{name: "set", listen: []string{"https://0.0.0.0:2380"}, served: []string{"https://10.0.0.1:2380"}, want: []string{"https://0.0.0.0:2380"}},
		{name: "served over http during a switch to TLS", listen: []string{"https://0.0.0.0:2380"}, served: []string{"http://10.0.0.1:2380"}, want: []string{"http://0.0.0.0:2380"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &Node{cfg: Config{ListenPeerURLs: tt.listen}}
			if got := n.listenPeerURLs(tt.served); strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("listenPeerURLs(%v) = %v, want %v", tt.served, got, tt.want)
			}
		})
	}
}
