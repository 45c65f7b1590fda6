package agent

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/controller"
	"github.com/etcd-manager/etcd-manager/internal/pki"
)

// Config is the agent's configuration: the control loop's settings, and
// the process's own (addresses, TLS, the HTTP server, etcd's flags). The
// flag names follow the etcd-manager walkthrough that users already know.
type Config struct {
	// Config holds the control loop's settings.
	controller.Config

	// NodeName is the node ID a fresh data dir takes, and so the etcd
	// member's name (a StatefulSet pod's name); empty gives a random one.
	NodeName string

	// Address is where the agent's peer API listens; PeerPort its port.
	Address  string
	PeerPort int
	// PeerAPIListenAddress is the host:port the peer API binds when it
	// differs from the Address:PeerPort it advertises (NAT, a proxy).
	PeerAPIListenAddress string
	// EtcdAddress is the address etcd binds; it fills in URLs not given.
	EtcdAddress string

	// ListenClientURLs are the addresses etcd binds for clients, when
	// they differ from the ClientURLs it advertises (a pod's loopback as
	// well as its IP, say); never while quarantined.
	ListenClientURLs []string
	// ListenPeerURLs are the addresses etcd binds for peer traffic when
	// they differ from the PeerURLs it advertises (NAT, a proxy); empty
	// means it binds PeerURLs.
	ListenPeerURLs []string

	Insecure     bool
	EtcdInsecure bool
	// PKIDir holds a CA (ca.crt, ca.key) supplied as files; without it the
	// CA is generated once into the backup store's pki/ prefix.
	PKIDir string
	// CertValidity is how long node certificates are issued for; they are
	// renewed two thirds into it.
	CertValidity time.Duration
	// CertNames are more DNS names and IP addresses for the node
	// certificate, such as the Kubernetes Service names clients dial.
	CertNames []string
	// PeerAcceptUnmarkedUntil, when set (RFC 3339), lets node
	// certificates without a cluster marker, issued before markers
	// existed, make a node's calls on the peer API until then: at most
	// MaxUnmarkedWindow ahead.
	PeerAcceptUnmarkedUntil string

	// MetricsAddress serves Prometheus metrics when set (host:port).
	MetricsAddress string
	// EnablePprof serves Go's runtime profiles beside the metrics.
	EnablePprof bool
	// Readiness is what /readyz reports ready: ReadinessRunning (a
	// standby, or a member whose etcd runs) or ReadinessVoter (a voting
	// member whose etcd serves).
	Readiness string

	// EtcdStopTimeout bounds a graceful etcd stop before SIGKILL.
	EtcdStopTimeout time.Duration
	// EtcdSnapshotCount is etcd's --snapshot-count; 0 keeps etcd's own.
	EtcdSnapshotCount int
	// EtcdCorruptCheckInterval is how often etcd checks that its members
	// agree (0: never); its checks at start and after each compaction are
	// always on.
	EtcdCorruptCheckInterval time.Duration
}

// Defaults. The ports fill in URLs that are not given.
const (
	DefaultPeerPort        = 8000
	DefaultClientPort      = 4001
	DefaultQuarantinePort  = 8001
	DefaultEtcdPeerPort    = 2380
	DefaultEtcdStopTimeout = 15 * time.Second
	defaultAddress         = "127.0.0.1"
)

// Flag names used in error messages, and by cmd/internal/flags, which registers them.
const (
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

// Default returns the configuration with defaults filled in.
func Default() Config {
	return Config{
		Config:                   controller.Default(),
		Address:                  defaultAddress,
		PeerPort:                 DefaultPeerPort,
		EtcdAddress:              defaultAddress,
		EtcdStopTimeout:          DefaultEtcdStopTimeout,
		EtcdCorruptCheckInterval: DefaultEtcdCorruptCheckInterval,
		CertValidity:             pki.DefaultCertValidity,
		Readiness:                ReadinessRunning,
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

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)

// Validate checks the configuration and returns every problem found.
func (c *Config) Validate() error {
	errs := c.Config.Validate()
	if _, err := c.unmarkedUntil(time.Now()); err != nil {
		errs = append(errs, err)
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
	if c.MetricsAddress != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddress); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-address %q: want host:port", c.MetricsAddress))
		}
	} else if c.EnablePprof {
		errs = append(errs, errors.New("--enable-pprof needs --metrics-address, where the profiles are served"))
	}
	if c.EtcdCorruptCheckInterval < 0 {
		errs = append(errs, fmt.Errorf("--etcd-corrupt-check-interval %s is negative", c.EtcdCorruptCheckInterval))
	}
	if c.EtcdStopTimeout <= 0 {
		errs = append(errs, errors.New("--etcd-stop-timeout must be positive"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("agent: invalid configuration: %w", errors.Join(errs...))
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

// Readiness modes (--readiness).
const (
	ReadinessRunning = "running"
	ReadinessVoter   = "voter"
)

// MaxUnmarkedWindow bounds --peer-accept-unmarked-until: long enough to
// upgrade every agent of a cluster, which reissues its certificate with
// the marker at start.
const MaxUnmarkedWindow = 30 * 24 * time.Hour

// unmarkedUntil is --peer-accept-unmarked-until as a time (zero when
// unset), refused when more than MaxUnmarkedWindow after now.
func (c *Config) unmarkedUntil(now time.Time) (time.Time, error) {
	if c.PeerAcceptUnmarkedUntil == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, c.PeerAcceptUnmarkedUntil)
	if err != nil {
		return time.Time{}, fmt.Errorf("--peer-accept-unmarked-until %q: want an RFC 3339 time, such as %s", c.PeerAcceptUnmarkedUntil, now.Add(7*24*time.Hour).UTC().Format(time.RFC3339))
	}
	if t.After(now.Add(MaxUnmarkedWindow)) {
		return time.Time{}, fmt.Errorf("--peer-accept-unmarked-until %s is more than %s away: upgrade the agents within that, and they carry the marker", c.PeerAcceptUnmarkedUntil, MaxUnmarkedWindow)
	}
	return t, nil
}
