package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gocloud.dev/blob/fileblob"
)

// A file:// store opens every path beneath its directory: a symbolic
// link planted in it that leads out (an NFS store, say, that others can
// write) fails the write, with nothing written outside, and fails the
// read, with nothing read from outside.
func TestFileStoreConfined(t *testing.T) {
	ctx := t.Context()
	s, dir := openTemp(t)
	defer s.Close()
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("not the store's"), 0o600); err != nil {
		t.Fatal(err)
	}
	// control/ is a link to a directory outside; discovery/x a link to a
	// file outside; pki/ca.crt a link to a file in the store (it stays
	// beneath the root, and is read).
	if err := os.Symlink(outside, filepath.Join(dir, "control")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "discovery"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "discovery", "x")); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, "pki/real", []byte("in the store")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(dir, "pki", "ca.crt")); err != nil {
		t.Fatal(err)
	}

	for _, write := range []struct {
		name string
		do   func() error
	}{
		{"write", func() error { return s.Write(ctx, KeySpec, []byte("{}")) }},
		{"put", func() error { return s.Put(ctx, "control/x/_status.json", strings.NewReader("{}")) }},
		{"create", func() error { return s.Create(ctx, KeyCreated, []byte("{}")) }},
		{"write over a link to a file", func() error { return s.Write(ctx, "discovery/x", []byte("{}")) }},
		{"delete", func() error { return s.Delete(ctx, "control/secret") }},
	} {
		err := write.do()
		if write.name == "write over a link to a file" {
			// The link itself is replaced, inside the store; its target
			// is untouched.
			if err != nil {
				t.Errorf("%s: %v", write.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s through a link out of the store succeeded", write.name)
		}
	}
	entries, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(secret); len(entries) != 1 || err != nil || string(got) != "not the store's" {
		t.Errorf("outside the store: %d entries, secret %q, %v; want it untouched", len(entries), got, err)
	}

	if err := os.Symlink(secret, filepath.Join(dir, "discovery", "y")); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"discovery/y", "control/secret"} {
		if got, err := s.Read(ctx, key); err == nil {
			t.Errorf("read %s through a link out of the store: %q", key, got)
		}
		if _, err := s.ReadMax(ctx, key, 1<<10); err == nil {
			t.Errorf("ReadMax %s through a link out of the store succeeded", key)
		}
		if r, err := s.Reader(ctx, key); err == nil {
			r.Close()
			t.Errorf("Reader %s through a link out of the store succeeded", key)
		}
		if _, err := s.ModTime(ctx, key); err == nil {
			t.Errorf("ModTime %s through a link out of the store succeeded", key)
		}
	}
	if got, err := s.Read(ctx, "pki/ca.crt"); err != nil || string(got) != "in the store" {
		t.Errorf("read through a link inside the store: %q, %v", got, err)
	}
	if _, err := s.Read(ctx, "pki"); !errors.Is(err, ErrNotFound) {
		t.Errorf("read of a directory: %v, want ErrNotFound", err)
	}
}

// A store whose directory is reached through a symbolic link is refused,
// naming the link's target, unless its URL allows it.
func TestFileStoreRootSymlink(t *testing.T) {
	real := filepath.Join(t.TempDir(), "real")
	if err := os.MkdirAll(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	_, err := Open(t.Context(), "file://"+link, Options{})
	if !errors.Is(err, ErrBadURL) || !strings.Contains(err.Error(), real) || !strings.Contains(err.Error(), "root-symlink=allow") {
		t.Errorf("open through a link: %v, want ErrBadURL naming %s and the way to allow it", err, real)
	}
	s, err := Open(t.Context(), "file://"+link+"?root-symlink=allow", Options{})
	if err != nil {
		t.Fatalf("open through a link that the URL allows: %v", err)
	}
	defer s.Close()
	if err := s.Write(t.Context(), KeySpec, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(real, filepath.FromSlash(KeySpec))); err != nil {
		t.Errorf("the object is not in the link's target: %v", err)
	}
	if _, err := Open(t.Context(), "file://"+real+"?prefix=x", Options{}); !errors.Is(err, ErrBadURL) {
		t.Errorf("a file URL with another query: %v, want ErrBadURL", err)
	}
}

// A key this store never writes (a control character in it), which
// another tool wrote through fileblob under an escaped file name, is read
// as before; one whose file is a link out of the store is refused.
func TestFileStoreEscapedKeys(t *testing.T) {
	ctx := t.Context()
	s, dir := openTemp(t)
	defer s.Close()
	other, err := fileblob.OpenBucket(dir, &fileblob.Options{Metadata: fileblob.MetadataDontWrite})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	inside, linked := "control/a\x01b/_command.json", "control/a\x02b/_command.json"
	for _, key := range []string{inside, linked} {
		if err := other.WriteAll(ctx, key, []byte("another tool's"), nil); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.Read(ctx, inside); err != nil || string(got) != "another tool's" {
		t.Errorf("read %q: %q, %v", inside, got, err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("not the store's"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "control", fmt.Sprintf("a__%#x__b", 2), "_command.json")
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, file); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Read(ctx, linked); err == nil || strings.Contains(string(got), "not the store's") {
		t.Errorf("read %q through a link out of the store: %q, %v", linked, got, err)
	}
}

// A file:// store's folder is looked up again for each operation: one
// removed reads as the store unreachable (never as an empty store), and
// one made anew, as a remount would, is used at once.
func TestFileStoreFolderLookedUpEachTime(t *testing.T) {
	ctx := t.Context()
	s, dir := openTemp(t)
	defer s.Close()
	if err := s.Write(ctx, KeySpec, []byte("old")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read(ctx, KeySpec); !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrNotFound) {
		t.Errorf("read with the folder gone: %v, want ErrUnreachable", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "control"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(KeySpec)), []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Read(ctx, KeySpec); err != nil || string(got) != "new" {
		t.Errorf("read from the folder made anew: %q, %v", got, err)
	}
	if err := s.Write(ctx, KeyCreated, []byte("x")); err != nil {
		t.Errorf("write to the folder made anew: %v", err)
	}
}
