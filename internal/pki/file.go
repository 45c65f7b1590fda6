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
	return WriteFilesAtomic(FileData{path, data, perm})
}

// FileData is one file for WriteFilesAtomic.
type FileData struct {
	Path string
	Data []byte
	Perm os.FileMode
}

// WriteFilesAtomic writes files as WriteFileAtomic does, with every new
// file written and synced before the first rename, so that the renames
// follow each other at once: a reader of a key and its certificate sees
// a mismatched pair only for the instant between two renames. A file is
// refused, and none is written, when any is a link or not a regular file.
func WriteFilesAtomic(files ...FileData) error {
	var todo []FileData
	for _, f := range files {
		st, err := os.Lstat(f.Path)
		switch {
		case err == nil && st.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%w: %s; remove the link, or write elsewhere", ErrSymlink, f.Path)
		case err == nil && !st.Mode().IsRegular():
			return fmt.Errorf("pki: %s is not a regular file (%s); remove it, or write elsewhere", f.Path, st.Mode().Type())
		case err == nil && st.Mode().Perm() == f.Perm:
			if old, err := os.ReadFile(f.Path); err == nil && bytes.Equal(old, f.Data) {
				continue
			}
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("pki: %w", err)
		}
		todo = append(todo, f)
	}
	tmps := make([]string, 0, len(todo))
	defer func() {
		for _, t := range tmps {
			os.Remove(t) // a no-op once renamed
		}
	}()
	for _, f := range todo {
		t, err := writeTemp(f)
		if err != nil {
			return err
		}
		tmps = append(tmps, t)
	}
	dirs := map[string]bool{}
	for i, f := range todo {
		if err := os.Rename(tmps[i], f.Path); err != nil {
			return fmt.Errorf("pki: %w", err)
		}
		dirs[filepath.Dir(f.Path)] = true
	}
	for dir := range dirs {
		if err := syncDir(dir); err != nil {
			return err
		}
	}
	return nil
}

// writeTemp writes f's data to a new file beside it, created exclusively
// with mode 0600, then set to f's mode and synced; it returns its name.
func writeTemp(f FileData) (string, error) {
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), "."+filepath.Base(f.Path)+"-*") // O_EXCL, 0600
	if err != nil {
		return "", fmt.Errorf("pki: %w", err)
	}
	fail := func(err error) (string, error) {
		tmp.Close()
		os.Remove(tmp.Name())
		return "", fmt.Errorf("pki: write %s: %w", f.Path, err)
	}
	if _, err := tmp.Write(f.Data); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(f.Perm); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("pki: write %s: %w", f.Path, err)
	}
	return tmp.Name(), nil
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
