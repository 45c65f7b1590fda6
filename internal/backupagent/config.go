package backupagent

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"

	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/controller"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Config configures the backup-only agent, for an etcd that
// etcd-manager does not manage.
type Config struct {
	BackupStore string
	// Endpoints are etcd's client URLs.
	Endpoints []string
	// CACert, Cert and Key are PEM files for etcd's client TLS.
	CACert, Cert, Key string
	Backup            backupjob.Config
	// TempDir holds a snapshot while it is verified and compressed.
	TempDir string
	// MetricsAddress serves Prometheus metrics when set (host:port).
	MetricsAddress string
	// NodeID names this agent in the store's lock.
	NodeID string
	// LockLease is the store lock's lease: of several backup agents on one
	// store, only the holder backs up.
	LockLease time.Duration
	// LoopInterval is the time between cycles.
	LoopInterval time.Duration
	// Capture is continuous capture of the etcd, by the lock holder,
	// spooled under <temp-dir>/capture.
	Capture changelog.Config
}

// Default returns the defaults.
func Default() Config {
	return Config{
		Backup:       backupjob.Default(),
		TempDir:      filepath.Join(os.TempDir(), "etcd-manager-backup"),
		LockLease:    30 * time.Second,
		LoopInterval: 5 * time.Second,
		Capture:      changelog.Default(),
	}
}

// Complete fills in defaults that depend on the machine.
func (c *Config) Complete() {
	if c.NodeID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.NodeID = fmt.Sprintf("backup-%s-%s", host, hex.EncodeToString(b))
	}
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.BackupStore == "" {
		errs = append(errs, fmt.Errorf("--%s is required", controller.FlagBackupStore))
	} else if err := store.CheckURL(c.BackupStore); err != nil {
		errs = append(errs, fmt.Errorf("--%s: %w", controller.FlagBackupStore, err))
	}
	if len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("--endpoints is required, for example --endpoints=https://10.0.0.1:2379"))
	}
	var plain, secure []string
	for _, e := range c.Endpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--endpoints: %q is not an http(s)://host:port URL", e))
			continue
		}
		if u.Scheme == "http" {
			plain = append(plain, e)
		} else {
			secure = append(secure, e)
		}
	}
	// etcd's client sends plain http to an http:// endpoint whatever TLS
	// it is given: refuse rather than downgrade in silence.
	switch tlsFlags := c.CACert != "" || c.Cert != "" || c.Key != ""; {
	case len(plain) > 0 && tlsFlags:
		errs = append(errs, fmt.Errorf("--endpoints %s: plain http, but --cacert, --cert or --key are given: "+
			"the snapshot would travel unencrypted and the certificates be ignored; use https:// endpoints, or drop the TLS flags if etcd serves plain http only",
			strings.Join(plain, ",")))
	case len(plain) > 0 && len(secure) > 0:
		errs = append(errs, fmt.Errorf("--endpoints mixes plain http (%s) with https (%s): some snapshots would travel unencrypted; use https:// throughout",
			strings.Join(plain, ","), strings.Join(secure, ",")))
	}
	if (c.Cert == "") != (c.Key == "") {
		errs = append(errs, errors.New("--cert and --key go together"))
	}
	for _, f := range []string{c.CACert, c.Cert, c.Key} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("TLS file: %w", err))
		}
	}
	errs = append(errs, c.Backup.Validate()...)
	if c.LockLease < time.Second {
		errs = append(errs, errors.New("--lock-lease must be at least 1s"))
	}
	if c.LoopInterval <= 0 || c.LoopInterval > c.LockLease/2 {
		errs = append(errs, errors.New("--loop-interval must be positive and at most half of --lock-lease"))
	}
	if err := c.Capture.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MetricsAddress != "" {
		if _, err := url.Parse("http://" + c.MetricsAddress); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-address %q: want host:port", c.MetricsAddress))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("backupagent: invalid configuration: %w", errors.Join(errs...))
	}
	return nil
}

// tlsConfig is etcd's client TLS, or nil for plain http.
func (c Config) tlsConfig() (*tls.Config, error) {
	if c.CACert == "" && c.Cert == "" {
		return nil, nil
	}
	info := transport.TLSInfo{TrustedCAFile: c.CACert, CertFile: c.Cert, KeyFile: c.Key}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("backupagent: etcd client TLS: %w", err)
	}
	return cfg, nil
}
