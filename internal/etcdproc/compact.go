package etcdproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
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

// CompactDB defragments the database under etcd's data dir offline: no
// etcd may hold it open. It copies every bucket and key into a fresh
// file beside it, committing every txBytes (CompactTxBytes when 0), then
// fsyncs the copy and renames it over the database. Should anything fail,
// the copy is deleted and the database is as it was. The copy cannot be
// interrupted once started; ctx is checked before it starts.
func CompactDB(ctx context.Context, dataDir string, txBytes int64) (res Compaction, err error) {
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
