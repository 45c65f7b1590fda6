package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/maintenance"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/pki"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Config is the agent's configuration. The flag names follow the
// etcd-manager walkthrough that users already know.
type Config struct {
	ClusterName string
	// NodeName is the node ID a fresh data dir takes, and so the etcd
	// member's name (a StatefulSet pod's name); empty gives a random one.
	NodeName    string
	BackupStore string
	DataDir     string

	// Address is where the agent's peer API listens; PeerPort its port.
	Address  string
	PeerPort int
	// PeerAPIListenAddress is the host:port the peer API binds when it
	// differs from the Address:PeerPort it advertises (NAT, a proxy).
	PeerAPIListenAddress string
	// EtcdAddress is the address etcd binds; it fills in URLs not given.
	EtcdAddress string

	ClientURLs []string
	// ListenClientURLs are the addresses etcd binds for clients, when
	// they differ from the ClientURLs it advertises (a pod's loopback as
	// well as its IP, say); never while quarantined.
	ListenClientURLs     []string
	QuarantineClientURLs []string
	PeerURLs             []string
	// ListenPeerURLs are the addresses etcd binds for peer traffic when
	// they differ from the PeerURLs it advertises (NAT, a proxy); empty
	// means it binds PeerURLs.
	ListenPeerURLs []string

	Insecure     bool
	EtcdInsecure bool
	// EtcdPeerCertCheck lets the leader have etcd's peer port take only
	// node certificates, once every member's carries the node marker;
	// false on any agent keeps (or turns) the check off for the whole
	// cluster, as before a downgrade to an etcd-manager without it.
	EtcdPeerCertCheck bool
	// PKIDir holds a CA (ca.crt, ca.key) supplied as files; without it the
	// CA is generated once into the backup store's pki/ prefix.
	PKIDir string
	// CertValidity is how long node certificates are issued for; they are
	// renewed two thirds into it.
	CertValidity time.Duration
	// CertNames are more DNS names and IP addresses for the node
	// certificate, such as the Kubernetes Service names clients dial.
	CertNames []string

	EtcdBinDir string

	// Discovery names the provider that finds peers (see peer.ParseDiscovery);
	// DiscoveryMaxRecords bounds how many of its records are read.
	Discovery           string
	DiscoveryMaxRecords int
	// MemberFailureGrace is how long a member may be unhealthy before a
	// standby replaces it.
	MemberFailureGrace time.Duration
	// LearnerTimeout is how long a new member may take to start and catch
	// up as a learner before it is removed again.
	LearnerTimeout time.Duration
	// LeaderLease is the store lock's lease, used while etcd has no quorum.
	LeaderLease time.Duration
	// Backup says when backups are taken and how long they are kept.
	Backup BackupConfig
	// Capture is continuous capture, for restores to any point.
	Capture changelog.Config
	// Compaction is how the spec's compaction policy is carried out.
	Compaction maintenance.CompactionConfig
	// MetricsAddress serves Prometheus metrics when set (host:port).
	MetricsAddress string
	// EnablePprof serves Go's runtime profiles beside the metrics.
	EnablePprof bool
	// Readiness is what /readyz reports ready: ReadinessRunning (a
	// standby, or a member whose etcd runs) or ReadinessVoter (a voting
	// member whose etcd serves).
	Readiness string

	// LoopInterval is the time between control-loop cycles.
	LoopInterval time.Duration
	// EtcdStopTimeout bounds a graceful etcd stop before SIGKILL.
	EtcdStopTimeout time.Duration
	// EtcdSnapshotCount is etcd's --snapshot-count; 0 keeps etcd's own.
	EtcdSnapshotCount int
	// EtcdCorruptCheckInterval is how often etcd checks that its members
	// agree (0: never); its checks at start and after each compaction are
	// always on.
	EtcdCorruptCheckInterval time.Duration
	// HashCheckInterval is how often the leader compares every voting
	// member's HashKV at one revision, and rebuilds a member that
	// disagrees with the majority (0: never).
	HashCheckInterval time.Duration
	// RestoreDrillInterval is how often the leader restores the newest
	// backup into a scratch etcd to check it (0: never).
	RestoreDrillInterval time.Duration
	// Trash bounds the copies of etcd data moved to <data-dir>/trash.
	Trash etcdproc.TrashPolicy
	// MaxSnapshotBytes caps the snapshot the agent unpacks from a backup
	// in the store, for a restore or its check beforehand.
	MaxSnapshotBytes int64
}

