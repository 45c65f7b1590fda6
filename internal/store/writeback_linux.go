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
func writeback(f *os.File) *writebacker { return &writebacker{f: f} }

type writebacker struct {
	f              *os.File
	written, begun int64 // bytes written; bytes whose writeback has begun
	failed         bool  // sync_file_range is unsupported here: stop asking
}

func (w *writebacker) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.written += int64(n)
	if !w.failed && w.written-w.begun >= writebackChunk {
		if unix.SyncFileRange(int(w.f.Fd()), w.begun, w.written-w.begun, unix.SYNC_FILE_RANGE_WRITE) != nil {
			w.failed = true // a hint only; the fsync does the work
		}
		w.begun = w.written
	}
	return n, err
}
