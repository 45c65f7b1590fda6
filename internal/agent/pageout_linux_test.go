package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestReadOnlyMapping(t *testing.T) {
	const exe = "/usr/bin/etcd-manager"
	tests := []struct {
		name       string
		line       string
		exe        string // the binary's path, exe when empty
		start, end uintptr
		ok         bool
	}{
		{name: "code", line: "00400000-01aa7000 r-xp 00000000 fd:00 123 /usr/bin/etcd-manager", start: 0x400000, end: 0x1aa7000, ok: true},
		{name: "read-only data", line: "01aa7000-035e2000 r--p 016a7000 fd:00 123 /usr/bin/etcd-manager", start: 0x1aa7000, end: 0x35e2000, ok: true},
		{name: "a replaced binary", line: "00400000-00500000 r-xp 00000000 fd:00 123 /usr/bin/etcd-manager (deleted)", start: 0x400000, end: 0x500000, ok: true},
		{name: "writable data is never touched", line: "035e2000-036b9000 rw-p 031e2000 fd:00 123 /usr/bin/etcd-manager"},
		{name: "another file", line: "7f99b4b78000-7f99b4cce000 r-xp 00028000 fd:00 77 /usr/lib/x86_64-linux-gnu/libc.so.6"},
		{name: "anonymous", line: "1ce9e0800000-1ce9e1800000 rw-p 00000000 00:00 0"},
		{name: "another path with a space", line: "00400000-00500000 r-xp 00000000 fd:00 9 /opt/my tools/etcd-manager"},
		{name: "a path with a space", line: "00400000-00500000 r-xp 00000000 fd:00 9 /opt/my tools/etcd-manager", exe: "/opt/my tools/etcd-manager",
			start: 0x400000, end: 0x500000, ok: true},
		{name: "bad range", line: "zz-01 r-xp 00000000 fd:00 123 /usr/bin/etcd-manager"},
		{name: "empty range", line: "00500000-00400000 r-xp 00000000 fd:00 123 /usr/bin/etcd-manager"},
		{name: "short line", line: "00400000-00500000 r-xp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.exe
			if path == "" {
				path = exe
			}
			start, end, ok := readOnlyMapping(tt.line, path)
			if ok != tt.ok || start != tt.start || end != tt.end {
				t.Fatalf("readOnlyMapping = %#x, %#x, %v, want %#x, %#x, %v", start, end, ok, tt.start, tt.end, tt.ok)
			}
		})
	}
}

// TestReleaseCodePages checks on this test binary that the pages of its
// read-only mappings stop being resident.
func TestReleaseCodePages(t *testing.T) {
	before := residentCodeKiB(t)
	if before == 0 {
		t.Fatal("no resident pages in the test binary's read-only mappings")
	}
	n, err := releaseCodePages()
	after := residentCodeKiB(t)
	if err != nil {
		t.Fatal(err)
	}
	if n <= 0 {
		t.Fatalf("advised %d bytes", n)
	}
	// What the test itself runs in between comes back; most must not.
	if after > before/2 {
		t.Fatalf("resident read-only pages of the binary: %d KiB before, %d KiB after", before, after)
	}
	t.Logf("resident read-only pages of the binary: %d KiB before, %d KiB after", before, after)
}

func residentCodeKiB(t *testing.T) int64 {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var kib int64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			_, _, in = readOnlyMapping(line, exe)
			continue
		}
		if rest, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			v, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("smaps %q: %v", line, err)
			}
			kib += v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return kib
}
