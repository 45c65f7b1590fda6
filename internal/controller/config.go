package controller

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backupjob"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/maintenance"
	"github.com/etcd-manager/etcd-manager/internal/peer"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// DefaultHashCheckInterval is how often the leader compares the members'
// HashKV by default; like etcd's periodic check, each pass reads every
// member's whole keyspace.
const DefaultHashCheckInterval = time.Hour

// DefaultRestoreDrillInterval is how often the leader checks that the
// newest backup restores.
const DefaultRestoreDrillInterval = 24 * time.Hour

// Config is the control loop's settings. Package agent embeds it in the
// process's configuration, whose flags set it.
type Config struct {
	ClusterName string
	BackupStore string
	DataDir     string

	// ClientURLs, QuarantineClientURLs and PeerURLs are the local etcd's
	// advertised URLs, as the node reports them to its peers.
	ClientURLs           []string
	QuarantineClientURLs []string
	PeerURLs             []string

	// EtcdPeerCertCheck lets the leader have etcd's peer port take only
	// node certificates, once every member's carries the node marker;
	// false on any agent keeps (or turns) the check off for the whole
	// cluster, as before a downgrade to an etcd-manager without it.
	EtcdPeerCertCheck bool

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
	Backup backupjob.Config
	// Capture is continuous capture, for restores to any point.
	Capture changelog.Config
	// Compaction is how the spec's compaction policy is carried out.
	Compaction maintenance.CompactionConfig

	// LoopInterval is the time between control-loop cycles.
	LoopInterval time.Duration
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

// FlagBackupStore names the store's flag in error messages; package agent
// and cmd/internal/flags register it.
const FlagBackupStore = "backup-store"

// Defaults.
const (
	DefaultLoopInterval       = 2 * time.Second
	DefaultMemberFailureGrace = time.Minute
	DefaultLearnerTimeout     = 15 * time.Minute
	DefaultTrashMaxAge        = 7 * 24 * time.Hour
	DefaultLeaderLease        = 20 * time.Second
	// DefaultMaxSnapshotBytes is twice etcd's suggested maximum quota of
	// 8 GiB.
	DefaultMaxSnapshotBytes = 16 << 30
	// fetchReserve is the space a backup being unpacked leaves free on
	// the data dir's disk, which the live etcd shares.
	fetchReserve = 1 << 30
)

// Default returns the loop's settings with defaults filled in.
func Default() Config {
	return Config{
		EtcdBinDir:           etcdproc.DefaultBinDir,
		Discovery:            "store",
		DiscoveryMaxRecords:  peer.DefaultMaxRecords,
		MemberFailureGrace:   DefaultMemberFailureGrace,
		LearnerTimeout:       DefaultLearnerTimeout,
		LeaderLease:          DefaultLeaderLease,
		Backup:               backupjob.Default(),
		Capture:              changelog.Default(),
		Compaction:           maintenance.DefaultCompactionConfig(),
		LoopInterval:         DefaultLoopInterval,
		HashCheckInterval:    DefaultHashCheckInterval,
		RestoreDrillInterval: DefaultRestoreDrillInterval,
		EtcdPeerCertCheck:    true,
		Trash:                etcdproc.TrashPolicy{MaxAge: DefaultTrashMaxAge},
		MaxSnapshotBytes:     DefaultMaxSnapshotBytes,
	}
}

var clusterNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Validate returns every problem with the loop's settings; package agent
// reports them with its own.
func (c *Config) Validate() []error {
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
	if c.MaxSnapshotBytes <= 0 {
		errs = append(errs, fmt.Errorf("--max-snapshot-bytes %d must be positive", c.MaxSnapshotBytes))
	}
	if c.Trash.MaxAge < 0 || c.Trash.MaxBytes < 0 {
		errs = append(errs, errors.New("--trash-max-age and --trash-max-bytes must not be negative"))
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
	return errs
}
