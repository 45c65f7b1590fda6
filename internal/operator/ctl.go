package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Execer runs a command in a container of a pod and returns its output.
type Execer interface {
	Exec(ctx context.Context, namespace, pod, container string, cmd []string) (stdout []byte, err error)
}

// maxCtlOutput bounds what is read from a ctl run: its output is untrusted.
const maxCtlOutput = 4 << 20

// execTimeout bounds one command in a pod, so that a hung one cannot hold
// up the reconciles of every cluster.
const execTimeout = time.Minute

// ErrNoSpec means the store holds no cluster spec yet.
var ErrNoSpec = errors.New("operator: the store has no cluster spec yet")

// ErrInvalidSpec means the store's cluster spec is invalid: the agents
// ignore it. The operator reports it (condition Degraded, reason
// StoreSpecInvalid) rather than replace it and lose the fields it does
// not own.
var ErrInvalidSpec = errors.New("operator: the store's cluster spec is invalid")

// Ctl drives a cluster's store with etcd-manager-ctl, run inside one of
// its member pods, where the store's credentials and volume already are:
// the operator itself needs neither.
type Ctl struct{ Exec Execer }

func (c Ctl) run(ctx context.Context, cl *v1alpha1.EtcdCluster, pod string, args ...string) ([]byte, error) {
	return c.Exec.Exec(ctx, cl.Namespace, pod, container, append(CtlArgs(cl), args...))
}

// Spec reads the store's cluster spec; ErrNoSpec when there is none.
func (c Ctl) Spec(ctx context.Context, cl *v1alpha1.EtcdCluster, pod string) (*spec.ClusterSpec, error) {
	out, err := c.run(ctx, cl, pod, "--output=json", "get")
	if err != nil {
		if strings.Contains(err.Error(), "no cluster spec in") {
			return nil, ErrNoSpec
		}
		if strings.Contains(err.Error(), ") is invalid: ") {
			return nil, fmt.Errorf("%w: %w", ErrInvalidSpec, err)
		}
		return nil, err
	}
	cs, err := spec.DecodeClusterSpec(out)
	if err != nil {
		return nil, fmt.Errorf("operator: the ctl's spec: %w", err)
	}
	return &cs, nil
}

// WriteSpec writes the cluster spec to the store.
func (c Ctl) WriteSpec(ctx context.Context, cl *v1alpha1.EtcdCluster, pod string, cs spec.ClusterSpec) error {
	args := []string{fmt.Sprintf("--member-count=%d", cs.MemberCount), "--etcd-version=" + cs.EtcdVersion,
		fmt.Sprintf("--ordinal-members=%t", cs.OrdinalMembers)}
	if cs.AllowDumpRestore {
		args = append(args, "--allow-dump-restore")
	}
	_, err := c.run(ctx, cl, pod, append(args, "configure-cluster")...)
	return err
}

// Status asks the agents for the cluster's live status.
func (c Ctl) Status(ctx context.Context, cl *v1alpha1.EtcdCluster, pod string) (cli.ClusterStatus, error) {
	var st cli.ClusterStatus
	return st, c.runJSON(ctx, cl, pod, &st, "status")
}

// Backups lists the store's backups, oldest first.
func (c Ctl) Backups(ctx context.Context, cl *v1alpha1.EtcdCluster, pod string) ([]cli.BackupRow, error) {
	var rows []cli.BackupRow
	return rows, c.runJSON(ctx, cl, pod, &rows, "list-backups")
}

// Commands lists the store's queued commands.
func (c Ctl) Commands(ctx context.Context, cl *v1alpha1.EtcdCluster, pod string) ([]cli.CommandRow, error) {
	var rows []cli.CommandRow
	return rows, c.runJSON(ctx, cl, pod, &rows, "list-commands")
}

// BackupNow queues a backup-now command and returns its ID.
func (c Ctl) BackupNow(ctx context.Context, cl *v1alpha1.EtcdCluster, pod string) (string, error) {
	return c.queue(ctx, cl, pod, "backup-now", "--wait=false")
}

