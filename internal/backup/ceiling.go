package backup

import (
	"fmt"
	"io"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A damaged snapshot can make bbolt's check run without end and take
// memory without bound: one with a page header claiming 2^28 overflow
// pages took a child to 800 MB in 5 s, and the audit saw 23 GB. The
// child that checks a snapshot therefore runs under a ceiling of its
// own, which grows with the snapshot's size, and the parent gives it a
// time limit that grows the same way. A check that reaches either has
// failed: a sound snapshot's check needs a small part of both.

// Ceiling is what a verify child may spend on a snapshot.
type Ceiling struct {
	// Memory bounds the child's anonymous memory (its heap and stacks,
	// not the file bbolt maps), in bytes.
	Memory int64
	// Timeout bounds the child's run.
	Timeout time.Duration
}

// CeilingFor is the ceiling of checking a snapshot file of size bytes:
// 256 MiB and an eighth of the size, and two minutes and a second per
// 16 MiB (10.5 minutes for 8 GiB, which a sound check reads in under a
// minute). A sound check's memory is mostly bbolt's map of the pages it
// has seen, some 40 bytes per 4 KiB page.
func CeilingFor(size int64) Ceiling {
	size = max(size, 0)
	return Ceiling{Memory: 256<<20 + size/8, Timeout: 2*time.Minute + time.Duration(size/(16<<20))*time.Second}
}

// MemoryCeilingFlag passes a verify child its memory ceiling, in bytes.
const MemoryCeilingFlag = "memory-ceiling-bytes"

// exitCeiling is the exit code of a verify child that reached its memory
// ceiling.
const exitCeiling = 4

// ceilingCheckEvery is how often a child compares its memory with its
// ceiling. A runaway check allocates some 150 MB/s; it passes the
// ceiling by a few MB at most before it is stopped.
const ceilingCheckEvery = 10 * time.Millisecond

// maxCheckStack bounds each goroutine's stack in a verify child: a
// sound bbolt tree is a few levels deep, and a loop in a damaged one
// must not recurse into the default 1 GB.
const maxCheckStack = 64 << 20

// enforceCeiling puts this process, a verify child about to read the
// snapshot at path, under memory bytes of anonymous memory: a soft
// limit for the garbage collector, a bound on its stacks, a watch that
// ends the process with exitCeiling once it passes the limit, and a
// hard bound on its address space (the mapped file, the limit and a
// margin) for an allocation faster than the watch.
func enforceCeiling(path string, memory int64, stderr io.Writer) error {
	if memory <= 0 {
		return nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	debug.SetMemoryLimit(memory / 2)
	debug.SetMaxStack(maxCheckStack)
	if vsz, _, err := readStatm(); err == nil {
		// bbolt maps at most twice the file (sizes double up to 1 GiB,
		// then grow by 1 GiB).
		limit := vsz + 2*st.Size() + memory + 1<<30
		if limit > 0 && limit < math.MaxInt64/2 {
			rl := syscall.Rlimit{Cur: uint64(limit), Max: uint64(limit)}
			if err := syscall.Setrlimit(syscall.RLIMIT_AS, &rl); err != nil {
				fmt.Fprintf(stderr, "backup: cannot bound the address space of the check (%v); the memory watch still bounds it\n", err)
			}
		}
	}
	go func() {
		for range time.Tick(ceilingCheckEvery) {
			if _, anon, err := readStatm(); err == nil && anon > memory {
				fmt.Fprintf(stderr, "%s: %s: its check needed more than its ceiling of %d bytes of memory (a sound snapshot's needs a small part of it), and was stopped\n", ErrCorrupt, path, memory)
				os.Exit(exitCeiling)
			}
		}
	}()
	return nil
}

// fileSize is the size of the file at path, 0 when it cannot be read
// (the child then reports why).
func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// readStatm returns this process's virtual size and its resident
// anonymous memory, in bytes, from /proc/self/statm.
func readStatm() (vsz, anon int64, err error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, 0, fmt.Errorf("backup: /proc/self/statm: %q", b)
	}
	var v [3]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("backup: /proc/self/statm: %w", err)
		}
	}
	page := int64(os.Getpagesize())
	return v[0] * page, (v[1] - v[2]) * page, nil
}
