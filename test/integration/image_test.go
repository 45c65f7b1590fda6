package integration

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/etcd-manager/etcd-manager/internal/image"
	"github.com/etcd-manager/etcd-manager/internal/operator"
	"github.com/etcd-manager/etcd-manager/test/harness"
)

// The image as make image builds it, from the real etcd builds: twice,
// from two directories, giving one digest; holding the agent, the ctl,
// every static etcd with its etcdctl and etcdutl, and not the
// dynamically linked 3.4.
func TestImage(t *testing.T) {
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	etcdDir, err := harness.EtcdBinDir()
	if err != nil {
		t.Fatal(err)
	}
	digestRE := regexp.MustCompile(`image ID (sha256:[0-9a-f]{64})`)
	var digests, sums []string
	var tarPath, out string
	for i := range 2 {
		dir := t.TempDir()
		bin := filepath.Join(dir, "bin")
		build := exec.Command("go", "build", "-trimpath", "-o", bin+"/", "./cmd/etcd-manager", "./cmd/etcd-manager-ctl", "./cmd/etcd-manager-operator")
		build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if b, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, b)
		}
		tarPath = filepath.Join(dir, "image.tar")
		run := exec.Command("go", "run", "./hack/image", "-bin-dir="+bin, "-etcd-dir="+etcdDir, "-etcd-versions=3.6.16,3.5.35,3.7.3", "-output="+tarPath)
		run.Dir, run.Env = root, append(os.Environ(), "IMAGE_TAG=etcd-manager:test")
		b, err := run.CombinedOutput()
		if err != nil {
			t.Fatalf("make image, round %d: %v\n%s", i, err, b)
		}
		out = string(b)
		m := digestRE.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("make image printed no digest:\n%s", out)
		}
		digests = append(digests, m[1])
		b, err = os.ReadFile(tarPath)
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, fmt.Sprintf("%x", sha256.Sum256(b)))
	}
	t.Log(strings.TrimSpace(out))
	if digests[0] != digests[1] || sums[0] != sums[1] {
		t.Errorf("two builds of the same inputs: images %s and %s, tarballs of sha256 %s and %s", digests[0], digests[1], sums[0], sums[1])
	}
	if !strings.Contains(out, "left out etcd 3.4.23 (dynamically linked)") {
		t.Errorf("make image did not say it left out Debian's etcd 3.4:\n%s", out)
	}

	manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarPath) })
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 1 || strings.Join(manifest[0].RepoTags, ",") != "etcd-manager:test" {
		t.Errorf("manifest.json: %+v, want one image tagged etcd-manager:test (IMAGE_TAG)", manifest)
	}
	img, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("the image is not valid: %v", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("the image runs as %q, want 65532:65532, not root", cfg.Config.User)
	}
	if got := cfg.Config.Labels[image.LabelEtcdVersions]; got != "3.5.35,3.6.16,3.7.3" {
		t.Errorf("label %s = %q, want 3.5.35,3.6.16,3.7.3", image.LabelEtcdVersions, got)
	}
	want := map[string]bool{"tmp/": true, "etc/ssl/certs/ca-certificates.crt": true,
		"usr/local/bin/etcd-manager": true, "usr/local/bin/etcd-manager-ctl": true, "usr/local/bin/etcd-manager-operator": true, "versions file": true}
	for _, v := range []string{"3.5.35", "3.6.16", "3.7.3"} { // the Makefile's ETCD_VERSIONS
		for _, b := range []string{"etcd", "etcdctl", "etcdutl"} {
			want["opt/etcd-v"+v+"/"+b] = true
		}
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
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(h.Name, "opt/etcd-v3.4") {
			t.Errorf("the image holds %s, which needs a C library", h.Name)
		}
		if "/"+h.Name == operator.ImageVersionsFile {
			// What the operator, run from the image, reads of it.
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "versions")
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if got, err := operator.ReadImageVersions(path); err != nil || strings.Join(got, ",") != cfg.Config.Labels[image.LabelEtcdVersions] {
				t.Errorf("%s: %q (%v), want the label's %q", operator.ImageVersionsFile, got, err, cfg.Config.Labels[image.LabelEtcdVersions])
			}
			delete(want, "versions file")
		}
		delete(want, h.Name)
	}
	for name := range want {
		t.Errorf("the image lacks %s", name)
	}

	// A real runtime takes it: containerd imports it, and its binaries run
	// in a container (no network but its own loopback).
	outs := containerdRun(t, tarPath, "docker.io/library/etcd-manager:test",
		[]string{"/opt/etcd-v3.7.3/etcd", "--version"},
		[]string{"/opt/etcd-v3.5.35/etcdutl", "version"},
		[]string{"/usr/local/bin/etcd-manager-ctl", "--help"})
	for i, want := range []string{"etcd Version: 3.7.3", "etcdutl version: 3.5.35", "etcd-manager-ctl"} {
		if !strings.Contains(outs[i], want) {
			t.Errorf("in the container, command %d printed %q, want %q", i, outs[i], want)
		}
	}
}

