package backup

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	kgzip "github.com/klauspost/compress/gzip"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/etcd-manager/etcd-manager/internal/crypt"
	"github.com/etcd-manager/etcd-manager/internal/etcdproc"
	"github.com/etcd-manager/etcd-manager/internal/spec"
	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Object names inside a backup. ClaimObject is ours: it reserves the name
// while the backup is written.
const (
	DataObject  = "etcd.backup.gz"
	MetaObject  = "_etcd_backup.meta"
	ClaimObject = "_claim"
)

// Errors. Check them with errors.Is.
var (
	ErrCorrupt = errors.New("backup: snapshot is corrupt")
	// ErrCheckLimit means the snapshot's check ran past its time limit,
	// or out of the address space it may use: it failed its check, and
	// is not taken as sound, though a host overloaded enough could do the
	// same to a sound one (see Ceiling).
	ErrCheckLimit = errors.New("backup: the snapshot's check reached its limit")
	ErrNotFound   = errors.New("backup: backup not found")
	ErrTempFull   = errors.New("backup: temp disk full")
	// ErrTooLarge means a backup unpacks to more than the agent allows.
	ErrTooLarge = errors.New("backup: backup too large")
	// ErrNoKey means a backup is encrypted with a key the agent does not
	// hold; errors.As finds the *crypt.NoKeyError with the key's ID.
	ErrNoKey = crypt.ErrNoKey
)

// Meta is the _etcd_backup.meta object. The first three fields are the
// etcd-manager format's; the rest are our additions.
type Meta struct {
	EtcdVersion string            `json:"etcdVersion"`
	Timestamp   spec.Int64        `json:"timestamp"`
	ClusterSpec *spec.ClusterSpec `json:"clusterSpec,omitempty"`

	// SHA256 is the hex sha256 of the etcd.backup.gz object, as stored
	// (encrypted, when it is).
	SHA256 string `json:"sha256,omitempty"`
	// Size is the snapshot db's size, CompressedSize the object's.
	Size           int64  `json:"size,omitempty"`
	CompressedSize int64  `json:"compressedSize,omitempty"`
	Revision       int64  `json:"revision,omitempty"`
	TotalKeys      int    `json:"totalKeys,omitempty"`
	ClusterToken   string `json:"clusterToken,omitempty"`
	// Encryption names the key the object is encrypted with; nil when it
	// is not.
	Encryption *crypt.Info `json:"encryption,omitempty"`
	// Kind is why the backup was taken (spec.BackupPeriodic, ...), and
	// Seconds how long taking it took, upload included.
	Kind    string  `json:"kind,omitempty"`
	Seconds float64 `json:"seconds,omitempty"`
	// HashKV is the member's HashKV at Revision, read as the backup was
	// taken; a restore drill compares the restored data's with it.
	HashKV *HashKV `json:"hashKV,omitempty"`
	// SnapshotTime is when the snapshot had been read whole, in unix
	// nanoseconds: Revision was committed by then. Timestamp is in whole
	// seconds and taken before the snapshot, so it may precede writes
	// the snapshot holds. 0 in backups of older versions and of kops.
	SnapshotTime spec.Int64 `json:"snapshotTime,omitempty"`
}

// PointTime is when the backup's state held, as near as the meta says:
// its SnapshotTime, or its Timestamp where it has none.
func (m Meta) PointTime() time.Time {
	if m.SnapshotTime > 0 {
		return time.Unix(0, int64(m.SnapshotTime))
	}
	return time.Unix(int64(m.Timestamp), 0)
}

// HashKV is etcd's HashKV of a member's keys at a revision, and the
// revision the member had compacted to then (-1: none): the hash covers
// the history after it.
type HashKV struct {
	Hash            uint32 `json:"hash"`
	CompactRevision int64  `json:"compactRevision"`
}

// Store is the part of the backup store backups need.
type Store interface {
	Put(ctx context.Context, key string, r io.Reader) error
	Create(ctx context.Context, key string, data []byte) error
	Delete(ctx context.Context, key string) error
	ReadMax(ctx context.Context, key string, max int64) ([]byte, error)
	Write(ctx context.Context, key string, data []byte) error
	List(ctx context.Context, prefix, delimiter string) ([]string, error)
}

// Info describes one backup.
type Info struct {
	Name string
	Meta Meta
	// Stages is how long each step of a backup just taken took.
	Stages Stages
	// HashKVErr is why a backup just taken records no HashKV.
	HashKVErr error
	// HashKVBeside is whether the HashKV was read beside the status
	// check (see Request.Revision); HashKVLate is why not, when asked.
	HashKVBeside bool
	HashKVLate   error
}

