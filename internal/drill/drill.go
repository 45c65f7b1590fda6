package drill

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcd-manager/etcd-manager/internal/backup"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Bounds of a drill: as a whole, and for etcd's start on the restored
// data (which reads the whole database), each a base plus a share per GiB
// of the backup.
const (
	timeoutBase   = 10 * time.Minute
	timeoutPerGiB = 2 * time.Minute
	startBase     = time.Minute
	startPerGiB   = time.Minute
	stopTimeout   = 10 * time.Second
)

// Errors that mean the backup did not restore as its meta says, as
// opposed to a drill that could not run.
var (
	ErrMismatch = errors.New("drill: the restored data differs from the backup's meta")
	ErrRestore  = errors.New("drill: the backup does not restore")
)

// Config is where a drill runs and how it reaches its scratch etcd.
type Config struct {
	// DataDir is the agent's data directory; drills run in its tmp/.
	DataDir string
	// EtcdBinDir holds the etcd versions installed (see
	// etcdproc.FindBinaries).
	EtcdBinDir string
	// Fetch are the options of the backup's fetch: its keys, its bounds.
	Fetch backup.FetchOptions
	// ServerTLS are the files the scratch etcd serves with, and ClientTLS
	// how the drill calls it; both nil without TLS.
	ServerTLS *etcdproc.TLSFiles
	ClientTLS *tls.Config
}

// Validate reports a Config a drill cannot run with.
func (c Config) Validate() error {
	switch {
	case c.DataDir == "":
		return errors.New("drill: no data directory")
	case c.EtcdBinDir == "":
		return errors.New("drill: no etcd binary directory")
	case (c.ServerTLS == nil) != (c.ClientTLS == nil):
		return errors.New("drill: TLS for the scratch etcd's server and its client go together")
	}
	return nil
}

// Failed reports whether err says the backup is bad (or cannot be
// read with the keys held), rather than that the drill could not run.
func Failed(err error) bool {
	for _, e := range []error{backup.ErrCorrupt, backup.ErrCheckLimit, backup.ErrNoKey, backup.ErrTooLarge, ErrMismatch, ErrRestore} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Fits checks that a drill of a backup fits in dir: the snapshot
// and the data restored from it are on that disk at once, and both must
// leave free the reserve any fetch leaves, so that a drill never fills
// the disk the live etcd runs on. (Fetch checks the maximum size.) It
// returns the room there is.
func Fits(opts backup.FetchOptions, dir, name string, meta backup.Meta) (int64, error) {
	if meta.Size <= 0 {
		return 0, fmt.Errorf("drill: backup %s records no size (an older etcd-manager or kops wrote it): a drill could not bound what it unpacks", name)
	}
	opts.MaxBytes = 0
	room, err := opts.Room(dir)
	if err != nil {
		return 0, fmt.Errorf("drill: free space for a restore drill: %w", err)
	}
	if need := 2 * meta.Size; need > room {
		return room, fmt.Errorf("drill: a restore drill of %s needs %d bytes in %s (the snapshot and its restored copy), and %d may be used: %w",
			name, need, dir, room, backup.ErrTempFull)
	}
	return room, nil
}

// Result is what a drill found.
type Result struct {
	// Revision is the restored etcd's revision.
	Revision int64
	// HashKV is its HashKV at the backup's revision; nil when the backup
	// records none to compare with.
	HashKV *uint32
	// Note says what was not checked, if anything.
	Note string
}

// Run drills backup name: it fetches the backup into a folder of the
// data directory's tmp/, restores it with the etcd version that took it
// (or, lacking that, runningVersion), starts a scratch etcd on it and
// compares it with the meta. An error for which Failed holds says the
// backup is bad; any other, that the drill could not run.
func Run(ctx context.Context, s backup.Reader, cfg Config, name, runningVersion string) (Result, error) {
	var out Result
	if err := cfg.Validate(); err != nil {
		return out, err
	}
	meta, err := backup.ReadMeta(ctx, s, name)
	if err != nil {
		return out, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeoutBase+time.Duration(meta.Size>>30)*timeoutPerGiB)
	defer cancel()
	tmp := filepath.Join(cfg.DataDir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return out, fmt.Errorf("drill: %w", err)
	}
	dir, err := os.MkdirTemp(tmp, "drill-")
	if err != nil {
		return out, fmt.Errorf("drill: %w", err)
	}
	defer os.RemoveAll(dir)

	opts := cfg.Fetch
	room, err := Fits(opts, dir, name, meta)
	if err != nil {
		return out, err
	}
	// Whatever the meta read again says, the snapshot takes at most half
	// the room, and its restored copy the other half.
	if opts.MaxBytes <= 0 || opts.MaxBytes > room/2 {
		opts.MaxBytes = room / 2
	}
	snap, meta, err := backup.Fetch(ctx, s, name, filepath.Join(dir, "fetch"), opts)
	if err != nil {
		return out, err
	}

	bins, err := binaries(cfg.EtcdBinDir, meta.EtcdVersion, runningVersion)
	if err != nil {
		return out, err
	}
	ports, err := etcdproc.FreeLoopbackPorts(2)
	if err != nil {
		return out, err
	}
	tlsFiles := cfg.ServerTLS
	peerURL := etcdproc.LoopbackURL(ports[0], tlsFiles == nil)
	clientURL := etcdproc.LoopbackURL(ports[1], tlsFiles == nil)
	token := make([]byte, 8)
	_, _ = rand.Read(token)
	es := etcdproc.Spec{
		Binaries:       bins,
		Name:           "restore-drill",
		DataDir:        filepath.Join(dir, "data"),
		ClientURLs:     []string{clientURL},
		PeerURLs:       []string{peerURL},
		InitialCluster: "restore-drill=" + peerURL,
		ClusterToken:   "restore-drill-" + hex.EncodeToString(token),
		TLS:            tlsFiles,
	}
	if err := bins.RestoreSnapshot(ctx, etcdproc.RestoreOptions{SnapshotPath: snap, DataDir: es.DataDir, Name: es.Name,
		PeerURLs: es.PeerURLs, InitialCluster: es.InitialCluster, Token: es.ClusterToken}); err != nil {
		return out, fmt.Errorf("%w: %s: %w", ErrRestore, name, err)
	}
	_ = os.Remove(snap) // the restored copy is what etcd reads

	logPath := filepath.Join(dir, "etcd.log")
	proc, err := etcdproc.StartScratch(es, logPath)
	if err != nil {
		return out, err
	}
	defer proc.Stop(stopTimeout)
	c, err := etcdproc.NewClient([]string{clientURL}, cfg.ClientTLS)
	if err != nil {
		return out, err
	}
	defer c.Close()
	startBy := startBase + time.Duration(meta.Size>>30)*startPerGiB
	sctx, cancel := context.WithTimeout(ctx, startBy)
	var st *clientv3.StatusResponse
	err = proc.WaitReady(sctx, func(ctx context.Context) error {
		st, err = c.Status(ctx, clientURL)
		return err
	})
	cancel()
	if errors.Is(err, etcdproc.ErrScratchExited) {
		return out, fmt.Errorf("%w: etcd did not start on the restored data of %s: %w: %s", ErrRestore, name, err, etcdproc.LogTail(logPath))
	}
	if err != nil {
		return out, fmt.Errorf("drill: restore drill of %s: %w: %s", name, err, etcdproc.LogTail(logPath))
	}
	return check(ctx, c, clientURL, meta, st.Header.Revision)
}

// checker is the part of an etcd client a drill's check needs.
type checker interface {
	etcdproc.HashKVer
	Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error)
}