// Defaults. The ports fill in URLs that are not given.
const (
	DefaultPeerPort           = 8000
	DefaultClientPort         = 4001
	DefaultQuarantinePort     = 8001
	DefaultEtcdPeerPort       = 2380
	DefaultLoopInterval       = 2 * time.Second
	DefaultMemberFailureGrace = time.Minute
	DefaultLearnerTimeout     = 15 * time.Minute
	DefaultTrashMaxAge        = 7 * 24 * time.Hour
	DefaultLeaderLease        = 20 * time.Second
	DefaultBackupInterval     = 15 * time.Minute
	DefaultEtcdStopTimeout    = 15 * time.Second
	// DefaultMaxSnapshotBytes is twice etcd's suggested maximum quota of
	// 8 GiB.
	DefaultMaxSnapshotBytes = 16 << 30
	// fetchReserve is the space a backup being unpacked leaves free on
	// the data dir's disk, which the live etcd shares.
	fetchReserve   = 1 << 30
	defaultAddress = "127.0.0.1"
)

// Flag names used in error messages, and by cmd/internal/flags, which registers them.
const (
	FlagBackupStore          = "backup-store"
	FlagEtcdInsecure         = "etcd-insecure"
	FlagInsecure             = "insecure"
	FlagClientURLs           = "client-urls"
	FlagQuarantineClientURLs = "quarantine-client-urls"
	FlagPeerURLs             = "peer-urls"
	FlagListenPeerURLs       = "listen-peer-urls"
	FlagListenClientURLs     = "listen-client-urls"
)

// DefaultEtcdCorruptCheckInterval is how often etcd's periodic
// corruption check runs by default: each pass reads every member's whole
// keyspace, and the check after each compaction catches most divergence
// sooner and cheaply.
const DefaultEtcdCorruptCheckInterval = time.Hour

// DefaultHashCheckInterval is how often the leader compares the members'
// HashKV by default; like etcd's periodic check, each pass reads every
// member's whole keyspace.
const DefaultHashCheckInterval = time.Hour

// DefaultRestoreDrillInterval is how often the leader checks that the
// newest backup restores.
const DefaultRestoreDrillInterval = 24 * time.Hour

// Default returns the configuration with defaults filled in.
func Default() Config {
	return Config{
		Address:                  defaultAddress,
		PeerPort:                 DefaultPeerPort,
		EtcdAddress:              defaultAddress,
		EtcdBinDir:               etcdproc.DefaultBinDir,
		Discovery:                "store",
		DiscoveryMaxRecords:      peer.DefaultMaxRecords,
		MemberFailureGrace:       DefaultMemberFailureGrace,
		LearnerTimeout:           DefaultLearnerTimeout,
		LeaderLease:              DefaultLeaderLease,
		Backup:                   DefaultBackupConfig(),
		Capture:                  changelog.Default(),
		Compaction:               maintenance.DefaultCompactionConfig(),
		LoopInterval:             DefaultLoopInterval,
		EtcdStopTimeout:          DefaultEtcdStopTimeout,
		EtcdCorruptCheckInterval: DefaultEtcdCorruptCheckInterval,
		HashCheckInterval:        DefaultHashCheckInterval,
		RestoreDrillInterval:     DefaultRestoreDrillInterval,
		CertValidity:             pki.DefaultCertValidity,
		Readiness:                ReadinessRunning,
		EtcdPeerCertCheck:        true,
		Trash:                    etcdproc.TrashPolicy{MaxAge: DefaultTrashMaxAge},
		MaxSnapshotBytes:         DefaultMaxSnapshotBytes,
	}
}

