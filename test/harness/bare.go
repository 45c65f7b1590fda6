package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// BareEtcd is an etcd started by hand, without etcd-manager: the baseline
// the benchmarks compare against.
type BareEtcd struct {
	Name      string
	ClientURL string
	PeerURL   string
	cmd       *exec.Cmd
	done      chan struct{}
}

// StartBareCluster starts n plain etcd processes forming one new cluster,
// as an operator would by hand. They are killed by PID when the test ends.
func (e *Env) StartBareCluster(n int) []*BareEtcd {
	e.t.Helper()
	var members []*BareEtcd
	var initial []string
	for i := range n {
		ip := AllocIP(e.t)
		m := &BareEtcd{
			Name:      fmt.Sprintf("bare%d", i+1),
			ClientURL: fmt.Sprintf("http://%s:4001", ip),
			PeerURL:   fmt.Sprintf("http://%s:2380", ip),
		}
		members = append(members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	for _, m := range members {
		e.startBare(m, "--initial-cluster="+strings.Join(initial, ","))
	}
	return members
}

// StartBareTLS starts one plain etcd whose client URL is https and
// requires a client certificate signed by files.CA.
func (e *Env) StartBareTLS(files TLSFiles, ip string) *BareEtcd {
	e.t.Helper()
	m := &BareEtcd{
		Name:      "bare-tls",
		ClientURL: fmt.Sprintf("https://%s:4001", ip),
		PeerURL:   fmt.Sprintf("http://%s:2380", ip),
	}
	e.startBare(m, "--initial-cluster="+m.Name+"="+m.PeerURL,
		"--cert-file="+files.ServerCert, "--key-file="+files.ServerKey,
		"--trusted-ca-file="+files.CA, "--client-cert-auth")
	return m
}

func (e *Env) startBare(m *BareEtcd, extra ...string) {
	e.t.Helper()
	etcd := filepath.Join(e.BinDir, "etcd-v"+DefaultEtcdVersion, "etcd")
	dir := filepath.Join(e.Root, "bare", m.Name)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		e.t.Fatal(err)
	}
	logf, err := os.Create(dir + ".log")
	if err != nil {
		e.t.Fatal(err)
	}
	args := append([]string{
		"--name=" + m.Name, "--data-dir=" + dir,
		"--listen-client-urls=" + m.ClientURL, "--advertise-client-urls=" + m.ClientURL,
		"--listen-peer-urls=" + m.PeerURL, "--initial-advertise-peer-urls=" + m.PeerURL,
		"--initial-cluster-state=new", "--initial-cluster-token=bare",
	}, extra...)
	m.cmd = exec.Command(etcd, args...)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	m.done = make(chan struct{})
	go func(f *os.File) { _ = m.cmd.Wait(); f.Close(); close(m.done) }(logf)
	e.t.Cleanup(m.Kill)
}

// Kill SIGKILLs the process and waits for it.
func (m *BareEtcd) Kill() {
	select {
	case <-m.done:
		return
	default:
	}
	_ = m.cmd.Process.Kill()
	select {
	case <-m.done:
	case <-time.After(10 * time.Second):
	}
}

// PID is the process ID.
func (m *BareEtcd) PID() int { return m.cmd.Process.Pid }

// BareEndpoints returns the client URLs.
func BareEndpoints(ms []*BareEtcd) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ClientURL)
	}
	return out
}