// Stages times the steps of a backup: the snapshot streamed in,
// compressed and uploaded all at once; the checks at its end, while the
// upload waits to commit; and the HashKV read and meta written after.
type Stages struct {
	Stream, Verify, Commit time.Duration
}

var nameRE = regexp.MustCompile(`^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)-(\d{6})$`)

// Request says what to back up and how to describe it.
type Request struct {
	// Client reaches the member to snapshot; Endpoint names it.
	Client   clientv3.Config
	Endpoint string
	// TempDir holds the snapshot while it is verified and compressed.
	TempDir string
	// EtcdVersion is the server version of the member snapshotted.
	EtcdVersion  string
	ClusterSpec  *spec.ClusterSpec
	ClusterToken string
	Now          time.Time
	// Status reads the status of Take's local copy of the snapshot, whose
	// sha256 trailer Take checks as it streams (so Status need not: see
	// ReadStatus); nil reads it in this process. Reading the database maps
	// the whole file, so a long-lived caller reads it in a child process
	// (VerifyCommand) to keep its own memory flat.
	Status VerifyFunc
	// Revision reads the revision of Take's local copy before its status
	// is checked, so that the member computes its HashKV meanwhile; nil
	// asks for the HashKV once the check is done.
	Revision RevisionFunc
	// Keys encrypt the backup when they hold a writing key.
	Keys *crypt.Keyring
	// Progress, when set, is told each run of bytes of the snapshot as
	// it streams in, from the stream's goroutine: it must not block.
	Progress func(n int64)
	// Kind is why the backup is taken, recorded in its meta.
	Kind string
}

// VerifyFunc checks a snapshot file, as Verify does.
type VerifyFunc func(ctx context.Context, path string) (snapshot.Status, error)

// exitCorrupt is the exit code of a verify child that found the snapshot
// corrupt, as opposed to failing to run.
const exitCorrupt = 3

// VerifyCommand returns a VerifyFunc that runs name with args and the
// snapshot's path, and reads the status it prints (see RunVerify). The
// child runs under the snapshot's Ceiling: one that reaches it has found
// the snapshot failing its check.
func VerifyCommand(name string, args ...string) VerifyFunc {
	return verifyCommand(name, CeilingFor, args...)
}

func verifyCommand(name string, ceilingFor func(size int64) Ceiling, args ...string) VerifyFunc {
	return func(ctx context.Context, path string) (snapshot.Status, error) {
		ceiling := ceilingFor(fileSize(path))
		cctx, cancel := context.WithTimeout(ctx, ceiling.Timeout)
		defer cancel()
		var stdout bytes.Buffer
		// The child's messages name every bad page of a damaged database:
		// the first 64 KiB say enough.
		stderr := &capped{max: 64 << 10}
		cmd := exec.CommandContext(cctx, name, append(slices.Clone(args), fmt.Sprintf("--%s=%d", MemoryCeilingFlag, ceiling.Memory), path)...)
		cmd.Stdout, cmd.Stderr = &stdout, stderr
		// A memory cgroup where one can be made: the kernel's hard bound.
		cg, _ := newMemCgroup(ceiling.Memory + cgroupMargin)
		if cg != nil {
			defer cg.remove()
		}
		err := cmd.Start()
		if err == nil {
			if cg != nil && cg.add(cmd.Process.Pid) != nil {
				cg.remove()
				cg = nil // the child's own bounds hold alone
			}
			err = cmd.Wait()
		}
		msg := strings.TrimSpace(stderr.String())
		var exit *exec.ExitError
		switch {
		case err != nil && ctx.Err() == nil && cctx.Err() != nil:
			return snapshot.Status{}, fmt.Errorf("%w: %s: its check ran past its limit of %s (a sound snapshot's takes a small part of it, unless the host is overloaded), and was stopped", ErrCheckLimit, path, ceiling.Timeout)
		case err != nil && cg != nil && cg.oomKilled():
			return snapshot.Status{}, fmt.Errorf("%w: %s: its check needed more than its ceiling of %d bytes of memory (a sound snapshot's needs a small part of it), and its memory cgroup stopped it", ErrCorrupt, path, ceiling.Memory)
		case errors.As(err, &exit) && (exit.ExitCode() == exitCorrupt || exit.ExitCode() == exitCeiling):
			return snapshot.Status{}, fmt.Errorf("%w: %s", ErrCorrupt, strings.TrimPrefix(msg, ErrCorrupt.Error()+": "))
		case errors.As(err, &exit) && exit.ExitCode() == 2 && strings.Contains(msg, "out of memory"):
			// The address space bound, which a sound check stays far
			// below, stopped an allocation faster than the watch.
			return snapshot.Status{}, fmt.Errorf("%w: %s: its check ran out of the address space it may use (its memory ceiling is %d bytes), and was stopped", ErrCheckLimit, path, ceiling.Memory)
		case etcdproc.CrashedOnData(err, msg):
			// bbolt panics on some damage where no recover reaches, and
			// the Go runtime ends the child: that is a damaged snapshot
			// too, not a check that could not run.
			line, _, _ := strings.Cut(msg, "\n")
			return snapshot.Status{}, fmt.Errorf("%w: %s: reading it crashed bbolt: %s", ErrCorrupt, path, line)
		case err != nil:
			return snapshot.Status{}, fmt.Errorf("backup: verify %s: %v: %s", path, err, msg)
		}
		var st snapshot.Status
		if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
			return st, fmt.Errorf("backup: verify %s: unreadable status %q: %w", path, stdout.String(), err)
		}
		return st, nil
	}
}