// Complete fills in the URLs derived from --etcd-address.
func (c *Config) Complete() {
	scheme := "https"
	if c.EtcdInsecure {
		scheme = "http"
	}
	hostPort := func(port int) []string {
		return []string{fmt.Sprintf("%s://%s", scheme, net.JoinHostPort(c.EtcdAddress, fmt.Sprint(port)))}
	}
	if len(c.ClientURLs) == 0 {
		c.ClientURLs = hostPort(DefaultClientPort)
	}
	if len(c.QuarantineClientURLs) == 0 {
		c.QuarantineClientURLs = hostPort(DefaultQuarantinePort)
	}
	if len(c.PeerURLs) == 0 {
		c.PeerURLs = hostPort(DefaultEtcdPeerPort)
	}
}

var (
	clusterNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	nodeNameRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)
)

// Validate checks the configuration and returns every problem found.
func (c *Config) Validate() error {
	var errs []error
	if !clusterNameRE.MatchString(c.ClusterName) {
		errs = append(errs, fmt.Errorf("--cluster-name %q: use 1 to 63 lowercase letters, digits and dashes, such as main or events", c.ClusterName))
	}
	if c.BackupStore == "" {
		errs = append(errs, fmt.Errorf("--%s is required, for example file:///var/lib/etcd-manager/backups/main", FlagBackupStore))
	} else if err := store.CheckURL(c.BackupStore); err != nil {
		// Refused now: retrying would never make it reachable.
		errs = append(errs, fmt.Errorf("--%s: %w", FlagBackupStore, err))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir is required"))
	}
	if net.ParseIP(c.Address) == nil {
		errs = append(errs, fmt.Errorf("--address %q is not an IP address", c.Address))
	}
	if c.PeerPort < 1 || c.PeerPort > 65535 {
		errs = append(errs, fmt.Errorf("--peer-port %d is out of range", c.PeerPort))
	}
	if c.PeerAPIListenAddress != "" {
		if _, port, err := net.SplitHostPort(c.PeerAPIListenAddress); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("--peer-api-listen-address %q: want host:port", c.PeerAPIListenAddress))
		}
	}
	for _, n := range c.CertNames {
		if n == "" || strings.ContainsAny(n, " /,:") && net.ParseIP(n) == nil || pki.IsReservedName(n) {
			errs = append(errs, fmt.Errorf("--cert-names: %q is not a DNS name or an IP address a certificate may carry", n))
		}
	}
	if c.Readiness != ReadinessRunning && c.Readiness != ReadinessVoter {
		errs = append(errs, fmt.Errorf("--readiness %q: use %s or %s", c.Readiness, ReadinessRunning, ReadinessVoter))
	}
	if c.CertValidity < 30*time.Second {
		errs = append(errs, errors.New("--cert-validity must be at least 30s"))
	}
	for name, urls := range map[string][]string{FlagClientURLs: c.ClientURLs, FlagQuarantineClientURLs: c.QuarantineClientURLs, FlagPeerURLs: c.PeerURLs, FlagListenPeerURLs: c.ListenPeerURLs, FlagListenClientURLs: c.ListenClientURLs} {
		for _, u := range urls {
			if err := checkURL(u, c.EtcdInsecure); err != nil {
				errs = append(errs, fmt.Errorf("--%s: %w", name, err))
			}
		}
	}
	if c.NodeName != "" && !nodeNameRE.MatchString(c.NodeName) {
		errs = append(errs, fmt.Errorf("--node-name %q: use 1 to 63 lowercase letters, digits, dots and dashes, such as etcd-0", c.NodeName))
	}
	if overlap(c.ClientURLs, c.QuarantineClientURLs) || overlap(c.ListenClientURLs, c.QuarantineClientURLs) {
		errs = append(errs, fmt.Errorf("--%s and --%s must differ, or quarantine would not keep clients out", FlagClientURLs, FlagQuarantineClientURLs))
	}
	if _, err := peer.ParseDiscovery(c.Discovery, peer.DiscoveryOptions{Store: func(context.Context) (peer.BlobStore, error) { return nil, nil }}); err != nil {
		errs = append(errs, err)
	}
	if c.DiscoveryMaxRecords < 1 {
		errs = append(errs, fmt.Errorf("--discovery-max-records %d: read at least 1", c.DiscoveryMaxRecords))
	}
	if c.MemberFailureGrace < 0 {
		errs = append(errs, errors.New("--member-failure-grace must not be negative"))
	}
	if c.LearnerTimeout < 10*time.Second {
		errs = append(errs, errors.New("--learner-timeout must be at least 10s"))
	}
	if c.LeaderLease < time.Second {
		errs = append(errs, errors.New("--leader-lease must be at least 1s"))
	}
	errs = append(errs, c.Backup.Validate()...)
	errs = append(errs, c.Compaction.Validate()...)
	if c.Capture.Enabled {
		if err := c.Capture.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.MetricsAddress != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddress); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-address %q: want host:port", c.MetricsAddress))
		}
	} else if c.EnablePprof {
		errs = append(errs, errors.New("--enable-pprof needs --metrics-address, where the profiles are served"))
	}
	if c.MaxSnapshotBytes <= 0 {
		errs = append(errs, fmt.Errorf("--max-snapshot-bytes %d must be positive", c.MaxSnapshotBytes))
	}
	if c.Trash.MaxAge < 0 || c.Trash.MaxBytes < 0 {
		errs = append(errs, errors.New("--trash-max-age and --trash-max-bytes must not be negative"))
	}
	if c.EtcdCorruptCheckInterval < 0 {
		errs = append(errs, fmt.Errorf("--etcd-corrupt-check-interval %s is negative", c.EtcdCorruptCheckInterval))
	}
	if c.RestoreDrillInterval < 0 {
		errs = append(errs, fmt.Errorf("--restore-drill-interval %s is negative", c.RestoreDrillInterval))
	}
	if c.HashCheckInterval < 0 {
		errs = append(errs, fmt.Errorf("--hash-check-interval %s is negative", c.HashCheckInterval))
	}
	if c.LoopInterval <= 0 {
		errs = append(errs, errors.New("--loop-interval must be positive"))
	}
	if c.EtcdStopTimeout <= 0 {
		errs = append(errs, errors.New("--etcd-stop-timeout must be positive"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("controller: invalid configuration: %w", errors.Join(errs...))
	}
	return nil
}

// msgTLSOff is the warning an agent logs at start when --insecure or
// --etcd-insecure turns TLS off; securityOff gives its attributes.
const msgTLSOff = "TLS is turned off: that traffic is plaintext and unauthenticated"

// securityOff describes what --insecure and --etcd-insecure turn off, as
// the attributes of msgTLSOff; nil when TLS is on everywhere.
func (c Config) securityOff() []any {
	const (
		peerRisk = "the agents' peer API is plaintext: anyone who can reach --address:--peer-port can read this node's status and make it join, leave or restore a cluster"
		etcdRisk = "etcd's client and peer URLs are plain http: anyone who can reach them can read and write every key, and raft traffic between members is unauthenticated"
	)
	var off, flags, risks []string
	if c.Insecure {
		off, flags, risks = append(off, "peer API"), append(flags, "--"+FlagInsecure), append(risks, peerRisk)
	}
	if c.EtcdInsecure {
		off, flags, risks = append(off, "etcd"), append(flags, "--"+FlagEtcdInsecure), append(risks, etcdRisk)
	}
	var on string
	switch {
	case len(off) == 0:
		return nil
	case !c.Insecure:
		on = "peer API (mutual TLS)"
	case !c.EtcdInsecure:
		on = "etcd (https with client certificates)"
	default:
		on = "nothing"
	}
	return []any{"off", strings.Join(off, " and "), "flags", strings.Join(flags, " "), "still-secured", on,
		"risk", strings.Join(risks, "; "), "fix", "drop the flag(s) on a network that is not wholly trusted; docs/security.md explains how to turn TLS on for a running cluster"}
}

func checkURL(raw string, insecure bool) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q: %w", raw, err)
	}
	want := "https"
	if insecure {
		want = "http"
	}
	if u.Scheme != want {
		return fmt.Errorf("%q: scheme must be %s", raw, want)
	}
	if u.Port() == "" || u.Hostname() == "" {
		return fmt.Errorf("%q: needs a host and a port", raw)
	}
	if u.Path != "" && u.Path != "/" {
		return fmt.Errorf("%q: must not have a path", raw)
	}
	return nil
}

