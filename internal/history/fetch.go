package history

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/changelog"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Fetched is a backup fetched, verified and brought forward to a point.
type Fetched struct {
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

// Fetch fetches and verifies backup name into dir, and brings it forward
// to the point's revision with the captured segments of its timeline,
// within the room opts leaves on dir's disk.
func Fetch(ctx context.Context, s Store, name string, p spec.RestorePoint, dir string, opts backup.FetchOptions, log *slog.Logger) (Fetched, error) {
	path, meta, err := backup.Fetch(ctx, s, name, dir, opts)
	f := Fetched{Path: path, Meta: meta}
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
		return f, fmt.Errorf("history: %w", err)
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
		return f, fmt.Errorf("history: bring backup %s forward to revision %d: %w", name, p.ToRevision, err)
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

// StoreFetcher fetches and verifies backups for a node's restores (see
// Fetch), from a store of its own that each fetch opens at URL: a node's
// calls must not share its loop's store.
type StoreFetcher struct {
	URL  string
	Opts backup.FetchOptions
	Log  *slog.Logger
}

// Fetch fetches backup name into dir and brings it forward to the point,
// and returns the snapshot's path.
func (f StoreFetcher) Fetch(ctx context.Context, name string, p spec.RestorePoint, dir string) (string, error) {
	s, err := store.Open(ctx, f.URL, store.Options{Create: true})
	if err != nil {
		return "", err
	}
	defer s.Close()
	opts := f.Opts
	if p.ToRevision > 0 {
		// Captured segments are applied to the snapshot in this process:
		// its database is read whole in a child first, whatever the meta
		// says.
		opts.Hashed = false
	}
	got, err := Fetch(ctx, s, name, p, dir, opts, f.Log)
	return got.Path, err
}