// RunVerify is the child side of VerifyCommand: it verifies path (only
// reads its status, with statusOnly) under memoryCeiling bytes of memory
// (none when 0), prints the status as JSON to stdout, and returns the
// process's exit code.
func RunVerify(path string, statusOnly bool, memoryCeiling int64, stdout, stderr io.Writer) int {
	if err := enforceCeiling(path, memoryCeiling, stderr); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	check := Verify
	if statusOnly {
		check = ReadStatus
	}
	st, err := check(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		if errors.Is(err, ErrCorrupt) {
			return exitCorrupt
		}
		return 1
	}
	if err := json.NewEncoder(stdout).Encode(st); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// Take streams a snapshot from one member into the store as it arrives:
// each chunk is written to a temporary file, hashed for etcd's sha256
// trailer, gzipped (and encrypted) and uploaded at once. Once the stream
// ends, the trailer and then the snapshot's status (on the local copy)
// are checked while the upload waits to commit; a snapshot that fails
// either is never committed, and no meta is written. The meta comes last:
// a backup without one does not exist. Memory use does not grow with the
// database.
func Take(ctx context.Context, s Store, req Request) (Info, error) {
	if err := os.MkdirAll(req.TempDir, 0o700); err != nil {
		return Info{}, fmt.Errorf("backup: temp dir: %w", err)
	}
	tmp, err := os.MkdirTemp(req.TempDir, "snapshot-")
	if err != nil {
		return Info{}, fmt.Errorf("backup: temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	db := filepath.Join(tmp, "snapshot.db")

	cfg := req.Client
	cfg.Endpoints = []string{req.Endpoint}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	start := time.Now()
	name, err := claimName(ctx, s, req.Now)
	if err != nil {
		return Info{}, err
	}
	// From here on, a failure leaves nothing: no meta (whose write may
	// have reached the store though it failed), then no data object
	// (which the upload may have committed before a later step failed),
	// no claim. While a meta that may exist cannot be deleted, its data
	// stays: the backup may be whole.
	failed := func(err error, metaTried bool) (Info, error) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCleanupTimeout)
		defer cancel()
		if metaTried {
			if derr := s.Delete(dctx, name+"/"+MetaObject); derr != nil && !errors.Is(derr, store.ErrNotFound) {
				return Info{}, err
			}
		}
		_ = s.Delete(dctx, name+"/"+DataObject)
		_ = s.Delete(dctx, name+"/"+ClaimObject)
		return Info{}, err
	}
	st, err := stream(ctx, s, name, db, cfg, req)
	if err != nil {
		return failed(err, false)
	}
	began := time.Now()
	// The member's HashKV at the snapshot's revision, for restore drills;
	// none if ctx ends meanwhile. The one asked for during the check is
	// used if the check found the same revision.
	var h *HashKV
	var hashErr error
	beside, late := st.hash != nil && st.hash.rev == st.status.Revision, st.revErr
	if beside {
		h, hashErr = st.hash.wait()
	} else {
		if st.hash != nil {
			st.hash.stop()
			late = fmt.Errorf("backup: the snapshot's revision read %d, and its status %d", st.hash.rev, st.status.Revision)
		}
		h, hashErr = hashKV(ctx, cfg, req.Endpoint, st.status.Revision)
	}
	// The data is committed: the meta is written even if ctx ends now (a
	// change of leader, a shutdown), within a bound, so that no whole
	// object is left without one.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metaTimeout)
	defer cancel()
	version := st.version
	if req.EtcdVersion != "" {
		version = req.EtcdVersion
	}
	meta := Meta{
		EtcdVersion:    strings.TrimPrefix(version, "v"),
		Timestamp:      spec.Int64(req.Now.Unix()),
		ClusterSpec:    req.ClusterSpec,
		SHA256:         st.sum,
		Size:           st.size,
		CompressedSize: st.compressed,
		Revision:       st.status.Revision,
		TotalKeys:      st.status.TotalKey,
		ClusterToken:   req.ClusterToken,
		Encryption:     st.encryption,
		Kind:           req.Kind,
		HashKV:         h,
		Seconds:        time.Since(start).Seconds(),
		SnapshotTime:   spec.Int64(began.UnixNano()),
	}
	if err := writeMeta(mctx, s, name, meta); err != nil {
		return failed(err, true)
	}
	st.stages.Commit = time.Since(began)
	// The claim has done its work; one left behind is harmless.
	_ = s.Delete(mctx, name+"/"+ClaimObject)
	return Info{Name: name, Meta: meta, Stages: st.stages, HashKVErr: hashErr, HashKVBeside: beside, HashKVLate: late}, nil
}

// claimCleanupTimeout bounds the deletion of a failed backup's objects,
// and metaTimeout the meta's write once its data is committed.
const (
	claimCleanupTimeout = 10 * time.Second
	metaTimeout         = 30 * time.Second
)

// snapshotWindow is the gRPC flow-control window of a snapshot stream:
// how much of it may wait in the agent's memory, in 16 KiB frames, while
// the upload is slower than etcd. 1 MiB moved a 1 GiB snapshot (in the page
// cache) as fast as 4 MiB, and saved 7 MiB of the agent's memory; but an
// 8 GiB one, which etcd reads from disk, went 1.68× etcdctl's save where
// 4 MiB went 1.39× (make bench-large, backup-file-8gib, one run each): the
// smaller window, we infer, leaves etcd waiting on the agent between its
// reads from disk.
const snapshotWindow = 4 << 20

// streamed is what stream learned of the snapshot it uploaded.
type streamed struct {
	version    string // the snapshot's storage version (3.6.0 for any 3.6.x)
	status     snapshot.Status
	size       int64
	sum        string
	compressed int64
	encryption *crypt.Info
	stages     Stages
	// hash is the member's HashKV, asked for while the status was
	// checked; nil when Request.Revision is nil or failed, and revErr
	// why it failed.
	hash   *pendingHash
	revErr error
}

// stream uploads backup name's data object from the member's snapshot
// stream, keeping a copy in db for the checks, which gate the commit.
func stream(ctx context.Context, s Store, name, db string, cfg clientv3.Config, req Request) (out streamed, err error) {
	hashCfg := cfg
	parent := ctx // the HashKV outlives the stream
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the snapshot stream if the upload stops early
	defer func() {
		if err != nil && out.hash != nil {
			out.hash.stop()
			out.hash = nil
		}
	}()
	// A fixed flow-control window: gRPC's own grows up to 16 MiB with its
	// bandwidth estimate, and whenever the upload is slower than the
	// snapshot, that much of the stream waits in the agent's memory.
	cfg.DialOptions = append(slices.Clip(cfg.DialOptions),
		grpc.WithInitialWindowSize(snapshotWindow), grpc.WithInitialConnWindowSize(snapshotWindow))
	c, err := clientv3.New(cfg)
	if err != nil {
		return out, fmt.Errorf("backup: snapshot from %s: %w", req.Endpoint, err)
	}
	defer c.Close()
	began := time.Now()
	snap, version, err := openSnapshot(ctx, c)
	if err != nil {
		return out, fmt.Errorf("backup: snapshot from %s: %w", req.Endpoint, err)
	}
	defer snap.Close()
	out.version = version
	f, err := os.OpenFile(db, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return out, fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	trailer := &trailerHash{h: sha256.New()}
	copyErr := &firstError{}
	// The local copy's write errors (a full temp disk) are told apart
	// from the stream's. Reading the stream, writing the copy and hashing
	// the trailer take a goroutine of their own, a few chunks ahead of the
	// gzip. Each read fills the read-ahead's whole chunk from the stream's
	// 32 KiB messages, so that the copy is written in chunks that size.
	tee := io.TeeReader(readerFunc(func(p []byte) (int, error) {
		n := 0
		for n < len(p) {
			m, err := snap.Read(p[n:])
			n += m
			if err != nil && !errors.Is(err, io.EOF) {
				return n, copyErr.set(fmt.Errorf("backup: snapshot from %s: %w", req.Endpoint, err))
			}
			if err != nil {
				return n, err
			}
		}
		return n, nil
	}), writerFunc(func(p []byte) (int, error) {
		if _, err := f.Write(p); err != nil {
			return 0, copyErr.set(tempErr(req.TempDir, err))
		}
		_, _ = trailer.Write(p)
		if req.Progress != nil {
			req.Progress(int64(len(p)))
		}
		return len(p), nil
	}))
	src := newReadAhead(tee)
	defer func() {
		cancel() // a read of the stream returns
		src.Close()
	}()
	verify := req.Status
	if verify == nil {
		verify = func(_ context.Context, path string) (snapshot.Status, error) { return ReadStatus(path) }
	}
	var streamed time.Time
	gate := func() error {
		streamed = time.Now()
		out.stages.Stream = streamed.Sub(began)
		if err := copyErr.get(); err != nil {
			return err // the stream or the copy failed: no clean end
		}
		if err := f.Close(); err != nil {
			return copyErr.set(tempErr(req.TempDir, err))
		}
		out.size = trailer.n
		if err := trailer.check(); err != nil {
			return copyErr.set(fmt.Errorf("%w: the snapshot stream from %s: %w", ErrCorrupt, req.Endpoint, err))
		}
		if req.Revision != nil {
			// A failed read only leaves the HashKV for after the check.
			switch rev, err := req.Revision(ctx, db); {
			case err != nil:
				out.revErr = err
			case rev > 0: // none before the first write: no HashKV either
				out.hash = startHashKV(parent, hashCfg, req.Endpoint, rev)
			}
		}
		st, err := verify(ctx, db)
		out.stages.Verify = time.Since(streamed)
		out.status = st
		return copyErr.set(err)
	}
	abort := func(err error) {
		// The store failed first: its error is the cause, not the
		// cancelled stream's or check's that follow.
		copyErr.set(err)
		cancel()
	}
	out.sum, out.compressed, out.encryption, err = upload(ctx, s, name+"/"+DataObject, src, req.Keys, gate, abort)
	if cerr := copyErr.get(); cerr != nil {
		return out, cerr // the cause, not how the upload reports it
	}
	return out, err
}

// firstError keeps the first error set, from any goroutine.
type firstError struct {
	mu  sync.Mutex
	err error
}

// set records err unless an error came first, and returns err.
func (f *firstError) set(err error) error {
	if err == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
	return err
}

func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// tempErr is a failed write of the local copy: ErrTempFull when the temp
// disk (or the quota on it) is full.
func tempErr(dir string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %s has no room for the snapshot (it needs the whole database): %w", ErrTempFull, dir, err)
	}
	return fmt.Errorf("backup: write the snapshot's copy in %s: %w", dir, err)
}

// capped keeps the first max bytes written to it, and takes the rest
// without keeping it. (No embedded buffer: io.Copy would use its
// ReadFrom, past the cap.)
type capped struct {
	buf bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) String() string { return c.buf.String() }

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// trailerHash hashes a snapshot stream as it passes, all but its last
// sha256.Size bytes, which are the sha256 etcd appends.
type trailerHash struct {
	h    hash.Hash
	tail [sha256.Size]byte
	held int // bytes of tail in use
	n    int64
}

func (t *trailerHash) Write(p []byte) (int, error) {
	t.n += int64(len(p))
	if len(p) >= sha256.Size {
		t.h.Write(t.tail[:t.held])
		t.h.Write(p[:len(p)-sha256.Size])
		t.held = copy(t.tail[:], p[len(p)-sha256.Size:])
		return len(p), nil
	}
	// A short write: hash what the held tail and p push out of the last
	// sha256.Size bytes.
	var buf [2 * sha256.Size]byte
	all := append(append(buf[:0], t.tail[:t.held]...), p...)
	if over := len(all) - sha256.Size; over > 0 {
		t.h.Write(all[:over])
		all = all[over:]
	}
	t.held = copy(t.tail[:], all)
	return len(p), nil
}

// check compares the trailer with the sha256 of the rest. A snapshot
// with a trailer is a whole number of 512-byte pages and the 32 bytes.
func (t *trailerHash) check() error {
	if t.n < sha256.Size+512 || (t.n-sha256.Size)%512 != 0 {
		return fmt.Errorf("%d bytes is no snapshot with a sha256 trailer", t.n)
	}
	if !bytes.Equal(t.h.Sum(nil), t.tail[:t.held]) {
		return errors.New("sha256 trailer does not match its contents")
	}
	return nil
}

// hashKV reads a member's HashKV at rev.
func hashKV(ctx context.Context, cfg clientv3.Config, endpoint string, rev int64) (*HashKV, error) {
	if rev <= 0 {
		// HashKV at 0 would hash the member's current revision.
		return nil, fmt.Errorf("backup: the snapshot records no revision to read the HashKV at")
	}
	ctx, cancel := context.WithTimeout(ctx, etcdproc.HashKVTimeout) // the dial too
	defer cancel()
	cfg.Context = ctx
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("backup: HashKV of %s: %w", endpoint, err)
	}
	defer c.Close()
	resp, err := etcdproc.HashKV(ctx, c, endpoint, rev)
	if err != nil {
		return nil, fmt.Errorf("backup: HashKV of %s at revision %d: %w", endpoint, rev, err)
	}
	return &HashKV{Hash: resp.Hash, CompactRevision: resp.CompactRevision}, nil
}

