package agent

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// releaseCodePages pages out the read-only mappings of the running
// binary (its code, read-only data and tables) with MADV_PAGEOUT (Linux
// 5.4), and returns how many bytes of address space it advised. Unlike
// MADV_DONTNEED it never discards anything: it reclaims what the kernel
// could reclaim under memory pressure. The kernel quietly skips pages
// another process maps too, and, for a binary this process neither owns
// nor may write (an agent not run as root), every page; a binary on tmpfs
// without swap stays resident. Writable mappings are never advised.
func releaseCodePages() (int64, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, fmt.Errorf("agent: release code pages: %w", err)
	}
	exe = strings.TrimSuffix(exe, " (deleted)")
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("agent: release code pages: %w", err)
	}
	defer f.Close()
	var advised int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		start, end, ok := readOnlyMapping(sc.Text(), exe)
		if !ok {
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_PAGEOUT); errno != 0 {
			return advised, fmt.Errorf("agent: release code pages: madvise: %w", errno)
		}
		advised += int64(end - start)
	}
	if err := sc.Err(); err != nil {
		return advised, fmt.Errorf("agent: release code pages: %w", err)
	}
	return advised, nil
}

// readOnlyMapping parses one line of /proc/self/maps ("start-end perms
// offset dev inode path") and reports the range of a mapping of path
// that is not writable.
func readOnlyMapping(line, path string) (start, end uintptr, ok bool) {
	fields := strings.Fields(line)
	if len(fields) < 6 || strings.Contains(fields[1], "w") {
		return 0, 0, false
	}
	if name := strings.TrimSuffix(strings.Join(fields[5:], " "), " (deleted)"); name != path {
		return 0, 0, false
	}
	lo, hi, found := strings.Cut(fields[0], "-")
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.ParseUint(lo, 16, 64)
	e, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || e <= s {
		return 0, 0, false
	}
	return uintptr(s), uintptr(e), true
}
