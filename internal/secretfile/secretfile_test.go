package secretfile

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func check(t *testing.T, path string) error {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return Check(f, path)
}

func write(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte("secret"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func TestCheckModes(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		mode os.FileMode
		want string // in the refusal; "" for none
	}{
		{0o600, ""},
		{0o400, ""},
		{0o640, "group or others may access it"},
		{0o440, "on a writable file system"},
		{0o644, "group or others may access it"},
		{0o660, "group or others may access it"},
		{0o604, "group or others may access it"},
	} {
		path := filepath.Join(dir, tc.mode.String())
		write(t, path, tc.mode)
		err := check(t, path)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("mode %04o: %v, want %q", tc.mode, err, tc.want)
		}
	}
	if err := check(t, dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
}

// A Kubernetes Secret volume: root's files, group-readable under the
// pod's fsGroup, on a read-only mount. The test mounts a tmpfs of its own
// (it needs root, as CI has) and unmounts it after.
func TestCheckReadOnlyMount(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Fatal("this test needs Linux")
	}
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts a tmpfs, and needs root (CI runs as root)")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		t.Fatalf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	key, wide := filepath.Join(dir, "key"), filepath.Join(dir, "wide")
	write(t, key, 0o440)
	write(t, wide, 0o444)
	if err := os.Chown(key, 0, os.Getegid()); err != nil {
		t.Fatal(err)
	}
	if err := check(t, key); err == nil {
		t.Error("a group-readable key on a writable mount passed")
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		t.Fatalf("remount read-only: %v", err)
	}
	if err := check(t, key); err != nil {
		t.Errorf("a Secret's key (root, 0440, read-only mount): %v", err)
	}
	if err := check(t, wide); err == nil || !strings.Contains(err.Error(), "group or others may access it") {
		t.Errorf("a world-readable key on a read-only mount: %v", err)
	}
}