// pendingHash is a member's HashKV being read in the background.
type pendingHash struct {
	rev    int64
	done   chan struct{}
	cancel context.CancelFunc
	h      *HashKV
	err    error
}

// startHashKV asks endpoint for its HashKV at rev in the background.
func startHashKV(ctx context.Context, cfg clientv3.Config, endpoint string, rev int64) *pendingHash {
	ctx, cancel := context.WithCancel(ctx)
	p := &pendingHash{rev: rev, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(p.done)
		p.h, p.err = hashKV(ctx, cfg, endpoint, rev)
	}()
	return p
}

// wait returns the HashKV once it is read.
func (p *pendingHash) wait() (*HashKV, error) {
	<-p.done
	p.cancel()
	return p.h, p.err
}

// stop ends the read, and returns once it has.
func (p *pendingHash) stop() {
	p.cancel()
	<-p.done
}

// write uploads the snapshot db as backup name's data object, gzipped and,
// with a writing key, encrypted, then its meta, which gets the object's
// sha256, size and encryption.
func write(ctx context.Context, s Store, name, db string, keys *crypt.Keyring, meta Meta) (Meta, error) {
	f, err := os.Open(db)
	if err != nil {
		return meta, fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	sum, compressed, enc, err := upload(ctx, s, name+"/"+DataObject, f, keys, nil, nil)
	if err != nil {
		return meta, err
	}
	meta.SHA256, meta.CompressedSize, meta.Encryption = sum, compressed, enc
	return meta, writeMeta(ctx, s, name, meta)
}

// writeMeta writes backup name's meta: from then on, the backup exists.
func writeMeta(ctx context.Context, s Store, name string, meta Meta) error {
	data, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("backup: encode meta: %w", err)
	}
	if err := s.Write(ctx, name+"/"+MetaObject, data); err != nil {
		return fmt.Errorf("backup: write meta of %s: %w", name, err)
	}
	return nil
}

