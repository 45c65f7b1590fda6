package store

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestWriteback(t *testing.T) {
	tests := []struct {
		name       string
		writes     []int
		wantBegun  int64
		wantLength int64
	}{
		{name: "small: nothing begun", writes: []int{1 << 20, 1 << 20}, wantBegun: 0, wantLength: 2 << 20},
		{name: "one chunk exactly", writes: []int{writebackChunk}, wantBegun: writebackChunk, wantLength: writebackChunk},
		{name: "chunks and a tail", writes: []int{3 << 20, 3 << 20, 3 << 20, 3 << 20, 3 << 20, 3 << 20, 1}, wantBegun: 18 << 20, wantLength: 18<<20 + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "obj")
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			w := writeback(f)
			var want bytes.Buffer
			for i, n := range tt.writes {
				b := bytes.Repeat([]byte{byte('a' + i)}, n)
				want.Write(b)
				if m, err := w.Write(b); err != nil || m != n {
					t.Fatalf("write %d: %d, %v", i, m, err)
				}
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if w.failed {
				t.Error("sync_file_range failed on this disk")
			}
			if w.begun != tt.wantBegun || w.written != tt.wantLength {
				t.Errorf("writeback begun for %d of %d bytes, want %d of %d", w.begun, w.written, tt.wantBegun, tt.wantLength)
			}
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want.Bytes()) {
				t.Errorf("the file holds %d bytes, not the %d written", len(got), want.Len())
			}
		})
	}
}

// residentPages counts how many of the file's pages are in the page
// cache (mincore on a mapping of it).
func residentPages(t *testing.T, path string) (resident, total int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	for _, v := range vec {
		if v&1 != 0 {
			resident++
		}
	}
	return resident, len(vec)
}

// TestWritebackLeavesTheCache: a large object written through the file
// store leaves the page cache once it is synced, and a small one (a
// capture segment, which merges read back) stays.
func TestWritebackLeavesTheCache(t *testing.T) {
	dir := diskTempDir(t)
	s, err := Open(context.Background(), "file://"+dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name        string
		size        int
		maxResident float64 // of the object's pages
		minResident float64
	}{
		{name: "large", size: 5*writebackChunk + 12345, maxResident: 0.05},
		{name: "small", size: writebackChunk / 2, minResident: 0.95},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := bytes.Repeat([]byte("0123456789abcdef"), tc.size/16)
			if err := s.Put(context.Background(), "obj-"+tc.name, bytes.NewReader(data)); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(dir, "obj-"+tc.name))
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("the object reads back %d bytes (%v), want the %d written", len(got), err, len(data))
			}
			// Reading it above brought it back: write it again, and look
			// before anything reads it.
			if err := s.Put(context.Background(), "obj-"+tc.name, bytes.NewReader(data)); err != nil {
				t.Fatal(err)
			}
			res, total := residentPages(t, filepath.Join(dir, "obj-"+tc.name))
			frac := float64(res) / float64(total)
			t.Logf("%d of %d pages resident after the write", res, total)
			if tc.maxResident > 0 && frac > tc.maxResident {
				t.Errorf("%d of the object's %d pages are still in the page cache after it was synced", res, total)
			}
			if frac < tc.minResident {
				t.Errorf("only %d of the small object's %d pages are in the page cache", res, total)
			}
		})
	}
}

// diskTempDir is a temporary directory on a disk: tmpfs's pages are its
// storage and never leave the cache. t.TempDir's when TMPDIR is on a
// disk, else one under /var/tmp or the test's own folder, removed at the
// end.
func diskTempDir(t *testing.T) string {
	t.Helper()
	onDisk := func(dir string) bool {
		var fs unix.Statfs_t
		return unix.Statfs(dir, &fs) == nil && fs.Type != unix.TMPFS_MAGIC
	}
	if dir := t.TempDir(); onDisk(dir) {
		return dir
	}
	wd, _ := os.Getwd()
	for _, parent := range []string{"/var/tmp", wd} {
		if parent == "" || !onDisk(parent) {
			continue
		}
		dir, err := os.MkdirTemp(parent, "etcd-manager-writeback-*")
		if err != nil {
			continue
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	t.Fatalf("no temporary directory on a disk: TMPDIR, /var/tmp and %s are all on tmpfs; set TMPDIR to a directory on a disk", wd)
	return ""
}
