package backupagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The backup agent refuses TLS flags with plain http endpoints, and a mix
// of http and https, rather than send snapshots unencrypted in silence.
func TestBackupAgentConfigRefusesADowngrade(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("pem"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ca, cert, key := file("ca.crt"), file("client.crt"), file("client.key")
	tests := []struct {
		name           string
		endpoints      []string
		cacert, crt, k string
		wantErr        string
	}{
		{name: "https with TLS flags", endpoints: []string{"https://10.0.0.1:2379", "https://10.0.0.2:2379"}, cacert: ca, crt: cert, k: key},
		{name: "http without TLS flags", endpoints: []string{"http://10.0.0.1:2379"}},
		{name: "https with the system's roots", endpoints: []string{"https://10.0.0.1:2379"}},
		{name: "http with --cacert", endpoints: []string{"http://10.0.0.1:2379"}, cacert: ca,
			wantErr: "--endpoints http://10.0.0.1:2379: plain http, but --cacert, --cert or --key are given"},
		{name: "http with --cert and --key", endpoints: []string{"http://10.0.0.1:2379"}, crt: cert, k: key,
			wantErr: "use https:// endpoints, or drop the TLS flags"},
		{name: "one http among https, with TLS flags", endpoints: []string{"https://10.0.0.1:2379", "http://10.0.0.2:2379"}, cacert: ca, crt: cert, k: key,
			wantErr: "--endpoints http://10.0.0.2:2379: plain http"},
		{name: "http and https without TLS flags", endpoints: []string{"https://10.0.0.1:2379", "http://10.0.0.2:2379"},
			wantErr: "--endpoints mixes plain http (http://10.0.0.2:2379) with https (https://10.0.0.1:2379)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.BackupStore = "file:///tmp/x"
			c.Endpoints = tt.endpoints
			c.CACert, c.Cert, c.Key = tt.cacert, tt.crt, tt.k
			err := c.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate: %v, want an error saying %q", err, tt.wantErr)
			}
		})
	}
}