func overlap(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if strings.EqualFold(strings.TrimSuffix(x, "/"), strings.TrimSuffix(y, "/")) {
				return true
			}
		}
	}
	return false
}

// BackupConfig is when backups are taken and how long they are kept; the
// managing agent and the backup-only agent share it.
type BackupConfig struct {
	// Interval is the time between periodic backups.
	Interval time.Duration
	// Retention is the retention policy (see backup.ParseRetention).
	Retention string
	// RetryDelay is the wait after a failed backup; it doubles with each
	// further failure, up to Interval.
	RetryDelay time.Duration
	// EncryptionKeyFile holds the age key that backups and captured
	// segments are encrypted with (none: they are not encrypted).
	EncryptionKeyFile string
	// DecryptionKeyFiles hold more keys, only to read backups and
	// segments written with them: older keys, during a rotation.
	DecryptionKeyFiles []string
}

// Flags of the encryption keys, named in error messages as well.
const (
	FlagEncryptionKeyFile  = "backup-encryption-key-file"
	FlagDecryptionKeyFiles = "backup-decryption-key-file"
)

// Backup defaults.
const (
	DefaultBackupRetryDelay = 30 * time.Second
)

// DefaultBackupConfig returns the defaults.
func DefaultBackupConfig() BackupConfig {
	return BackupConfig{Interval: DefaultBackupInterval, Retention: "default", RetryDelay: DefaultBackupRetryDelay}
}

