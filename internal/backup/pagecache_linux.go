package backup

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pageCache answers whether the page cache holds ranges of one file,
// through mincore on a read-only mapping of it. Nothing of the file is
// read to answer: mincore only looks the pages up.
type pageCache struct {
	m   []byte // the mapping; nil when mincore cannot be used
	vec []byte
}

// openPageCache maps f's first size bytes. When mincore cannot answer
// truly, every question gets "not held", so the caller reads everything.
func openPageCache(f *os.File, size int64) *pageCache {
	if size <= 0 || int64(int(size)) != size || !mayAskMincore(f) {
		return &pageCache{}
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return &pageCache{}
	}
	return &pageCache{m: m}
}

// mayAskMincore reports whether mincore tells the truth about f's pages:
// for a file the process neither owns nor may write, Linux reports every
// page as cached rather than refuse, so as not to tell one user what
// another reads. (A process with CAP_FOWNER gets the truth anyway; it is
// asked the same questions, and reads a file it could not write whole.)
func mayAskMincore(f *os.File) bool {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	if int(st.Uid) == os.Geteuid() {
		return true
	}
	return unix.Faccessat(unix.AT_FDCWD, f.Name(), unix.W_OK, unix.AT_EACCESS) == nil
}

// holds reports whether every page of [off, off+n) is in the page cache.
func (c *pageCache) holds(off, n int64) bool {
	if c.m == nil || off < 0 || n <= 0 || off+n > int64(len(c.m)) {
		return false
	}
	page := int64(os.Getpagesize())
	start := off / page * page // mincore wants a page-aligned address
	pages := (off + n - start + page - 1) / page
	if int64(cap(c.vec)) < pages {
		c.vec = make([]byte, pages)
	}
	vec := c.vec[:pages]
	length := min(off+n, int64(len(c.m))) - start
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&c.m[start])), uintptr(length), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		c.unmap() // the rest is read
		return false
	}
	for _, v := range vec {
		if v&1 == 0 {
			return false
		}
	}
	return true
}

func (c *pageCache) unmap() {
	if c.m != nil {
		_ = unix.Munmap(c.m)
		c.m = nil
	}
}

func (c *pageCache) close() { c.unmap() }