// RestoreBackup queues a restore of the named backup and returns the
// command's ID.
func (c Ctl) RestoreBackup(ctx context.Context, cl *v1alpha1.EtcdCluster, pod, backup string) (string, error) {
	id, err := c.queue(ctx, cl, pod, "restore-backup", "--wait=false", "--", backup)
	if err != nil {
		for _, refused := range []string{"is not whole:", "cannot be restored:", "no backup "} {
			if strings.Contains(err.Error(), refused) {
				return "", fmt.Errorf("%w: %w", ErrBackupRefused, err)
			}
		}
	}
	return id, err
}

// ErrBackupRefused means the ctl refused to queue a restore of a backup
// that cannot be restored (damaged, not whole, or gone): trying again
// does not help.
var ErrBackupRefused = errors.New("operator: the backup cannot be restored")

// MoveLeader hands raft leadership from the member in pod to the member
// of ID to (hex), with the etcdctl of the version the cluster runs.
func (c Ctl) MoveLeader(ctx context.Context, cl *v1alpha1.EtcdCluster, pod, version, to string) error {
	if _, err := spec.ParseVersion(version); err != nil {
		return fmt.Errorf("operator: move leader: %w", err)
	}
	args := []string{etcdBinDir + "/etcd-v" + version + "/etcdctl", fmt.Sprintf("--endpoints=%s://127.0.0.1:%d", urlScheme(cl), ClientPort)}
	if TLSEnabled(cl) {
		args = append(args, "--cacert="+dataDir+"/pki/ca.crt", "--cert="+dataDir+"/pki/node.crt", "--key="+dataDir+"/pki/node.key")
	}
	_, err := c.Exec.Exec(ctx, cl.Namespace, pod, container, append(args, "move-leader", to))
	return err
}

func (c Ctl) queue(ctx context.Context, cl *v1alpha1.EtcdCluster, pod string, args ...string) (string, error) {
	out, err := c.run(ctx, cl, pod, args...)
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(out))
	if id == "" || len(id) > 128 || strings.ContainsAny(id, " \n/") {
		return "", fmt.Errorf("operator: %s printed %q, not a command ID", args[0], out)
	}
	return id, nil
}

func (c Ctl) runJSON(ctx context.Context, cl *v1alpha1.EtcdCluster, pod string, v any, args ...string) error {
	out, err := c.run(ctx, cl, pod, append([]string{"--output=json"}, args...)...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("operator: %s printed no valid JSON: %w", args[0], err)
	}
	return nil
}

// PodExec runs commands in pods through the API server, as kubectl exec
// does.
type PodExec struct {
	Config *rest.Config
	Client kubernetes.Interface
}

// Exec runs cmd in a container and returns its stdout; on failure the
// error carries the end of its stderr.
func (p PodExec) Exec(ctx context.Context, namespace, pod, ctr string, cmd []string) ([]byte, error) {
	req := p.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: ctr, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(p.Config, "GET", req.URL().String())
	if err != nil {
		return nil, fmt.Errorf("operator: exec in %s/%s: %w", namespace, pod, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(p.Config, "POST", req.URL())
	if err != nil {
		return nil, fmt.Errorf("operator: exec in %s/%s: %w", namespace, pod, err)
	}
	// Fall back to SPDY only when the WebSocket upgrade itself failed: a
	// command that ran, or may have, is never run twice.
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("operator: exec in %s/%s: %w", namespace, pod, err)
	}
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	stdout := &limitedBuffer{max: maxCtlOutput}
	stderr := &limitedBuffer{max: 64 << 10}
	if err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr}); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2048 {
			msg = "…" + msg[len(msg)-2048:]
		}
		return nil, fmt.Errorf("operator: %s in %s/%s: %w: %s", cmdName(cmd), namespace, pod, err, msg)
	}
	if stdout.over {
		return nil, fmt.Errorf("operator: %s in %s/%s printed more than %d bytes", cmdName(cmd), namespace, pod, maxCtlOutput)
	}
	return stdout.Bytes(), nil
}

func cmdName(cmd []string) string {
	for i := len(cmd) - 1; i > 0; i-- {
		if !strings.HasPrefix(cmd[i], "-") {
			return cmd[i]
		}
	}
	return strings.Join(cmd, " ")
}

// limitedBuffer keeps the first max bytes written and notes the rest.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.over = true
		if room > 0 {
			b.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

var _ io.Writer = (*limitedBuffer)(nil)
