package pki

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrSymlink means a file to be written is a symbolic link, which
// WriteFileAtomic neither follows nor replaces.
var ErrSymlink = errors.New("pki: refusing to write through a symbolic link")

// WriteFileAtomic replaces the file at path with data, with mode perm. A
// reader sees the old content or the new, never a part: the data goes to
// a new file beside path, created exclusively with mode 0600, which is
// set to perm, synced, and renamed over path; then the folder is synced.
//
// It refuses a path that is a symbolic link, dangling or not, and leaves
// the link and its target alone: a key must not land where someone else
// chose. (The rename replaces whatever is at path then, a link put there
// meanwhile included; it never writes through one.) A file that already
// holds data with mode perm is left alone, so that files read on every
// connection (etcd's) keep their modification time. The folder must
// exist; it may itself be reached through a link, as the caller named it.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	st, err := os.Lstat(path)
	switch {
	case err == nil && st.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s; remove the link, or write elsewhere", ErrSymlink, path)
	case err == nil && !st.Mode().IsRegular():
		return fmt.Errorf("pki: %s is not a regular file (%s); remove it, or write elsewhere", path, st.Mode().Type())
	case err == nil && st.Mode().Perm() == perm:
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
			return nil
		}
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("pki: %w", err)
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*") // O_EXCL, 0600
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	fail := func(err error) error {
		tmp.Close()
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("pki: sync %s: %w", dir, err)
	}
	return nil
}