// Verify checks a snapshot db file: the sha256 trailer etcd appends to a
// streamed snapshot, then the db itself through etcdutl's snapshot status.
func Verify(path string) (snapshot.Status, error) {
	if err := checkTrailer(path); err != nil {
		return snapshot.Status{}, err
	}
	return status(path)
}

// ReadStatus checks a snapshot db file through etcdutl's snapshot status
// alone, which reads every key: for a copy whose trailer was checked as
// it streamed in. The file is read once in order first (see readThrough).
func ReadStatus(path string) (snapshot.Status, error) {
	if err := readThrough(path); err != nil {
		return snapshot.Status{}, err
	}
	return status(path)
}

// readThrough reads path once, in order. The status walks the keys in
// their order, which is not the order of the file's pages: on a file the
// page cache no longer holds, as a large backup's local copy is by the
// time it is checked, each page is then a read of its own. An 8 GiB copy
// took 2 minutes that way, at about 68 MiB/s; one pass in order first
// reads it at the disk's streaming speed. A file still cached costs a
// copy from memory, and that second use keeps its pages in the cache
// while the member's HashKV reads etcd's whole database beside the
// check: skipping the cached parts (with mincore) made an 8 GiB check
// take 30 s instead of 12 s, its pages evicted first.
func readThrough(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		_, err := f.Read(buf)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("backup: read %s: %w", path, err)
		}
	}
}

