package secretfile

import (
	"os"

	"golang.org/x/sys/unix"
)

// readOnly says whether f lies on a file system mounted read-only.
func readOnly(f *os.File) (bool, error) {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		return false, err
	}
	return fs.Flags&unix.ST_RDONLY != 0, nil
}
