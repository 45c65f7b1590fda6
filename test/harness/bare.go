package harness

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BareEtcd is an etcd started by hand, without etcd-manager: the baseline
// the benchmarks compare against, and a plain etcd for tests.
type BareEtcd struct {
	Name      string
	ClientURL string
	PeerURL   string
	DataDir   string
	env       *Env
	logPath   string
	args      []string
	cmd       *exec.Cmd
	done      chan struct{}
}

// BareCluster is a cluster of bare etcd. With TLS, its members serve with
// the flags the agents give their etcd (https client and peer URLs
// requiring certificates from Files.CA), and TLS is a client config to
// reach them.
type BareCluster struct {
	Members []*BareEtcd
	Files   TLSFiles
	TLS     *tls.Config
	// InitialCluster and Token are the members' --initial-cluster and
	// --initial-cluster-token.
	InitialCluster, Token string
}

// NewBareCluster prepares n etcd as one new cluster, with their data on
// real disk, as an operator would by hand; secure gives them TLS. It
// starts none: see Start. Each is killed by PID when the test ends.
func (e *Env) NewBareCluster(n int, secure bool) *BareCluster {
	e.t.Helper()
	root := filepath.Join(e.Root, "bare")
	var ips []string
	for range n {
		ips = append(ips, AllocIP(e.t))
	}
	c := &BareCluster{}
	scheme := "http"
	if secure {
		scheme = "https"
		c.Files = NewTLSFiles(e.t, filepath.Join(root, "tls"), ips...)
		c.TLS = ClientTLSFromFiles(e.t, c.Files.CA, c.Files.ClientCert, c.Files.ClientKey)
	}
	var initial []string
	for i, ip := range ips {
		m := &BareEtcd{
			Name:      fmt.Sprintf("bare%d", len(e.bares)+i+1),
			ClientURL: fmt.Sprintf("%s://%s:4001", scheme, ip),
			PeerURL:   fmt.Sprintf("%s://%s:2380", scheme, ip),
			env:       e,
		}
		m.logPath = filepath.Join(root, m.Name+".log")
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	e.bares = append(e.bares, c.Members...)
	c.InitialCluster, c.Token = strings.Join(initial, ","), "bare"
	for _, m := range c.Members {
		m.DataDir = filepath.Join(root, m.Name)
		m.args = []string{
			"--name=" + m.Name, "--data-dir=" + m.DataDir,
			"--listen-client-urls=" + m.ClientURL, "--advertise-client-urls=" + m.ClientURL,
			"--listen-peer-urls=" + m.PeerURL, "--initial-advertise-peer-urls=" + m.PeerURL,
			"--initial-cluster-state=new", "--initial-cluster-token=bare",
			"--initial-cluster=" + strings.Join(initial, ","),
		}
		if secure {
			m.args = append(m.args, BareTLSArgs(c.Files)...)
		}
		e.t.Cleanup(m.Kill)
	}
	return c
}

// BareTLSArgs are the TLS flags the agents give their etcd, with the
// files of f.
func BareTLSArgs(f TLSFiles) []string {
	return []string{
		"--cert-file=" + f.ServerCert, "--key-file=" + f.ServerKey, "--trusted-ca-file=" + f.CA, "--client-cert-auth=true",
		"--peer-cert-file=" + f.ServerCert, "--peer-key-file=" + f.ServerKey, "--peer-trusted-ca-file=" + f.CA, "--peer-client-cert-auth=true",
	}
}

// DefaultEtcd is the binary of DefaultEtcdVersion.
func (e *Env) DefaultEtcd() string {
	return filepath.Join(e.BinDir, "etcd-v"+DefaultEtcdVersion, "etcd")
}

// Start starts every member on the etcd binary.
func (c *BareCluster) Start(etcd string) {
	for _, m := range c.Members {
		m.Start(etcd)
	}
}

// AddArgs gives every member more etcd flags, before Start.
func (c *BareCluster) AddArgs(args ...string) {
	for _, m := range c.Members {
		m.args = append(m.args, args...)
	}
}

// Endpoints are the members' client URLs.
func (c *BareCluster) Endpoints() []string { return BareEndpoints(c.Members) }

// Leader is the member that is raft leader.
func (c *BareCluster) Leader() *BareEtcd {
	for _, m := range c.Members {
		m.env.t.Helper()
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, TLS: c.TLS, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			m.env.t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cl.Status(ctx, m.ClientURL)
		cancel()
		cl.Close()
		if err == nil && st.Leader == st.Header.MemberId {
			return m
		}
	}
	c.Members[0].env.t.Fatal("harness: no bare etcd leader")
	return nil
}

// StartBareCluster starts n plain etcd processes forming one new cluster,
// as an operator would by hand, without TLS.
func (e *Env) StartBareCluster(n int) []*BareEtcd {
	e.t.Helper()
	c := e.NewBareCluster(n, false)
	c.Start(e.DefaultEtcd())
	return c.Members
}

// StartBareTLS starts one etcd whose client URL is https and requires a
// client certificate signed by files.CA; its peer URL stays http.
func (e *Env) StartBareTLS(files TLSFiles, ip string) *BareEtcd {
	e.t.Helper()
	m := &BareEtcd{
		Name:      "bare-tls",
		ClientURL: fmt.Sprintf("https://%s:4001", ip),
		PeerURL:   fmt.Sprintf("http://%s:2380", ip),
		env:       e,
		logPath:   filepath.Join(e.Root, "bare", "bare-tls.log"),
	}
	m.args = []string{
		"--name=" + m.Name, "--data-dir=" + filepath.Join(e.Root, "bare", m.Name),
		"--listen-client-urls=" + m.ClientURL, "--advertise-client-urls=" + m.ClientURL,
		"--listen-peer-urls=" + m.PeerURL, "--initial-advertise-peer-urls=" + m.PeerURL,
		"--initial-cluster-state=new", "--initial-cluster-token=bare",
		"--initial-cluster=" + m.Name + "=" + m.PeerURL,
		"--cert-file=" + files.ServerCert, "--key-file=" + files.ServerKey,
		"--trusted-ca-file=" + files.CA, "--client-cert-auth",
	}
	e.t.Cleanup(m.Kill)
	m.Start(e.DefaultEtcd())
	return m
}

// Start starts the member on the etcd binary with its data and flags,
// appending to its log.
func (m *BareEtcd) Start(etcd string) {
	t := m.env.t
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(m.logPath), 0o755); err != nil {
		t.Fatal(err)
	}
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(etcd, m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	m.cmd, m.done = cmd, done
}

// Stop sends SIGTERM and waits for the process to exit.
func (m *BareEtcd) Stop() {
	t := m.env.t
	t.Helper()
	_ = syscall.Kill(m.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
		m.Kill()
		t.Fatalf("%s did not exit within 30s of SIGTERM", m.Name)
	}
}

// Kill SIGKILLs the process, if it runs, and waits for it.
func (m *BareEtcd) Kill() {
	if m.cmd == nil {
		return
	}
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

// Log is what the member's etcd has written so far.
func (m *BareEtcd) Log() string {
	b, _ := os.ReadFile(m.logPath)
	return string(b)
}

// NewBareOnData prepares one etcd that serves a data dir the test made
// (by restoring a snapshot as member name, with peer URL
// http://ip:2380), on ip. It is killed by PID when the test ends.
func (e *Env) NewBareOnData(dataDir, name, ip string) *BareEtcd {
	e.t.Helper()
	m := &BareEtcd{
		Name:      name,
		ClientURL: fmt.Sprintf("http://%s:4001", ip),
		PeerURL:   fmt.Sprintf("http://%s:2380", ip),
		env:       e,
		logPath:   dataDir + ".log",
	}
	m.args = []string{
		"--name=" + name, "--data-dir=" + dataDir,
		"--listen-client-urls=" + m.ClientURL, "--advertise-client-urls=" + m.ClientURL,
		"--listen-peer-urls=" + m.PeerURL, "--initial-advertise-peer-urls=" + m.PeerURL,
		"--initial-cluster=" + name + "=" + m.PeerURL,
	}
	e.bares = append(e.bares, m)
	e.t.Cleanup(m.Kill)
	return m
}
