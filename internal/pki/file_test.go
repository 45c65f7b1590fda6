package pki

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFileAtomic(t *testing.T) {
	const content = "new secret"
	tests := []struct {
		name string
		// setup prepares dir and returns the path to write.
		setup    func(t *testing.T, dir string) string
		perm     os.FileMode
		wantErr  string
		wantIs   error
		wantMode os.FileMode
	}{
		{name: "a new key file is 0600", setup: func(t *testing.T, dir string) string {
			return filepath.Join(dir, "client.key")
		}, perm: 0o600, wantMode: 0o600},
		{name: "a certificate may be 0644", setup: func(t *testing.T, dir string) string {
			return filepath.Join(dir, "client.crt")
		}, perm: 0o644, wantMode: 0o644},
		{name: "an existing 0644 key ends up 0600", setup: func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "client.key")
			mustWrite(t, p, "old secret", 0o644)
			return p
		}, perm: 0o600, wantMode: 0o600},
		{name: "an existing 0644 key with the same content ends up 0600", setup: func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "client.key")
			mustWrite(t, p, content, 0o644)
			return p
		}, perm: 0o600, wantMode: 0o600},
		{name: "a directory in the way is refused", setup: func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "client.key")
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			return p
		}, perm: 0o600, wantErr: "is not a regular file"},
		{name: "a dangling link is refused and its target not created", setup: func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "client.key")
			if err := os.Symlink(filepath.Join(dir, "elsewhere"), p); err != nil {
				t.Fatal(err)
			}
			return p
		}, perm: 0o600, wantIs: ErrSymlink},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tt.setup(t, dir)
			err := WriteFileAtomic(path, []byte(content), tt.perm)
			if tt.wantErr != "" || tt.wantIs != nil {
				if err == nil || (tt.wantIs != nil && !errors.Is(err, tt.wantIs)) || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
					t.Fatalf("WriteFileAtomic: %v, want an error naming %s", err, path)
				}
				if _, err := os.Stat(filepath.Join(dir, "elsewhere")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("the link's target was created: %v", err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				st, err := os.Lstat(path)
				if err != nil {
					t.Fatal(err)
				}
				if !st.Mode().IsRegular() || st.Mode().Perm() != tt.wantMode {
					t.Errorf("mode %v, want a regular file with %v", st.Mode(), tt.wantMode)
				}
				if got, _ := os.ReadFile(path); string(got) != content {
					t.Errorf("content %q, want %q", got, content)
				}
			}
			assertNoTempFiles(t, dir)
		})
	}
}

// A link at the key's path is refused: the link stays a link, and the
// file it points to keeps its content and mode.
func TestWriteFileAtomicRefusesALink(t *testing.T) {
	dir, victimDir := t.TempDir(), t.TempDir()
	victim := filepath.Join(victimDir, "authorized_keys")
	mustWrite(t, victim, "precious", 0o644)
	link := filepath.Join(dir, "client.key")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	err := WriteFileAtomic(link, []byte("key material"), 0o600)
	if !errors.Is(err, ErrSymlink) || !strings.Contains(err.Error(), link) {
		t.Fatalf("WriteFileAtomic through a link: %v, want ErrSymlink naming %s", err, link)
	}
	if got, _ := os.ReadFile(victim); string(got) != "precious" {
		t.Errorf("the link's target now holds %q", got)
	}
	if st, _ := os.Stat(victim); st.Mode().Perm() != 0o644 {
		t.Errorf("the link's target's mode changed to %v", st.Mode().Perm())
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v, %v", st.Mode(), err)
	}
	assertNoTempFiles(t, dir)
}

// A rewrite replaces the file in one step: a reader holding the old file
// open keeps reading the old content in full.
func TestWriteFileAtomicReplacesInOneStep(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node.crt")
	mustWrite(t, path, "old content", 0o644)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := WriteFileAtomic(path, []byte("new content, longer"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := make([]byte, 64)
	n, _ := f.Read(old)
	if string(old[:n]) != "old content" {
		t.Errorf("the open file now reads %q: it was written in place", old[:n])
	}
	if got, _ := os.ReadFile(path); string(got) != "new content, longer" {
		t.Errorf("content %q", got)
	}
}

func mustWrite(t *testing.T, path, data string, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil { // past the umask
		t.Fatal(err)
	}
}

func assertNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("a temporary file was left behind: %s", e.Name())
		}
	}
}