// status reads a snapshot db file's status through etcdutl.
func status(path string) (snapshot.Status, error) {
	st, err := snapshot.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		// etcdutl quotes the key and the whole value it could not read,
		// which can be megabytes: the error goes to logs, events and the
		// ctl's output.
		return st, fmt.Errorf("%w: %s: %s", ErrCorrupt, path, spec.Clip(err.Error(), maxStatusError))
	}
	return st, nil
}

// maxStatusError bounds the text of etcdutl's error in a status's.
const maxStatusError = 1 << 10

// checkTrailer checks a snapshot file's sha256 trailer as a stream's is
// checked (trailerHash), reading the file once.
func checkTrailer(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	trailer := &trailerHash{h: sha256.New()}
	if _, err := io.Copy(trailer, f); err != nil {
		return fmt.Errorf("backup: read %s: %w", path, err)
	}
	if err := trailer.check(); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	return nil
}

// upload gzips src into the store, encrypting the gzip when keys hold a
// writing key, and returns the object's sha256 and size, and its
// encryption. The stream is made as it is uploaded, so memory stays flat
// whatever the size. Once src is read, gate (when set) decides: its error
// aborts the upload. If anything fails, nothing is committed. When the
// store fails first, abort (when set) is told, to end what src reads.
func upload(ctx context.Context, s Store, key string, src io.Reader, keys *crypt.Keyring, gate func() error, abort func(error)) (string, int64, *crypt.Info, error) {
	pr, pw := io.Pipe()
	h := sha256.New()
	counter := &countWriter{}
	// Compression comes before encryption: ciphertext does not compress.
	// The gzip is made in a goroutine of its own; the object is encrypted
	// and hashed as Put reads it, so that the gzip and the rest run on
	// two cores.
	var body io.Reader = pr
	var info *crypt.Info
	if keys.Encrypting() {
		enc, i, err := keys.EncryptReader(pr)
		if err != nil {
			return "", 0, nil, fmt.Errorf("backup: %w", err)
		}
		body, info = enc, i
	}
	body = io.TeeReader(body, io.MultiWriter(h, counter))
	done := make(chan struct{})
	go func() {
		defer close(done)
		// klauspost's gzip at BestSpeed writes standard gzip many times
		// faster than the standard library's (2 GiB/s against 70 MiB/s on
		// hex text here), for a little less compression: the upload should
		// not wait on the CPU.
		// The gzip's output goes on in pieces of gzipChunk: the encoder
		// writes a few hundred bytes at a time, and each write to the
		// pipe is a hand-over between goroutines.
		out := bufio.NewWriterSize(pw, gzipChunk)
		gz, _ := kgzip.NewWriterLevel(out, kgzip.BestSpeed)
		_, err := io.Copy(gz, src)
		if err == nil {
			err = gz.Close()
		}
		if err == nil {
			err = out.Flush()
		}
		if err == nil && gate != nil {
			err = gate()
		}
		pw.CloseWithError(err) // nil: a clean EOF, and the upload commits
	}()
	err := s.Put(ctx, key, body)
	if err != nil {
		err = fmt.Errorf("backup: upload %s: %w", key, err)
	}
	pr.CloseWithError(errors.New("backup: upload ended")) // unblocks the gzip goroutine if Put stopped early
	if err != nil && abort != nil {
		abort(err) // a source that waits for input would hold the goroutine
	}
	<-done
	if err != nil {
		return "", 0, nil, err
	}
	return hex.EncodeToString(h.Sum(nil)), counter.n, info, nil
}