// Validate reports every problem with the backup settings.
func (c BackupConfig) Validate() []error {
	var errs []error
	if c.Interval < time.Minute {
		errs = append(errs, errors.New("--backup-interval must be at least 1m"))
	}
	if _, err := backup.ParseRetention(c.Retention); err != nil {
		errs = append(errs, fmt.Errorf("--backup-retention: %w", err))
	}
	if c.RetryDelay < time.Second {
		errs = append(errs, errors.New("--backup-retry-delay must be at least 1s"))
	}
	if _, err := c.Keyring(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// Keyring reads the key files: the encryption key writes and reads, the
// decryption keys only read. With neither, it is nil: backups are written
// in plaintext and only plaintext ones can be read.
func (c BackupConfig) Keyring() (*crypt.Keyring, error) {
	var write *crypt.Key
	var errs []error
	if c.EncryptionKeyFile != "" {
		k, err := crypt.LoadKeyFile(c.EncryptionKeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", FlagEncryptionKeyFile, err))
		}
		write = k
	}
	var read []*crypt.Key
	for _, f := range c.DecryptionKeyFiles {
		if f == "" {
			errs = append(errs, fmt.Errorf("--%s: an empty file name", FlagDecryptionKeyFiles))
			continue
		}
		k, err := crypt.LoadKeyFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", FlagDecryptionKeyFiles, err))
			continue
		}
		read = append(read, k)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if write == nil && len(read) == 0 {
		return nil, nil
	}
	return crypt.NewKeyring(write, read...), nil
}

// logKeys says at start whether backups are encrypted, and with which
// keys: their IDs, never the keys.
func logKeys(log *slog.Logger, keys *crypt.Keyring) {
	switch {
	case keys.Encrypting():
		log.Info("backups and captured segments are encrypted at rest", "key-id", keys.WriteKeyID(), "readable-key-ids", keys.IDs())
	case keys != nil:
		log.Warn("backups and captured segments are written unencrypted: there is no --"+FlagEncryptionKeyFile+"; older encrypted ones stay readable",
			"readable-key-ids", keys.IDs())
	}
}

// newBackups returns the backup taker for these settings.
func (c BackupConfig) newBackups(node string, log *slog.Logger, met *metrics, now func() time.Time) *backups {
	return &backups{node: node, log: log, met: met, now: now, retention: c.Retention, retryDelay: c.RetryDelay, maxRetry: max(c.Interval, c.RetryDelay),
		status: childStatusReader(), revision: childRevisionReader()}
}

// Readiness modes (--readiness).
const (
	ReadinessRunning = "running"
	ReadinessVoter   = "voter"
)
