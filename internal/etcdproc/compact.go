package etcdproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

// CompactTxBytes is how much data CompactDB copies per transaction by
// default. Each transaction is written and fsynced before the next one
// starts, so another writer on the same disk (the other members' WALs,
// when members share one) waits behind this much at most, where etcd's
// own defragmentation writes its whole copy in one transaction and
// flushes it in one burst.
const CompactTxBytes = 8 << 20

// compactTempName is the copy CompactDB writes beside the database. etcd
// (3.5 and later) deletes files named db.tmp* in that directory when it
// starts, so a copy left by a crash does not outlive the next start.
const compactTempName = "db.tmp.etcd-manager"

// Compaction is what CompactDB did.
type Compaction struct {
	SizeBefore, SizeAfter int64
	Took                  time.Duration
}

// Compactor defragments the database under etcd's data dir offline:
// CompactDB in this process, or CompactDBCommand in a child.
type Compactor func(ctx context.Context, dataDir string) (Compaction, error)

// CompactPausePoint is the testhook.PauseEnv point at which a compaction
// has written its copy and not yet renamed it over the database, for the
// tests of a compaction stopped midway.
const CompactPausePoint = "compact-db-before-rename"

// CompactDBCommand returns a Compactor that runs name with args and the
// data dir, and reads the result it prints (see RunCompactDB). The copy
// runs in a child for two reasons. It reads a file that may be damaged,
// where bbolt can crash the process (copyDB recovers what it can), and
// the agent must live on; and a copy in a child can be stopped midway,
// when ctx ends, which bbolt's compaction in this process cannot.
// Whatever ends the child early, its copy is deleted and the database is
// as it was.
func CompactDBCommand(name string, args ...string) Compactor {
	return func(ctx context.Context, dataDir string) (Compaction, error) {
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, name, append(args, dataDir)...)
		cmd.Stdout, cmd.Stderr = &stdout, &limitedWriter{w: &stderr, n: 64 << 10}
		// The copy must never outlive the agent: a copy renamed over the
		// database after a new agent has started etcd on it would take
		// etcd's newer writes away at its next start. The kernel kills the
		// child when the thread that started it exits, so that thread is
		// held until the child is gone; and the child checks its parent
		// before the rename (see RunCompactDB).
		//
		// Its own process group: a signal to the agent's group (a Ctrl-C)
		// is the agent's to act on, not the copy's.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		runtime.LockOSThread()
		err := cmd.Run()
		runtime.UnlockOSThread()
		if err != nil {
			// A child killed or crashed before its rename leaves its copy.
			if rerr := removeCompactCopy(dataDir); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		full := strings.TrimSpace(stderr.String())
		msg := firstLine(full)
		var exit *exec.ExitError
		switch {
		case err == nil:
			// Done, renamed in, whatever ctx says now.
			var res Compaction
			if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
				return res, fmt.Errorf("etcdproc: compact %s: unreadable result %q: %w", DBPath(dataDir), stdout.String(), err)
			}
			return res, nil
		case ctx.Err() != nil:
			return Compaction{}, fmt.Errorf("etcdproc: compact %s: stopped: %w", DBPath(dataDir), context.Cause(ctx))
		case errors.As(err, &exit) && exit.ExitCode() == exitDamaged:
			// The child's message wraps ErrDamagedData: keep what it says
			// after it.
			if _, after, ok := strings.Cut(msg, ErrDamagedData.Error()+": "); ok {
				msg = after
			}
			return Compaction{}, fmt.Errorf("%w: %s", ErrDamagedData, msg)
		case errors.As(err, &exit) && crashedOnData(exit, full):
			return Compaction{}, fmt.Errorf("%w: %s: copying it crashed bbolt: %s", ErrDamagedData, DBPath(dataDir), msg)
		default:
			return Compaction{}, fmt.Errorf("etcdproc: compact %s: %v: %s", DBPath(dataDir), err, msg)
		}
	}
}

// RunCompactDB is the child side of CompactDBCommand: it compacts the
// database under dataDir, prints the result as JSON to stdout, and
// returns the process's exit code.
func RunCompactDB(ctx context.Context, dataDir string, stdout, stderr io.Writer) int {
	parent := os.Getppid()
	res, err := compactDB(ctx, dataDir, 0, func() error {
		if p := os.Getppid(); p != parent {
			return fmt.Errorf("etcdproc: compact: the agent that started this copy (pid %d) is gone: the copy is not renamed over the database", parent)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(stderr, err)
		if errors.Is(err, ErrDamagedData) {
			return exitDamaged
		}
		return 1
	}
	if err := json.NewEncoder(stdout).Encode(res); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// removeCompactCopy deletes a copy that a compaction left beside the
// database under dataDir.
func removeCompactCopy(dataDir string) error {
	err := os.Remove(filepath.Join(filepath.Dir(DBPath(dataDir)), compactTempName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("etcdproc: remove the compaction's copy: %w", err)
	}
	return nil
}

// CompactDB defragments the database under etcd's data dir offline: no
// etcd may hold it open. It copies every bucket and key into a fresh
// file beside it, committing every txBytes (CompactTxBytes when 0), then
// fsyncs the copy and renames it over the database. Should anything fail,
// the copy is deleted and the database is as it was. The copy cannot be
// interrupted once started; ctx is checked before it starts, and before
// the rename. CompactDBCommand runs it in a child that can be stopped.
func CompactDB(ctx context.Context, dataDir string, txBytes int64) (res Compaction, err error) {
	return compactDB(ctx, dataDir, txBytes, nil)
}

// compactDB is CompactDB, with a last check before the rename: its error
// leaves the database as it was.
func compactDB(ctx context.Context, dataDir string, txBytes int64, beforeRename func() error) (res Compaction, err error) {
	if txBytes <= 0 {
		txBytes = CompactTxBytes
	}
	start := time.Now()
	path := DBPath(dataDir)
	st, err := os.Stat(path)
	if err != nil {
		return res, fmt.Errorf("etcdproc: compact: %w", err)
	}
	res.SizeBefore = st.Size()
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("etcdproc: compact %s: %w", path, err)
	}
	tmp := filepath.Join(filepath.Dir(path), compactTempName)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return res, fmt.Errorf("etcdproc: compact: remove a stale copy: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err := copyDB(path, tmp, txBytes); err != nil {
		return res, fmt.Errorf("etcdproc: compact %s: %w", path, err)
	}
	testhook.Pause(slog.Default(), CompactPausePoint)
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("etcdproc: compact %s: %w", path, err)
	}
	if beforeRename != nil {
		if err := beforeRename(); err != nil {
			return res, err
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return res, fmt.Errorf("etcdproc: compact: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return res, err
	}
	if st, err := os.Stat(path); err == nil {
		res.SizeAfter = st.Size()
	}
	res.Took = time.Since(start)
	return res, nil
}

// copyDB copies src into a new bbolt file at dst with bbolt's own
// compaction. A fault or panic while reading a damaged src is an error
// wrapping ErrDamagedData, as in CheckData.
func copyDB(src, dst string, txBytes int64) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: copying it failed: %v", ErrDamagedData, src, r)
		}
	}()
	in, err := bolt.Open(src, 0o400, &bolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer in.Close()
	// The options etcd opens its own database with on Linux: the
	// freelist is rebuilt on open rather than written at every commit.
	out, err := bolt.Open(dst, 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return fmt.Errorf("create the copy: %w", err)
	}
	if err := bolt.Compact(out, in, txBytes); err != nil {
		out.Close()
		return fmt.Errorf("copy: %w", err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return fmt.Errorf("sync the copy: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("close the copy: %w", err)
	}
	return nil
}