// containerdRun starts a containerd of the test's own (its root, state,
// socket and plugin dirs under a temporary directory; no CRI), imports
// the image tarball with ctr, and runs each command in a container of
// ref; it returns their outputs. It stops containerd by PID and removes
// what the runtime left on the host: its cgroups and /run/containerd,
// unless that was there before.
func containerdRun(t *testing.T, tarPath, ref string, cmds ...[]string) []string {
	t.Helper()
	for _, bin := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is not installed (Debian's containerd and runc; .ci/run installs them): %v", bin, err)
		}
	}
	dir, err := os.MkdirTemp("", "ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) }) // runs last
	ns := fmt.Sprintf("etcd-manager-test-%d", os.Getpid())
	_, err = os.Stat("/run/containerd")
	hadRunDir := err == nil
	sock := filepath.Join(dir, "containerd.sock")
	// No CRI (it would watch /etc/cni), and every directory of its own.
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, filepath.Join(dir, "opt"))
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cd := exec.Command("containerd", "--config", filepath.Join(dir, "config.toml"))
	cd.Stdout, cd.Stderr = logf, logf
	cd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // even if the test binary dies
	if err := cd.Start(); err != nil {
		t.Fatal(err)
	}
	ctr := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		b, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "--namespace", ns}, args...)...).CombinedOutput()
		return string(b), err
	}
	t.Cleanup(func() {
		// Containers left by a failed or timed-out run go first, with
		// their shims, while containerd still serves.
		for i := range cmds {
			id := fmt.Sprintf("c%d", i)
			_, _ = ctr("tasks", "kill", "--signal", "SIGKILL", id)
			_, _ = ctr("tasks", "rm", "--force", id)
			_, _ = ctr("containers", "rm", id)
		}
		_ = cd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("containerd's log:\n%s", b)
			}
		}
		// Snapshots are unmounted when their containers go; make sure.
		if b, err := os.ReadFile("/proc/self/mounts"); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
					_ = syscall.Unmount(f[1], syscall.MNT_DETACH)
				}
			}
		}
		cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + ns)
		if d := "/sys/fs/cgroup/" + ns; dirExists(d) {
			cgroups = append(cgroups, d)
		}
		for _, cg := range cgroups {
			removeEmptyTree(cg)
			if dirExists(cg) {
				t.Errorf("cgroup %s is left behind", cg)
			}
		}
		if hadRunDir {
			_ = os.RemoveAll(filepath.Join("/run/containerd/runc", ns))
		} else {
			_ = os.RemoveAll("/run/containerd")
		}
	})
	harness.WaitFor(t, 30*time.Second, "containerd to serve", func() bool {
		_, err := ctr("version")
		return err == nil
	})
	if out, err := ctr("images", "import", tarPath); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	var outs []string
	for i, cmd := range cmds {
		out, err := ctr(append([]string{"run", "--rm", "--fifo-dir", filepath.Join(dir, "fifo"), ref, fmt.Sprintf("c%d", i)}, cmd...)...)
		if err != nil {
			t.Errorf("ctr run %v: %v\n%s", cmd, err, out)
		}
		outs = append(outs, out)
	}
	return outs
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// removeEmptyTree removes a cgroup directory and the ones below it,
// deepest first (cgroup directories go with rmdir, not unlink).
func removeEmptyTree(root string) {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = syscall.Rmdir(dirs[i])
	}
}
