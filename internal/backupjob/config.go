package backupjob

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
)

// Config is when backups are taken and how long they are kept, and the
// keys they are encrypted with; the managing agent and the backup-only
// agent share it.
type Config struct {
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

// Defaults.
const (
	DefaultInterval   = 15 * time.Minute
	DefaultRetryDelay = 30 * time.Second
)

// Default returns the defaults.
func Default() Config {
	return Config{Interval: DefaultInterval, Retention: "default", RetryDelay: DefaultRetryDelay}
}

// Validate reports every problem with the backup settings.
func (c Config) Validate() []error {
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
func (c Config) Keyring() (*crypt.Keyring, error) {
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

// LogKeys says at start whether backups are encrypted, and with which
// keys: their IDs, never the keys.
func LogKeys(log *slog.Logger, keys *crypt.Keyring) {
	switch {
	case keys.Encrypting():
		log.Info("backups and captured segments are encrypted at rest", "key-id", keys.WriteKeyID(), "readable-key-ids", keys.IDs())
	case keys != nil:
		log.Warn("backups and captured segments are written unencrypted: there is no --"+FlagEncryptionKeyFile+"; older encrypted ones stay readable",
			"readable-key-ids", keys.IDs())
	}
}

// NewTaker returns the taker of these settings for node; readers read
// its snapshots.
func (c Config) NewTaker(node string, log *slog.Logger, now func() time.Time, readers Readers) *Taker {
	return &Taker{Node: node, Log: log, Now: now, Retention: c.Retention, RetryDelay: c.RetryDelay, MaxRetry: max(c.Interval, c.RetryDelay),
		Status: readers.Status, Revision: readers.Revision}
}

// Readers read snapshots in child processes (package agent), so that
// neither the memory a database maps nor a crash on a damaged file is the
// agent's. A nil func reads in process.
type Readers struct {
	// Status reads a snapshot's status, its sha256 trailer checked as it
	// streamed.
	Status backup.VerifyFunc
	// Revision reads a snapshot's revision.
	Revision backup.RevisionFunc
}