// gzipChunk is the size of the pieces upload hands the gzip to the store in.
const gzipChunk = 256 << 10

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// claimName picks the backup's name, <now, RFC3339 UTC>-<seq>, and
// claims it with a once-only ClaimObject, so that two writers (say, a
// leader that has just lost its leadership and its successor) can never
// write into the same backup, even within one second.
func claimName(ctx context.Context, s Store, now time.Time) (string, error) {
	stamp := now.UTC().Format(nameTimeLayout)
	names, err := s.List(ctx, stamp, "/")
	if err != nil {
		return "", fmt.Errorf("backup: list: %w", err)
	}
	seq := 0
	for _, n := range names {
		if m := nameRE.FindStringSubmatch(strings.TrimSuffix(n, "/")); m != nil && m[1] == stamp {
			if v, _ := strconv.Atoi(m[2]); v > seq {
				seq = v
			}
		}
	}
	for range 1000 {
		seq++
		name := fmt.Sprintf("%s-%06d", stamp, seq)
		err := s.Create(ctx, name+"/"+ClaimObject, []byte(now.UTC().Format(time.RFC3339Nano)+"\n"))
		if errors.Is(err, store.ErrExists) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("backup: claim %s: %w", name, err)
		}
		return name, nil
	}
	return "", fmt.Errorf("backup: no free backup name in %s", stamp)
}

