package store

import (
	"os"

	"golang.org/x/sys/unix"
)

// writebackChunk is how much a file store's object write lets pile up in
// the page cache before it asks the kernel to start writing it out.
const writebackChunk = 8 << 20

// writeback wraps f, a file being written from its start, so that the
// kernel starts writing each writebackChunk to disk as soon as it is
// written (sync_file_range, without waiting), rather than all of it at the
// final fsync: most of a large backup is on disk by then, unless the disk
// is slower than the stream. The fsync still makes it durable, and still
// reports a failed write: the hint waits for nothing, so it consumes no
// error (with SYNC_FILE_RANGE_WAIT_* flags, it would).
//
// A large object also leaves the page cache as it goes: each chunk is
// dropped two chunks on, once its writeback has had a chunk's time to
// finish, and the rest once the object is synced (see release). Nobody reads a backup back soon, and its
// pages would otherwise push out what the machine does read: etcd's
// database, and the backup's own local copy, whose status check reads it
// right after the stream. Pages not yet written back are not dropped; the
// kernel skips them.
func writeback(f *os.File) *writebacker { return &writebacker{f: f} }

type writebacker struct {
	f                *os.File
	written, begun   int64 // bytes written; bytes whose writeback has begun
	dropped, started int64 // bytes dropped from the cache; where the last writeback began
	failed           bool  // sync_file_range is unsupported here: stop asking
}

func (w *writebacker) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.written += int64(n)
	if !w.failed && w.written-w.begun >= writebackChunk {
		if unix.SyncFileRange(int(w.f.Fd()), w.begun, w.written-w.begun, unix.SYNC_FILE_RANGE_WRITE) != nil {
			w.failed = true // a hint only; the fsync does the work
			return n, err
		}
		// The chunks before the previous one have had a chunk's time to
		// reach the disk.
		if w.started > w.dropped {
			_ = unix.Fadvise(int(w.f.Fd()), w.dropped, w.started-w.dropped, unix.FADV_DONTNEED)
			w.dropped = w.started
		}
		w.started, w.begun = w.begun, w.written
	}
	return n, err
}

// release drops a large object's pages from the page cache once f is
// synced: they are all clean then. A small object (under one chunk) stays:
// capture's segments are read back by its merges.
func (w *writebacker) release() {
	if w.written >= writebackChunk {
		_ = unix.Fadvise(int(w.f.Fd()), 0, 0, unix.FADV_DONTNEED)
	}
}