// check compares the restored etcd with the backup's meta: its
// revision reaches the meta's, and its HashKV at that revision is the one
// the member had when the backup was taken. A compaction of the member
// between the snapshot and its HashKV is replayed on the scratch etcd
// first, as the hash covers the history after the compacted revision.
func check(ctx context.Context, c checker, endpoint string, meta backup.Meta, revision int64) (Result, error) {
	out := Result{Revision: revision}
	if revision < meta.Revision {
		return out, fmt.Errorf("%w: the restored etcd is at revision %d, behind the meta's %d", ErrMismatch, revision, meta.Revision)
	}
	want := meta.HashKV
	if want == nil || meta.Revision == 0 {
		out.Note = "revision checked; the backup records no HashKV"
		return out, nil
	}
	h, err := etcdproc.HashKV(ctx, c, endpoint, meta.Revision)
	if err != nil {
		return out, fmt.Errorf("drill: HashKV of the restored etcd at revision %d: %w", meta.Revision, err)
	}
	if h.CompactRevision < want.CompactRevision {
		if _, err := c.Compact(ctx, want.CompactRevision, clientv3.WithCompactPhysical()); err != nil {
			return out, fmt.Errorf("drill: compact the restored etcd to revision %d: %w", want.CompactRevision, err)
		}
		if h, err = etcdproc.HashKV(ctx, c, endpoint, meta.Revision); err != nil {
			return out, fmt.Errorf("drill: HashKV of the restored etcd at revision %d: %w", meta.Revision, err)
		}
	}
	out.HashKV = &h.Hash
	switch {
	case h.CompactRevision != want.CompactRevision:
		return out, fmt.Errorf("%w: the restored etcd is compacted to revision %d, the member was at %d when the backup was taken",
			ErrMismatch, h.CompactRevision, want.CompactRevision)
	case h.Hash != want.Hash:
		return out, fmt.Errorf("%w: the restored data's HashKV at revision %d is %d; the member's was %d when the backup was taken",
			ErrMismatch, meta.Revision, h.Hash, want.Hash)
	}
	return out, nil
}

// binaries are the binaries of the version that took the backup, or of
// the running one when that is not installed.
func binaries(binDir, backupVersion, runningVersion string) (etcdproc.Binaries, error) {
	var errs []error
	for _, v := range []string{backupVersion, runningVersion} {
		ver, err := spec.ParseVersion(v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		bins, err := etcdproc.FindBinaries(binDir, ver)
		if err == nil {
			return bins, nil
		}
		errs = append(errs, err)
	}
	return etcdproc.Binaries{}, fmt.Errorf("drill: no etcd to run a restore drill with: %w", errors.Join(errs...))
}
