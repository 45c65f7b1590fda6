package agent

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backupagent"
)

func validConfig() Config {
	c := Default()
	c.ClusterName = "test"
	c.BackupStore = "file:///tmp/x"
	c.DataDir = "/tmp/d"
	c.Insecure, c.EtcdInsecure = true, true
	c.Complete()
	return c
}

func TestConfigComplete(t *testing.T) {
	c := Default()
	c.EtcdInsecure = true
	c.EtcdAddress = "127.0.0.2"
	c.Complete()
	if got := strings.Join(c.ClientURLs, ","); got != "http://127.0.0.2:4001" {
		t.Errorf("client URLs = %s", got)
	}
	if got := strings.Join(c.QuarantineClientURLs, ","); got != "http://127.0.0.2:8001" {
		t.Errorf("quarantine URLs = %s", got)
	}
	if got := strings.Join(c.PeerURLs, ","); got != "http://127.0.0.2:2380" {
		t.Errorf("peer URLs = %s", got)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{name: "valid", mutate: func(*Config) {}},
		{name: "no cluster name", mutate: func(c *Config) { c.ClusterName = "" }, wantErr: "--cluster-name"},
		{name: "bad cluster name", mutate: func(c *Config) { c.ClusterName = "Main_1" }, wantErr: "--cluster-name"},
		{name: "no backup store", mutate: func(c *Config) { c.BackupStore = "" }, wantErr: "--backup-store is required"},
		{name: "backup store of an unknown scheme", mutate: func(c *Config) { c.BackupStore = "ftp://host/backups" }, wantErr: `--backup-store: store: invalid backup store URL "ftp://host/backups": unsupported scheme "ftp"`},
		{name: "backup store with a relative path", mutate: func(c *Config) { c.BackupStore = "file://backups" }, wantErr: "absolute path"},
		{name: "no data dir", mutate: func(c *Config) { c.DataDir = "" }, wantErr: "--data-dir is required"},
		{name: "bad address", mutate: func(c *Config) { c.Address = "localhost:1" }, wantErr: "--address"},
		{name: "etcd over TLS with http URLs", mutate: func(c *Config) { c.EtcdInsecure = false }, wantErr: "scheme must be https"},
		{name: "a certificate validity too short to renew", mutate: func(c *Config) { c.CertValidity = 10 * time.Second }, wantErr: "--cert-validity must be at least 30s"},
		{name: "https url while insecure", mutate: func(c *Config) { c.ClientURLs = []string{"https://127.0.0.1:4001"} }, wantErr: "scheme must be http"},
		{name: "url without port", mutate: func(c *Config) { c.PeerURLs = []string{"http://127.0.0.1"} }, wantErr: "host and a port"},
		{name: "listen peer url of the wrong scheme", mutate: func(c *Config) { c.ListenPeerURLs = []string{"https://127.0.0.1:2381"} }, wantErr: "--listen-peer-urls"},
		{name: "quarantine equals client", mutate: func(c *Config) { c.QuarantineClientURLs = c.ClientURLs }, wantErr: "must differ"},
		{name: "zero loop interval", mutate: func(c *Config) { c.LoopInterval = 0 }, wantErr: "--loop-interval"},
		{name: "bad metrics address", mutate: func(c *Config) { c.MetricsAddress = "9100" }, wantErr: "--metrics-address"},
		{name: "pprof with no metrics address", mutate: func(c *Config) { c.EnablePprof = true }, wantErr: "--enable-pprof needs --metrics-address"},
		{name: "bad retention", mutate: func(c *Config) { c.Backup.Retention = "forever" }, wantErr: "--backup-retention"},
		{name: "backup interval too short", mutate: func(c *Config) { c.Backup.Interval = time.Second }, wantErr: "--backup-interval"},
		{name: "bad discovery", mutate: func(c *Config) { c.Discovery = "consul:x" }, wantErr: "--discovery"},
		{name: "short leader lease", mutate: func(c *Config) { c.LeaderLease = time.Millisecond }, wantErr: "--leader-lease"},
		{name: "certificate names", mutate: func(c *Config) { c.CertNames = []string{"main-client.db.svc", "$(POD_NAME).main.db.svc", "10.0.0.1"} }},
		{name: "a certificate name with a space", mutate: func(c *Config) { c.CertNames = []string{"main client"} }, wantErr: "--cert-names"},
		{name: "a reserved certificate name", mutate: func(c *Config) { c.CertNames = []string{"node.main.etcd-manager.internal"} }, wantErr: "--cert-names"},
		{name: "voter readiness", mutate: func(c *Config) { c.Readiness = ReadinessVoter }},
		{name: "unknown readiness", mutate: func(c *Config) { c.Readiness = "healthy" }, wantErr: "--readiness"},
		{name: "unmarked certificates for a week", mutate: func(c *Config) {
			c.PeerAcceptUnmarkedUntil = time.Now().Add(7 * 24 * time.Hour).UTC().Format(time.RFC3339)
		}},
		{name: "unmarked certificates for a year", mutate: func(c *Config) {
			c.PeerAcceptUnmarkedUntil = time.Now().Add(365 * 24 * time.Hour).UTC().Format(time.RFC3339)
		}, wantErr: "--peer-accept-unmarked-until"},
		{name: "unmarked certificates until a junk time", mutate: func(c *Config) { c.PeerAcceptUnmarkedUntil = "next week" }, wantErr: "RFC 3339"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			err := c.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.wantErr)
			}
		})
	}
}

