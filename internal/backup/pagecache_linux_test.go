package backup

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
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

// procIORead is how much one read of /proc/self/io counts in it, at
// most: it is under 200 bytes.
const procIORead = 256

// readBytes is how many bytes this process has read through read
// calls, from the page cache or not (/proc/self/io's rchar).
func readBytes(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no rchar in /proc/self/io: %v", sc.Err())
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
	tests := []struct {
		name    string
		prepare func(t *testing.T) // leaves part of the file in the cache
		// readThrough reads from minRead to maxRead bytes: what the
		// cache lost, less what the kernel's read-ahead brought back
		// meanwhile.
		minRead, maxRead int64
	}{
		{name: "all cached", prepare: func(t *testing.T) {
			if _, err := os.ReadFile(path); err != nil {
				t.Fatal(err)
			}
		}, minRead: 0, maxRead: 0},
		{name: "none cached", prepare: func(t *testing.T) { dropFromCache(t, path) }, minRead: readThroughChunk, maxRead: size},
		{name: "the second chunk cached", prepare: func(t *testing.T) {
			dropFromCache(t, path)
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			// Not read-ahead: only this chunk comes back.
			if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
				t.Fatal(err)
			}
			if _, err := f.ReadAt(make([]byte, readThroughChunk), readThroughChunk); err != nil {
				t.Fatal(err)
			}
		}, minRead: readThroughChunk, maxRead: size - readThroughChunk},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.prepare(t)
			t.Logf("held before: %v", held())
			before := readBytes(t)
			if err := readThrough(path); err != nil {
				t.Fatal(err)
			}
			// Reading /proc/self/io counts in it too.
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
