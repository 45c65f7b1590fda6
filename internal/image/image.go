package image

import (
	"archive/tar"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File is one regular file of the image.
type File struct {
	// Path is where it lives in the image, absolute.
	Path string
	// Source is the file on this machine it is copied from.
	Source string
	// Mode is its permission bits.
	Mode int64
}

// Image is what goes into the image.
type Image struct {
	Files []File
	// Entrypoint is the command a container runs unless told otherwise.
	Entrypoint []string
	Env        []string
	Labels     map[string]string
	// User runs the container unless told otherwise, as user[:group].
	User string
	// Epoch stamps every entry and the config (SOURCE_DATE_EPOCH).
	Epoch time.Time
}

// Paths inside the image.
const (
	BinDir      = "/usr/local/bin"
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
	// VersionsFile lists the etcd versions the image holds, as
	// LabelEtcdVersions does, for the operator that runs from it.
	VersionsFile = "/etc/etcd-manager/etcd-versions"
	// User is who the image runs as: not root, and owning nothing in it
	// (it writes only to /tmp and the volumes mounted for it).
	User = "65532:65532"
)

// LabelEtcdVersions lists the etcd versions an image holds, comma
// separated: what an operator may run from it.
const LabelEtcdVersions = "dev.etcd-manager.etcd-versions"

// EtcdDir is where the binaries of etcd version v live in the image.
func EtcdDir(version string) string { return "/opt/etcd-v" + version }

// etcdBinaries are the files each etcd directory must hold.
var etcdBinaries = []string{"etcd", "etcdctl", "etcdutl"}

var etcdDirName = regexp.MustCompile(`^etcd-v(\d+\.\d+\.\d+)$`)

// FindEtcds returns the etcd versions under dir (as the tools build them:
// dir/etcd-v<version>/{etcd,etcdctl,etcdutl}) that are linked statically,
// and so run in an image without a C library; and the versions it leaves
// out, with why. A static build without one of its three binaries is an
// error: the image would ship a broken etcd.
func FindEtcds(dir string) (files []File, versions []string, skipped []string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("image: %w", err)
	}
	for _, e := range entries {
		m := etcdDirName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		version := m[1]
		src := filepath.Join(dir, e.Name())
		// The tools link their cached builds in: follow the link.
		if fi, err := os.Stat(src); err != nil {
			return nil, nil, nil, fmt.Errorf("image: %w", err)
		} else if !fi.IsDir() {
			continue
		}
		static, err := Static(filepath.Join(src, "etcd"))
		if err != nil {
			return nil, nil, nil, err
		}
		if !static {
			skipped = append(skipped, version+" (dynamically linked)")
			continue
		}
		for _, b := range etcdBinaries {
			p := filepath.Join(src, b)
			if static, err := Static(p); err != nil {
				return nil, nil, nil, err
			} else if !static {
				return nil, nil, nil, fmt.Errorf("image: %s is dynamically linked, unlike the etcd beside it", p)
			}
			files = append(files, File{Path: path.Join(EtcdDir(version), b), Source: p, Mode: 0o755})
		}
		versions = append(versions, version)
	}
	if len(versions) == 0 {
		return nil, nil, nil, fmt.Errorf("image: no statically linked etcd under %s (run make tools)", dir)
	}
	return files, versions, skipped, nil
}

// Static says whether the ELF executable at p needs no dynamic loader,
// and so runs in an image without a C library.
func Static(p string) (bool, error) {
	f, err := elf.Open(p)
	if err != nil {
		return false, fmt.Errorf("image: %s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

// LayerFile is the name of the compressed layer Build writes in tmpDir.
const LayerFile = "layer.tar.gz"

// Build assembles the image. Its one layer is written, compressed once,
// to LayerFile under tmpDir, which must outlive the image's use. A zero
// Epoch means the Unix epoch.
func Build(img Image, tmpDir string) (v1.Image, error) {
	if img.Epoch.IsZero() {
		img.Epoch = time.Unix(0, 0)
	}
	layerPath := filepath.Join(tmpDir, LayerFile)
	if err := writeLayer(layerPath, img.Files, img.Epoch); err != nil {
		return nil, err
	}
	// Already compressed: the bytes written are the bytes hashed.
	layer, err := tarball.LayerFromFile(layerPath)
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	epoch := v1.Time{Time: img.Epoch.UTC()}
	cfg := &v1.ConfigFile{
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Created:      epoch,
		// Replacing the config drops the empty image's rootfs type,
		// which clients check.
		RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint: img.Entrypoint,
			Env:        img.Env,
			Labels:     img.Labels,
			User:       img.User,
			WorkingDir: "/",
		},
	}
	out, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	out, err = mutate.Append(out, mutate.Addendum{Layer: layer, History: v1.History{
		Created: epoch, CreatedBy: "etcd-manager make image",
	}})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return out, nil
}

// tagRE is the reference grammar docker, podman and containerd accept:
// an optional registry host, lower-case path components, and a tag.
var tagRE = regexp.MustCompile(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?` +
	`[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Write writes img to the tarball at p, tagged tag (name:tag), through a
// temporary file, so that p is either the whole image or untouched.
func Write(p, tag string, img v1.Image) (err error) {
	if !tagRE.MatchString(tag) {
		return fmt.Errorf("image: %q is not a valid image reference with a tag, such as etcd-manager:dev", tag)
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("image: tag %q: %w", tag, err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), filepath.Base(p)+".tmp-")
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if err := tarball.Write(ref, img, f); err != nil {
		return fmt.Errorf("image: write %s: %w", p, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return nil
}

// writeLayer writes the layer's gzipped tar: the files, the directories
// above them and /tmp, sorted by path, owned by root, stamped with epoch.
func writeLayer(p string, files []File, epoch time.Time) (err error) {
	dirs := map[string]int64{"/tmp": 0o1777}
	seen := map[string]bool{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return fmt.Errorf("image: %q is not a clean absolute path", f.Path)
		}
		if seen[f.Path] {
			return fmt.Errorf("image: %s is in the image twice", f.Path)
		}
		seen[f.Path] = true
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	type entry struct {
		name string
		dir  bool
		mode int64
		src  string
	}
	var entries []entry
	for d, mode := range dirs {
		if seen[d] {
			return fmt.Errorf("image: %s is both a file and a directory", d)
		}
		entries = append(entries, entry{name: strings.TrimPrefix(d, "/") + "/", dir: true, mode: mode})
	}
	for _, f := range files {
		entries = append(entries, entry{name: strings.TrimPrefix(f.Path, "/"), mode: f.Mode, src: f.Source})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })

	out, err := os.Create(p)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("image: %w", cerr)
		}
	}()
	zw, err := gzip.NewWriterLevel(out, gzip.BestSpeed)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		if e.dir {
			hdr.Typeflag = tar.TypeDir
			if err := tw.WriteHeader(hdr); err != nil {
				return fmt.Errorf("image: %w", err)
			}
			continue
		}
		if err := copyFile(tw, hdr, e.src); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return nil
}

func copyFile(tw *tar.Writer, hdr *tar.Header, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("image: %s is not a regular file", src)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	n, err := io.Copy(tw, f)
	switch {
	case err != nil:
		return fmt.Errorf("image: copy %s: %w", src, err)
	case n != st.Size():
		return fmt.Errorf("image: %s changed while it was copied", src)
	}
	return nil
}
