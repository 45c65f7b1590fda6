package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"

	"github.com/etcd-manager/etcd-manager/internal/agent"
	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/storeops"
)

// The files fetch-backup writes in --out.
const (
	fetchedSnapshot = "snapshot.db"
	fetchedMeta     = backup.MetaObject
)

func fetchBackupCommand(o *options, stdout io.Writer) *cobra.Command {
	var out string
	var keyFiles []string
	cmd := &cobra.Command{
		Use:   "fetch-backup NAME --out DIR",
		Short: "Download a backup, decrypt and check it, and write it as DIR/snapshot.db for a restore by hand",
		Long: `fetch-backup downloads the backup NAME (as list-backups prints it) and writes
its etcd snapshot to DIR/snapshot.db and its meta to DIR/` + fetchedMeta + `, for a
restore with etcd's own tools when etcd-manager cannot run (docs/manual-restore.md):

  etcdutl snapshot restore DIR/snapshot.db --name ... --initial-cluster ... \
    --initial-cluster-token ... --initial-advertise-peer-urls ... --data-dir ...

It checks what the agents check before a restore: the object's sha256
against the meta, the gzip stream whole, the snapshot's sha256 trailer, and
the snapshot's status, read in a child process under a memory ceiling. An
encrypted backup needs its age key (--backup-decryption-key-file; list-backups
-o json names the key each backup needs). Nothing is written to DIR unless
every check passes, and fetch-backup never overwrites: DIR must hold no
snapshot.db or meta yet. It is created with mode 0700 when missing. On a
terminal it shows a progress bar; otherwise a line every few seconds.`,
		Example: `  etcd-manager-ctl --backup-store=file:///tmp/etcd-manager/backups/test fetch-backup 2026-11-22T05:00:00Z-000001 --out ./restore
  etcd-manager-ctl --backup-store=s3://my-bucket/etcd/main fetch-backup 2026-11-22T05:00:00Z-000001 --out ./restore --backup-decryption-key-file=backup.key`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeFrom(backupNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usagef("fetch-backup: --out DIR is required")
			}
			keys, err := loadKeyring(keyFiles)
			if err != nil {
				return usageError{err}
			}
			return o.fetchBackup(cmd.Context(), stdout, args[0], out, keys)
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write snapshot.db and the backup's meta to; created with mode 0700 when missing")
	cmd.Flags().StringSliceVar(&keyFiles, "backup-decryption-key-file", nil, "a file holding the age key an encrypted backup needs (repeat for several)")
	return cmd
}

// loadKeyring reads the age key files given, nil when there are none.
func loadKeyring(files []string) (*crypt.Keyring, error) {
	var keys []*crypt.Key
	for _, f := range files {
		k, err := crypt.LoadKeyFile(f)
		if err != nil {
			return nil, fmt.Errorf("--backup-decryption-key-file: %w", err)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return crypt.NewKeyring(nil, keys...), nil
}

// fetchResult is what fetch-backup reports.
type fetchResult struct {
	Backup      string `json:"backup"`
	Snapshot    string `json:"snapshot"`
	Meta        string `json:"meta"`
	Size        int64  `json:"size"`
	Revision    int64  `json:"revision"`
	TotalKeys   int    `json:"totalKeys"`
	Hash        uint32 `json:"hash"`
	EtcdVersion string `json:"etcdVersion,omitempty"`
	// EncryptionKeyID names the key the backup was decrypted with.
	EncryptionKeyID string `json:"encryptionKeyId,omitempty"`
}

func (o *options) fetchBackup(ctx context.Context, w io.Writer, name, out string, keys *crypt.Keyring) error {
	snapPath, metaPath := filepath.Join(out, fetchedSnapshot), filepath.Join(out, fetchedMeta)
	for _, p := range []string{snapPath, metaPath} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("fetch-backup: %s exists, and fetch-backup never overwrites: move it away or choose another --out", p)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("fetch-backup: --out: %w", err)
		}
	}
	s, err := o.openStore(ctx, false)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := storeops.CheckBackup(ctx, s, name); err != nil {
		return fmt.Errorf("fetch-backup: %w", err)
	}
	meta, err := backup.ReadMeta(ctx, s, name)
	if err != nil {
		return fmt.Errorf("fetch-backup: %w", err)
	}
	if err := keys.Check("backup "+name, meta.Encryption); err != nil {
		return fmt.Errorf("fetch-backup: %w; pass its key with --backup-decryption-key-file", err)
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return fmt.Errorf("fetch-backup: --out: %w", err)
	}
	// The snapshot is written and checked under a folder of its own in
	// DIR, and renamed into place only once every check passed.
	tmp, err := os.MkdirTemp(out, ".fetch-")
	if err != nil {
		return fmt.Errorf("fetch-backup: --out: %w", err)
	}
	defer os.RemoveAll(tmp)

	progress := o.stderr
	m := startMeter(progress, "fetch "+name, meta.CompressedSize)
	var status snapshot.Status
	check := verifier()
	path, meta, err := backup.Fetch(ctx, meteredStore{s: s, m: m}, name, tmp, backup.FetchOptions{
		Keys: keys,
		Status: func(ctx context.Context, p string) (snapshot.Status, error) {
			m.Finish()
			m = nil
			fprintf(progress, "fetch %s: checking the snapshot's status\n", name)
			st, err := check(ctx, p)
			status = st
			return st, err
		},
	})
	if m != nil {
		m.Finish()
	}
	if err != nil {
		return fmt.Errorf("fetch-backup: %w; nothing was written to %s", err, out)
	}
	if meta.Revision > 0 && status.Revision != meta.Revision {
		fprintf(o.stderr, "warning: the snapshot is at revision %d, but its meta says %d\n", status.Revision, meta.Revision)
	}
	metaJSON, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return fmt.Errorf("fetch-backup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(tmp, fetchedMeta), append(metaJSON, '\n'), 0o600); err != nil {
		return fmt.Errorf("fetch-backup: %w", err)
	}
	if err := os.Rename(path, snapPath); err != nil {
		return fmt.Errorf("fetch-backup: %w", err)
	}
	if err := os.Rename(filepath.Join(tmp, fetchedMeta), metaPath); err != nil {
		return fmt.Errorf("fetch-backup: %w", err)
	}
	res := fetchResult{Backup: name, Snapshot: snapPath, Meta: metaPath, Size: status.TotalSize, Revision: status.Revision,
		TotalKeys: status.TotalKey, Hash: status.Hash, EtcdVersion: meta.EtcdVersion}
	if meta.Encryption != nil {
		res.EncryptionKeyID = meta.Encryption.KeyID
	}
	return o.emit(w, res, func() error {
		return fprintf(w, "wrote %s (%s, revision %d, %d keys, etcd %s) and %s\n"+
			"checked: the object's sha256, the gzip stream, the snapshot's sha256 trailer and its status\n"+
			"restore it with etcdutl snapshot restore %s (see docs/manual-restore.md)\n",
			snapPath, size(status.TotalSize), status.Revision, status.TotalKey, dash(meta.EtcdVersion), metaPath, snapPath)
	})
}

// verifier reads a fetched snapshot's status in a child of this ctl,
// under the memory ceiling the agents give theirs: the snapshot comes
// from the store, and a damaged one can make bbolt crash or grow
// without bound.
func verifier() backup.VerifyFunc {
	exe, err := os.Executable()
	if err != nil {
		return func(context.Context, string) (snapshot.Status, error) {
			return snapshot.Status{}, fmt.Errorf("fetch-backup: cannot find this ctl's binary to check the snapshot in a child: %w", err)
		}
	}
	return backup.VerifyCommand(exe, agent.VerifySnapshotCommand, "--"+agent.StatusOnlyFlag)
}

// meteredStore counts the bytes read from the store's objects on a meter.
type meteredStore struct {
	s backup.Reader
	m *meter
}

func (s meteredStore) ReadMax(ctx context.Context, key string, max int64) ([]byte, error) {
	return s.s.ReadMax(ctx, key, max)
}

func (s meteredStore) Reader(ctx context.Context, key string) (io.ReadCloser, error) {
	r, err := s.s.Reader(ctx, key)
	if err != nil {
		return nil, err
	}
	return meteredReader{ReadCloser: r, m: s.m}, nil
}