func TestCertRequestNames(t *testing.T) {
	c := validConfig()
	c.Address, c.EtcdAddress = "10.0.0.1", "10.0.0.1"
	c.PeerURLs = []string{"http://node-1.example:2380"}
	c.ListenPeerURLs = []string{"http://0.0.0.0:2380"}
	a := &Agent{cfg: c}
	req := a.certRequest()
	var ips []string
	for _, ip := range req.IPs {
		ips = append(ips, ip.String())
	}
	if !slices.Contains(ips, "10.0.0.1") || !slices.Contains(ips, "127.0.0.1") || slices.Contains(ips, "0.0.0.0") {
		t.Errorf("certificate IPs = %v, want 10.0.0.1 and 127.0.0.1, and no wildcard", ips)
	}
	if !slices.Contains(req.DNSNames, "node-1.example") || !slices.Contains(req.DNSNames, "localhost") {
		t.Errorf("certificate names = %v, want node-1.example and localhost", req.DNSNames)
	}
}

// The backup agent refuses a store it could never open at start, too.
func TestBackupAgentConfigChecksTheStoreURL(t *testing.T) {
	for _, tt := range []struct{ url, wantErr string }{
		{url: "s3://bucket/backups"},
		{url: "ftp://host/backups", wantErr: `--backup-store: store: invalid backup store URL "ftp://host/backups": unsupported scheme "ftp"`},
	} {
		c := backupagent.Default()
		c.BackupStore, c.Endpoints = tt.url, []string{"http://127.0.0.1:2379"}
		c.Complete()
		err := c.Validate()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tt.url, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: err = %v, want it to mention %q", tt.url, err, tt.wantErr)
		}
	}
}

// Every agent serves etcd_manager_build_info, labelled with its build.
func TestBuildInfoMetric(t *testing.T) {
	mfs, err := newProcessMetrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "etcd_manager_build_info" {
			continue
		}
		labels := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if mf.GetMetric()[0].GetGauge().GetValue() != 1 || labels["goversion"] != runtime.Version() || labels["version"] == "" {
			t.Errorf("etcd_manager_build_info = %v %v", mf.GetMetric()[0].GetGauge().GetValue(), labels)
		}
		return
	}
	t.Error("no etcd_manager_build_info")
}
