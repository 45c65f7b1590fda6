package controller

import (
	"context"
	"log/slog"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/history"
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
	got, err := history.Fetch(ctx, s, name, p, dir, opts, f.log)
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
