package etcdproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// DefaultBinDir is where etcd installs are looked for by default.
const DefaultBinDir = "/opt"

// ErrNoBinary means no etcd binary for the wanted version is installed.
var ErrNoBinary = errors.New("etcdproc: no etcd binary")

// Binaries are the etcd, etcdctl and etcdutl of one version.
type Binaries struct {
	Version spec.Version
	Dir     string
	Etcd    string
	Etcdctl string
	Etcdutl string
}

// CandidateDirs lists, in order, the folders searched under binDir for a
// version: etcd-v<version> and the release-tarball name
// etcd-v<version>-linux-<arch>.
func CandidateDirs(binDir string, v spec.Version) []string {
	name := "etcd-v" + v.String()
	return []string{
		filepath.Join(binDir, name),
		filepath.Join(binDir, name+"-linux-"+runtime.GOARCH),
	}
}

// FindBinaries looks for the etcd binaries of version v under binDir. The
// error names every path it looked at, so the operator knows where to
// install the binary.
func FindBinaries(binDir string, v spec.Version) (Binaries, error) {
	var looked []string
	for _, dir := range CandidateDirs(binDir, v) {
		etcd := filepath.Join(dir, "etcd")
		looked = append(looked, etcd)
		st, err := os.Stat(etcd)
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			continue
		}
		return Binaries{
			Version: v,
			Dir:     dir,
			Etcd:    etcd,
			Etcdctl: filepath.Join(dir, "etcdctl"),
			Etcdutl: filepath.Join(dir, "etcdutl"),
		}, nil
	}
	return Binaries{}, fmt.Errorf("%w for etcd %s in %s: looked for %s; install it there or set --etcd-bin-dir",
		ErrNoBinary, v, binDir, strings.Join(looked, " and "))
}

var versionLineRE = regexp.MustCompile(`(?m)^etcd Version: (\S+)`)

// versionCache remembers the version each binary reported, by path and
// modification time, so the check runs once per binary.
var versionCache sync.Map

// CheckVersion runs `etcd --version` and checks that the binary is the
// version it claims by its folder name.
func (b Binaries) CheckVersion(ctx context.Context) error {
	st, err := os.Stat(b.Etcd)
	if err != nil {
		return fmt.Errorf("etcdproc: %w", err)
	}
	key := fmt.Sprintf("%s@%d", b.Etcd, st.ModTime().UnixNano())
	got, ok := versionCache.Load(key)
	if !ok {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, b.Etcd, "--version")
		cmd.Env = ChildEnv()
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("etcdproc: run %s --version: %w", b.Etcd, err)
		}
		m := versionLineRE.FindSubmatch(out)
		if m == nil {
			return fmt.Errorf("etcdproc: %s --version printed no version line", b.Etcd)
		}
		got = string(m[1])
		versionCache.Store(key, got)
	}
	if got != b.Version.String() {
		return fmt.Errorf("etcdproc: %s reports version %s, but its folder says %s", b.Etcd, got, b.Version)
	}
	return nil
}

// InstalledVersions lists the etcd versions installed under binDir (the
// folders FindBinaries looks in), sorted, without duplicates.
func InstalledVersions(binDir string) []string {
	entries, err := os.ReadDir(binDir)
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var vs []spec.Version
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), "etcd-v")
		if !ok {
			continue
		}
		if i := strings.Index(name, "-linux-"); i >= 0 {
			name = name[:i]
		}
		v, err := spec.ParseVersion(name)
		if err != nil || seen[v.String()] {
			continue
		}
		if _, err := FindBinaries(binDir, v); err != nil {
			continue
		}
		seen[v.String()] = true
		vs = append(vs, v)
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].Compare(vs[j]) < 0 })
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.String()
	}
	return out
}

// childEnvKeep are the variables of the agent's environment its etcd
// and etcd's tools get: what a process needs to run, never the agent's
// cloud credentials, nor a stray ETCD_* variable, which etcd would read as
// a flag. ETCD_UNSUPPORTED_ARCH passes, since only a person sets it, for
// etcd on an architecture it does not support by default.
var childEnvKeep = []string{"PATH", "HOME", "TMPDIR", "GOMAXPROCS", "ETCD_UNSUPPORTED_ARCH"}

// ChildEnv is the environment of etcd and its tools: childEnvKeep from
// the agent's, and extra (as KEY=value).
func ChildEnv(extra ...string) []string {
	var out []string
	for _, k := range childEnvKeep {
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	return append(out, extra...)
}