// List returns the complete backups (those with a readable meta), oldest
// first.
func List(ctx context.Context, s Store) ([]Info, error) { return list(ctx, s, false) }

// ListAll is List for what deletes by it: a meta that cannot be read, for
// any reason but its absence (an unfinished backup), is an error rather
// than a backup left out.
func ListAll(ctx context.Context, s Store) ([]Info, error) { return list(ctx, s, true) }

// Names lists the names of the store's backups, oldest first, from one
// listing: finished or not, their metas unread.
func Names(ctx context.Context, s Store) ([]string, error) {
	dirs, err := s.List(ctx, "", "/")
	if err != nil {
		return nil, fmt.Errorf("backup: list: %w", err)
	}
	var out []string
	for _, d := range dirs {
		if name := strings.TrimSuffix(d, "/"); nameRE.MatchString(name) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Want says which backup Newest looks for.
type Want struct {
	// Token is the cluster token its meta must record; "" takes any.
	Token string
	// NotAfter, when set, leaves out a backup whose name or meta is dated
	// after it: the reader's clock and spec.FutureSkew. A backup planted
	// with a date in the future would be the newest forever.
	NotAfter time.Time
	// MaxReads, when > 0, bounds the metas read.
	MaxReads int
}

// Newest is the newest complete backup w wants, or nil: it reads metas
// newest first, passing over backups without a meta (being written) or
// with a corrupt one.
func Newest(ctx context.Context, s Store, w Want) (*Info, error) {
	dirs, err := s.List(ctx, "", "/")
	if err != nil {
		return nil, fmt.Errorf("backup: list: %w", err)
	}
	reads := 0
	for i := len(dirs) - 1; i >= 0 && (w.MaxReads <= 0 || reads < w.MaxReads); i-- {
		name := strings.TrimSuffix(dirs[i], "/")
		at, ok := NameTime(name)
		if !ok || (!w.NotAfter.IsZero() && at.After(w.NotAfter)) {
			continue
		}
		reads++
		data, err := s.ReadMax(ctx, name+"/"+MetaObject, MaxMetaSize)
		switch {
		case errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrTooLarge):
			continue
		case err != nil:
			return nil, fmt.Errorf("backup: read %s/%s: %w", name, MetaObject, err)
		}
		meta, err := decodeMeta(name, data)
		if err != nil || (w.Token != "" && meta.ClusterToken != w.Token) {
			continue
		}
		if in := (Info{Name: name, Meta: meta}); w.NotAfter.IsZero() || !in.DatedAfter(w.NotAfter) {
			return &in, nil
		}
	}
	return nil, nil
}

// NameTime is the time a backup's name records, and whether name is a
// backup's name.
func NameTime(name string) (time.Time, bool) {
	m := nameRE.FindStringSubmatch(name)
	if m == nil {
		return time.Time{}, false
	}
	at, err := time.Parse(nameTimeLayout, m[1])
	return at, err == nil
}

// nameTimeLayout is the time in a backup's name.
const nameTimeLayout = "2006-01-02T15:04:05Z"

// DatedAfter reports whether the backup's name, or the time its meta
// records, is after t.
func (i Info) DatedAfter(t time.Time) bool {
	at, ok := NameTime(i.Name)
	return (ok && at.After(t)) || time.Unix(int64(i.Meta.Timestamp), 0).After(t) || i.Meta.PointTime().After(t)
}

func list(ctx context.Context, s Store, strict bool) ([]Info, error) {
	dirs, err := s.List(ctx, "", "/")
	if err != nil {
		return nil, fmt.Errorf("backup: list: %w", err)
	}
	var out []Info
	for _, d := range dirs {
		name := strings.TrimSuffix(d, "/")
		if !nameRE.MatchString(name) {
			continue
		}
		data, err := s.ReadMax(ctx, name+"/"+MetaObject, MaxMetaSize)
		if errors.Is(err, store.ErrNotFound) || (err != nil && !strict) {
			continue // no meta: an unfinished backup, which does not exist
		}
		if err != nil {
			return nil, fmt.Errorf("backup: list: %w", err)
		}
		m, err := decodeMeta(name, data)
		if err != nil {
			if strict {
				return nil, fmt.Errorf("backup: list: %w", err)
			}
			continue
		}
		out = append(out, Info{Name: name, Meta: m})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
