package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// fixture writes files with the given contents under a new directory,
// each with its own modification time, and returns them as image files.
func fixture(t *testing.T, contents map[string]string) []File {
	t.Helper()
	dir := t.TempDir()
	var files []File
	i := 0
	for p, body := range contents {
		src := filepath.Join(dir, fmt.Sprintf("%d-%s", i, filepath.Base(p)))
		if err := os.WriteFile(src, []byte(body), os.FileMode(0o600+i%2*0o44)); err != nil {
			t.Fatal(err)
		}
		// Sources differ in time and mode: neither may reach the image.
		mt := time.Now().Add(-time.Duration(i) * time.Hour)
		if err := os.Chtimes(src, mt, mt); err != nil {
			t.Fatal(err)
		}
		files = append(files, File{Path: p, Source: src, Mode: 0o755})
		i++
	}
	return files
}

// build builds and writes an image of files; it returns the image's
// digest and the tarball's path and sha256.
func build(t *testing.T, files []File, epoch int64) (digest, tarPath, tarSum string) {
	t.Helper()
	img, err := Build(Image{Files: files, Entrypoint: []string{"/usr/local/bin/etcd-manager"}, Epoch: time.Unix(epoch, 0)}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := Write(out, "etcd-manager:dev", img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return d.String(), out, fmt.Sprintf("%x", sha256.Sum256(b))
}

func TestReproducible(t *testing.T) {
	contents := map[string]string{
		"/usr/local/bin/etcd-manager": "agent",
		"/opt/etcd-v3.6.16/etcd":      "etcd",
		"/opt/etcd-v3.6.16/etcdctl":   "etcdctl",
	}
	first, _, firstSum := build(t, fixture(t, contents), 0)
	again, _, againSum := build(t, fixture(t, contents), 0)
	if first != again {
		t.Errorf("the same inputs gave two digests: %s, %s", first, again)
	}
	if firstSum != againSum {
		t.Errorf("the same inputs gave two tarballs: sha256 %s, %s", firstSum, againSum)
	}
	if later, _, _ := build(t, fixture(t, contents), 1700000000); later == first {
		t.Error("another epoch left the digest as it was")
	}
	contents["/opt/etcd-v3.6.16/etcd"] = "etcd, changed"
	if changed, _, _ := build(t, fixture(t, contents), 0); changed == first {
		t.Error("a changed file left the digest as it was")
	}
}

// The tarball is a docker-archive: manifest.json names the tag, and the
// one layer holds the files, their directories and /tmp, owned by root
// and stamped with the epoch.
func TestTarballContents(t *testing.T) {
	epoch := int64(1700000000)
	_, p, _ := build(t, fixture(t, map[string]string{"/usr/local/bin/etcd-manager": "agent", "/opt/etcd-v3.6.16/etcd": "etcd"}), epoch)

	manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(p) })
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 1 || len(manifest[0].RepoTags) != 1 || manifest[0].RepoTags[0] != "etcd-manager:dev" || len(manifest[0].Layers) != 1 {
		t.Fatalf("manifest.json: %+v, want one image tagged etcd-manager:dev with one layer", manifest)
	}

	img, err := tarball.ImageFromPath(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("the image read back is not valid: %v", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootFS.Type != "layers" {
		t.Errorf("rootfs type %q, want layers", cfg.RootFS.Type)
	}
	if cfg.OS != "linux" || !cfg.Created.Equal(time.Unix(epoch, 0)) || strings.Join(cfg.Config.Entrypoint, " ") != "/usr/local/bin/etcd-manager" {
		t.Errorf("config: os %q, created %s, entrypoint %v", cfg.OS, cfg.Created.Time, cfg.Config.Entrypoint)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	type got struct {
		mode int64
		dir  bool
		body string
	}
	entries := map[string]got{}
	var order []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(time.Unix(epoch, 0)) {
			t.Errorf("%s: uid %d gid %d time %s, want root's and the epoch", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		b, _ := io.ReadAll(tr)
		entries[h.Name] = got{mode: h.Mode, dir: h.Typeflag == tar.TypeDir, body: string(b)}
		order = append(order, h.Name)
	}
	want := map[string]got{
		"opt/":                       {mode: 0o755, dir: true},
		"opt/etcd-v3.6.16/":          {mode: 0o755, dir: true},
		"opt/etcd-v3.6.16/etcd":      {mode: 0o755, body: "etcd"},
		"tmp/":                       {mode: 0o1777, dir: true},
		"usr/":                       {mode: 0o755, dir: true},
		"usr/local/":                 {mode: 0o755, dir: true},
		"usr/local/bin/":             {mode: 0o755, dir: true},
		"usr/local/bin/etcd-manager": {mode: 0o755, body: "agent"},
	}
	for name, w := range want {
		if g, ok := entries[name]; !ok || g != w {
			t.Errorf("%s: %+v (present %t), want %+v", name, g, ok, w)
		}
	}
	if len(entries) != len(want) {
		t.Errorf("the layer holds %v, want only %d entries", order, len(want))
	}
	for i := 1; i < len(order); i++ {
		if order[i-1] >= order[i] {
			t.Errorf("entries out of order: %s before %s", order[i-1], order[i])
		}
	}
}

func TestBadFiles(t *testing.T) {
	src := fixture(t, map[string]string{"/a": "x"})[0].Source
	tests := []struct {
		name  string
		files []File
		want  string
	}{
		{"relative path", []File{{Path: "usr/bin/x", Source: src}}, "not a clean absolute path"},
		{"unclean path", []File{{Path: "/usr/../x", Source: src}}, "not a clean absolute path"},
		{"twice", []File{{Path: "/x", Source: src}, {Path: "/x", Source: src}}, "in the image twice"},
		{"file and directory", []File{{Path: "/x", Source: src}, {Path: "/x/y", Source: src}}, "both a file and a directory"},
		{"missing source", []File{{Path: "/x", Source: filepath.Join(t.TempDir(), "nope")}}, "no such file"},
		{"a directory as source", []File{{Path: "/x", Source: t.TempDir()}}, "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Build(Image{Files: tt.files}, t.TempDir())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

// A write that fails, early (a bad tag) or part way (the layer is gone),
// leaves the old tarball as it was and no temporary file behind.
func TestFailedWriteKeepsOldTarball(t *testing.T) {
	files := fixture(t, map[string]string{"/x": "x"})
	_, p, _ := build(t, files, 0)
	before, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	img, err := Build(Image{Files: files}, tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"Not A Tag!", "etcd-manager", "etcd-manager:-dev", "foo/:dev"} {
		if err := Write(p, tag, img); err == nil || !strings.Contains(err.Error(), "not a valid image reference") {
			t.Errorf("tag %q: error %v, want a refusal", tag, err)
		}
	}
	if err := os.Remove(filepath.Join(tmp, LayerFile)); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, "etcd-manager:dev", img); err == nil {
		t.Fatal("a write without its layer succeeded")
	}
	after, _ := os.ReadFile(p)
	if !bytes.Equal(before, after) {
		t.Error("a failed write changed the tarball")
	}
	if left, _ := filepath.Glob(p + ".tmp*"); len(left) > 0 {
		t.Errorf("a failed write left %v behind", left)
	}
}

// writeELF writes a minimal ELF executable: with a PT_INTERP program
// header (it needs a dynamic loader) if dynamic.
func writeELF(t *testing.T, p string, dynamic bool) {
	t.Helper()
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Phoff: 64, Ehsize: 64, Phentsize: 56, Shentsize: 64}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	progs := []elf.Prog64{{Type: uint32(elf.PT_LOAD)}}
	if dynamic {
		progs = append(progs, elf.Prog64{Type: uint32(elf.PT_INTERP)})
	}
	h.Phnum = uint16(len(progs))
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.LittleEndian, h); err != nil {
		t.Fatal(err)
	}
	if err := binary.Write(&buf, binary.LittleEndian, progs); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, buf.Bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
}

// The tools link each etcd build in from their cache. A dynamically
// linked build is left out; a static one without its etcdutl, or with a
// dynamic etcdctl, is an error; so is no static build at all.
func TestFindEtcds(t *testing.T) {
	cache, bin := t.TempDir(), t.TempDir()
	for _, b := range []string{"etcd", "etcdctl", "etcdutl"} {
		writeELF(t, filepath.Join(cache, "etcd-v3.6.16", b), false)
		writeELF(t, filepath.Join(bin, "etcd-v3.4.23", b), true)
	}
	if err := os.Symlink(filepath.Join(cache, "etcd-v3.6.16"), filepath.Join(bin, "etcd-v3.6.16")); err != nil {
		t.Fatal(err)
	}
	writeELF(t, filepath.Join(bin, "etcd-manager"), false) // not an etcd build
	files, versions, skipped, err := FindEtcds(bin)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range files {
		paths = append(paths, f.Path)
	}
	if got, want := strings.Join(paths, " "), "/opt/etcd-v3.6.16/etcd /opt/etcd-v3.6.16/etcdctl /opt/etcd-v3.6.16/etcdutl"; got != want {
		t.Errorf("files %s, want %s", got, want)
	}
	if strings.Join(versions, ",") != "3.6.16" || strings.Join(skipped, ",") != "3.4.23 (dynamically linked)" {
		t.Errorf("versions %v, skipped %v", versions, skipped)
	}

	writeELF(t, filepath.Join(cache, "etcd-v3.6.16", "etcdctl"), true)
	if _, _, _, err := FindEtcds(bin); err == nil || !strings.Contains(err.Error(), "etcdctl is dynamically linked") {
		t.Errorf("a dynamic etcdctl beside a static etcd: %v, want an error naming it", err)
	}
	if err := os.Remove(filepath.Join(cache, "etcd-v3.6.16", "etcdctl")); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := FindEtcds(bin); err == nil || !strings.Contains(err.Error(), "etcdctl") {
		t.Errorf("an etcd without its etcdctl: %v, want an error naming it", err)
	}
	if err := os.RemoveAll(filepath.Join(cache, "etcd-v3.6.16")); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := FindEtcds(bin); err == nil {
		t.Error("a dangling link to an etcd build was accepted")
	}
	if err := os.Remove(filepath.Join(bin, "etcd-v3.6.16")); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := FindEtcds(bin); err == nil || !strings.Contains(err.Error(), "no statically linked etcd") {
		t.Errorf("only a dynamic etcd: %v, want an error", err)
	}
	if err := os.WriteFile(filepath.Join(bin, "script"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Static(filepath.Join(bin, "script")); err == nil {
		t.Error("a shell script passed for an ELF executable")
	}
}
