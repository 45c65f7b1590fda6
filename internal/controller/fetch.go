package controller

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/node"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// RestoreFetcher returns the fetcher of the node's restores: it reads a
// snapshot's status with status and decrypts with keys.
func (c Config) RestoreFetcher(status backup.VerifyFunc, keys *crypt.Keyring, log *slog.Logger) node.BackupFetcher {
	return storeFetcher{url: c.BackupStore, opts: c.restoreFetchOptions(status, keys), log: log}
}

// storeFetcher fetches and verifies backups for the node's restores,
// from a store of its own: peer API calls must not share the loop's.
type storeFetcher struct {
	url  string
	opts backup.FetchOptions
	log  *slog.Logger
}

func (f storeFetcher) Fetch(ctx context.Context, name string, p spec.RestorePoint, dir string) (string, error) {
	s, err := store.Open(ctx, f.url, store.Options{Create: true})
	if err != nil {
		return "", err
	}
	defer s.Close()
	opts := f.opts
	if p.ToRevision > 0 {
		// Captured segments are applied to the snapshot in this process:
		// its database is read whole in a child first, whatever the meta
		// says.
		opts.Hashed = false
	}
	got, err := fetchPoint(ctx, s, name, p, dir, opts, f.log)
	return got.Path, err
}

// fetchOptions bound what a backup fetched for a restore may unpack on
// the data dir's disk, decrypt it with keys and read its status with
// status.
func (c Config) fetchOptions(status backup.VerifyFunc, keys *crypt.Keyring) backup.FetchOptions {
	return backup.FetchOptions{Status: status, MaxBytes: c.MaxSnapshotBytes, Reserve: fetchReserve, Keys: keys}
}

// restoreFetchOptions are fetchOptions for a node's own restore: the
// leader fetched and verified the backup whole before it stopped the
// cluster, so a snapshot whose object matches the sha256 the meta records
// (the bytes the leader verified) is not read a second time before
// etcdutl restores it, which checks its trailer again itself. A restore
// to a point reads it all the same (see storeFetcher.Fetch).
func (c Config) restoreFetchOptions(status backup.VerifyFunc, keys *crypt.Keyring) backup.FetchOptions {
	o := c.fetchOptions(status, keys)
	o.Hashed = true
	return o
}

// fetched is a backup fetched, verified and brought forward to a point.
type fetched struct {
	Path string
	Meta backup.Meta
	// Keys are the IDs of the encryption keys the backup and the segments
	// needed.
	Keys []string
	// Forward is set when captured changes were applied, and Digest is
	// the revision of the digest that checked them (0: none in range).
	Forward bool
	Digest  int64
}

// fetchPoint fetches and verifies a backup, and brings it forward to the
// point's revision with the captured segments.
func fetchPoint(ctx context.Context, s *store.Store, name string, p spec.RestorePoint, dir string, opts backup.FetchOptions, log *slog.Logger) (fetched, error) {
	path, meta, err := backup.Fetch(ctx, s, name, dir, opts)
	f := fetched{Path: path, Meta: meta}
	if meta.Encryption != nil {
		f.Keys = append(f.Keys, meta.Encryption.KeyID)
	}
	if err != nil || p.ToRevision == 0 {
		return f, err
	}
	start := time.Now()
	// The snapshot may grow to what it takes now plus the room left, and
	// never past the maximum.
	bound := opts.MaxBytes
	st, err := os.Stat(path)
	if err != nil {
		return f, fmt.Errorf("controller: %w", err)
	}
	if room, err := opts.Room(dir); err == nil {
		bound = st.Size() + room
		if opts.MaxBytes > 0 {
			bound = min(bound, opts.MaxBytes)
		}
	} else {
		log.Warn("cannot read the free space before bringing a backup forward; bounding it by --max-snapshot-bytes alone", "error", err)
	}
	applied, err := changelog.Apply(ctx, s, path, p.Timeline, p.ToRevision, changelog.ApplyOptions{Keys: opts.Keys, MaxBytes: bound})
	if err != nil {
		f.Path = ""
		return f, fmt.Errorf("controller: bring backup %s forward to revision %d: %w", name, p.ToRevision, err)
	}
	for _, k := range applied.Keys {
		if !slices.Contains(f.Keys, k) {
			f.Keys = append(f.Keys, k)
		}
	}
	f.Forward, f.Digest = applied.Revisions > 0, applied.Digest
	log.Info("backup brought forward with captured changes", "backup", name, "timeline", p.Timeline, "from-revision", applied.From,
		"to-revision", applied.To, "revisions", applied.Revisions, "segments", applied.Segments, "leases", applied.Leases,
		"digest-checked-at", applied.Digest, "duration", time.Since(start).Round(time.Millisecond))
	return f, nil
}
