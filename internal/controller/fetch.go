package controller

import (
	"log/slog"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/history"
	"github.com/etcd-manager/etcd-manager/internal/node"
)

// RestoreFetcher returns the fetcher of the node's restores: it reads a
// snapshot's status with status, decrypts with keys, and follows each
// download on meter (none when nil).
func (c Config) RestoreFetcher(status backup.VerifyFunc, keys *crypt.Keyring, meter backup.Meter, log *slog.Logger) node.BackupFetcher {
	o := c.restoreFetchOptions(status, keys)
	o.Meter = meter
	return history.StoreFetcher{URL: c.BackupStore, Opts: o, Log: log}
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
// to a point reads it all the same (see history.StoreFetcher).
func (c Config) restoreFetchOptions(status backup.VerifyFunc, keys *crypt.Keyring) backup.FetchOptions {
	o := c.fetchOptions(status, keys)
	o.Hashed = true
	return o
}
