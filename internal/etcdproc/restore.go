package etcdproc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// RestoreOptions are the flags of `snapshot restore`.
type RestoreOptions struct {
	// SnapshotPath is the snapshot file; DataDir the new data dir, which
	// must not exist.
	SnapshotPath, DataDir string
	// Name, PeerURLs, InitialCluster and Token are the restored member's
	// --name, --initial-advertise-peer-urls, --initial-cluster and
	// --initial-cluster-token.
	Name           string
	PeerURLs       []string
	InitialCluster string
	Token          string
	// BumpRevision and MarkCompacted are etcdutl's --bump-revision and
	// --mark-compacted (etcd 3.5 and later).
	BumpRevision  int64
	MarkCompacted bool
}

// RestoreSnapshot writes a new data dir from a snapshot with this
// version's own tool: etcdutl, or etcdctl for etcd 3.4, which has no
// etcdutl. The version that will run the data writes it, so a restore
// into an older etcd (a dump-restore down to 3.4) gets the layout that
// version expects.
func (b Binaries) RestoreSnapshot(ctx context.Context, o RestoreOptions) error {
	tool, env := b.Etcdutl, ChildEnv()
	if !isExecutable(tool) {
		tool, env = b.Etcdctl, ChildEnv("ETCDCTL_API=3")
		if !isExecutable(tool) {
			return fmt.Errorf("%w: no etcdutl or etcdctl in %s to restore a snapshot with", ErrNoBinary, b.Dir)
		}
		if o.BumpRevision > 0 || o.MarkCompacted {
			return fmt.Errorf("etcdproc: --bump-revision and --mark-compacted need etcdutl (etcd 3.5 or later); %s has none", b.Dir)
		}
	}
	args := []string{"snapshot", "restore", o.SnapshotPath,
		"--data-dir", o.DataDir,
		"--name", o.Name,
		"--initial-advertise-peer-urls", strings.Join(o.PeerURLs, ","),
		"--initial-cluster", o.InitialCluster,
		"--initial-cluster-token", o.Token}
	if o.BumpRevision > 0 {
		args = append(args, "--bump-revision", strconv.FormatInt(o.BumpRevision, 10))
	}
	if o.MarkCompacted {
		args = append(args, "--mark-compacted")
	}
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("etcdproc: %s snapshot restore: %w: %s", tool, err, lastLines(out.String(), 5))
	}
	return nil
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// lastLines returns the last n lines of s, trimmed.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
