package backup

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// dropFromCache writes path's pages out and drops them from the page
// cache, as a large backup's local copy may be by its status check.
func dropFromCache(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}

// procIORead is how much one read of /proc/thread-self/io counts in it,
// at most: it is under 200 bytes.
const procIORead = 256

// readBytes is how many bytes this thread has read through read calls,
// from the page cache or not (/proc/thread-self/io's rchar). The caller
// locks its goroutine to the thread, so that no other goroutine's reads
// count.
func readBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no rchar in /proc/thread-self/io: %q", b)
	return 0
}

// TestReadThrough: readThrough reads what the page cache lost, and only
// that, so that the status check that follows never waits on the disk
// one page at a time, and a copy still cached costs nothing.
func TestReadThrough(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		t.Fatalf("%s is on tmpfs, whose pages never leave the cache: set TMPDIR to a directory on a disk", dir)
	}
	const size = 3*readThroughChunk + 4321
	path := filepath.Join(dir, "db")
	if err := os.WriteFile(path, bytes.Repeat([]byte("etcd"), size/4+1)[:size], 0o600); err != nil {
		t.Fatal(err)
	}
	chunks := []struct{ off, n int64 }{
		{0, readThroughChunk},
		{readThroughChunk, readThroughChunk},
		{2 * readThroughChunk, readThroughChunk},
		{3 * readThroughChunk, size - 3*readThroughChunk},
	}
	held := func() (got []bool) {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		c := openPageCache(f, size)
		defer c.close()
		for _, ch := range chunks {
			got = append(got, c.holds(ch.off, ch.n))
		}
		return got
	}
	// readAgain brings the given chunks back into the cache, and nothing
	// else: no read-ahead.
	readAgain := func(t *testing.T, idx ...int) {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
			t.Fatal(err)
		}
		for _, i := range idx {
			if _, err := f.ReadAt(make([]byte, chunks[i].n), chunks[i].off); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name       string
		prepare    func(t *testing.T) // leaves part of the file in the cache
		wantBefore []bool             // which chunks the cache holds then
		// readThrough reads from minRead to maxRead bytes: what the
		// cache lost, less what the kernel's read-ahead brings back as
		// readThrough reads.
		minRead, maxRead int64
	}{
		{name: "all cached", prepare: func(t *testing.T) {
			if _, err := os.ReadFile(path); err != nil {
				t.Fatal(err)
			}
		}, wantBefore: []bool{true, true, true, true}, minRead: 0, maxRead: 0},
		{name: "none cached", prepare: func(t *testing.T) { dropFromCache(t, path) },
			wantBefore: []bool{false, false, false, false}, minRead: readThroughChunk, maxRead: size},
		{name: "the second chunk cached", prepare: func(t *testing.T) {
			dropFromCache(t, path)
			readAgain(t, 1)
		}, wantBefore: []bool{false, true, false, false}, minRead: readThroughChunk, maxRead: size - readThroughChunk},
		{name: "only the short last chunk lost", prepare: func(t *testing.T) {
			dropFromCache(t, path)
			readAgain(t, 0, 1, 2)
		}, wantBefore: []bool{true, true, true, false}, minRead: size - 3*readThroughChunk, maxRead: size - 3*readThroughChunk},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.prepare(t)
			if got := held(); !slices.Equal(got, tt.wantBefore) {
				t.Fatalf("the page cache holds chunks %v before readThrough, want %v: does this filesystem drop pages on FADV_DONTNEED?", got, tt.wantBefore)
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			before := readBytes(t)
			if err := readThrough(path); err != nil {
				t.Fatal(err)
			}
			// Reading /proc/thread-self/io counts in it too.
			if got := readBytes(t) - before; got < tt.minRead || got > tt.maxRead+procIORead {
				t.Errorf("readThrough read %d bytes, want %d to %d", got, tt.minRead, tt.maxRead)
			}
			for i, h := range held() {
				if !h {
					t.Errorf("chunk %d is not in the page cache after readThrough", i)
				}
			}
		})
	}

	t.Run("bad ranges are not held", func(t *testing.T) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		c := openPageCache(f, size)
		defer c.close()
		for _, r := range []struct{ off, n int64 }{{-1, 10}, {0, 0}, {size - 10, 11}, {size, 1}} {
			if c.holds(r.off, r.n) {
				t.Errorf("holds(%d, %d) = true for a file of %d bytes", r.off, r.n, size)
			}
		}
		if !c.holds(4097, 3) {
			t.Error("an unaligned range of a cached file is not held")
		}
	})
	if err := readThrough(filepath.Join(dir, "missing")); err == nil {
		t.Error("readThrough of a missing file succeeded")
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := readThrough(empty); err != nil {
		t.Errorf("readThrough of an empty file: %v", err)
	}
}
