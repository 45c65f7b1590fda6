// Package harness runs real etcd-manager agents, with real etcd children,
// on loopback for the integration tests. Every process it starts is killed
// by PID when the test ends, and data lives on real disk under the test's
// temporary directory.
package harness

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcd-manager/etcd-manager/internal/testhook"
)

// DefaultEtcdVersion is the etcd the tests run unless they ask otherwise.
const DefaultEtcdVersion = "3.6.16"

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// ReleaseBuild, set before the first Env, builds the binaries as a
// release is built: without the testhooks tag, so that no test hook is
// in them (the benchmark measures what users run).
var ReleaseBuild bool

// BuildTags are the build tags of the binaries the harness builds: those
// of GOFLAGS (the Makefile's), and testhooks unless ReleaseBuild is set.
func BuildTags() string { return Tags(ReleaseBuild) }

// Tags are GOFLAGS's build tags, with testhooks unless release.
func Tags(release bool) string {
	var tags []string
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		if v, ok := strings.CutPrefix(f, "-tags="); ok {
			for _, tag := range strings.Split(v, ",") {
				if tag != "testhooks" && tag != "" {
					tags = append(tags, tag)
				}
			}
		}
	}
	if !release {
		tags = append(tags, "testhooks")
	}
	return strings.Join(tags, ",")
}

// RepoRoot finds the module root by walking up to go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("harness: go.mod not found above the working directory")
		}
		dir = parent
	}
}

// EtcdBinDir is where the real etcd installs are: $ETCD_MANAGER_ETCD_BIN_DIR
// or the repository's bin/ (filled by make tools).
func EtcdBinDir() (string, error) {
	if d := os.Getenv("ETCD_MANAGER_ETCD_BIN_DIR"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin"), nil
}

// FileURL is the file:// URL of an absolute path, percent-encoded (test
// directories can hold a '#', which would otherwise start a fragment).
func FileURL(path string) string {
	return (&url.URL{Scheme: "file", Path: path}).String()
}

// Cleanup removes the binaries built for the test run; call it from
// TestMain after m.Run.
func Cleanup() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

// build compiles etcd-manager and etcd-manager-ctl once per test binary.
func build() (string, error) {
	buildOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		buildDir, err = os.MkdirTemp("", "etcd-manager-test-bin-")
		if err != nil {
			buildErr = err
			return
		}
		cmd := exec.Command("go", "build", "-tags="+BuildTags(), "-o", buildDir+"/", "./cmd/etcd-manager", "./cmd/etcd-manager-ctl")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("harness: go build: %v\n%s", err, out)
		}
	})
	return buildDir, buildErr
}

// Env is one test's world: a backup store, built binaries and real etcd.
type Env struct {
	t        testing.TB
	Root     string
	BinDir   string // etcd installs
	AgentBin string
	CtlBin   string
	StoreDir string
	StoreURL string
	// ExtraEnv is added to the environment of every agent and ctl run,
	// for example a cloud store's credentials.
	ExtraEnv []string
	// Insecure starts agents with --insecure --etcd-insecure and runs the
	// ctl with --insecure. By default everything is TLS, as shipped.
	Insecure bool
	agents   []*Agent
	bares    []*BareEtcd

	tlsMu     sync.Mutex
	clientTLS *tls.Config
}

// ClientTLS is an etcd and peer API client TLS config with a client
// certificate from the cluster's CA, which the agents keep in the store;
// nil for an insecure env.
func (e *Env) ClientTLS() *tls.Config {
	if e.Insecure {
		return nil
	}
	e.tlsMu.Lock()
	defer e.tlsMu.Unlock()
	if e.clientTLS != nil {
		return e.clientTLS
	}
	// As an operator would: issue-client-cert through the ctl, which
	// reads the CA from the store with the env's credentials.
	dir := filepath.Join(e.Root, "client-certs")
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, stderr, err := e.CtlRaw("--backup-store="+e.StoreURL, "--store-attempts=1", "issue-client-cert", "--out", dir, "--name=harness", "--validity=24h")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("harness: no client certificate from the store's CA: %v\n%s", err, stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.clientTLS = ClientTLSFromFiles(e.t, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
	return e.clientTLS
}

// ResetClientTLS forgets the client certificate ClientTLS issued, so
// that the next call issues another from the store's CA: after a CA
// rotation, say.
func (e *Env) ResetClientTLS() {
	e.tlsMu.Lock()
	defer e.tlsMu.Unlock()
	e.clientTLS = nil
}

// TLS is ClientTLS of the agent's env.
func (a *Agent) TLS() *tls.Config { return a.env.ClientTLS() }

// UseStore points the env's agents and ctl runs at another store, such as
// a bucket on MinIO, with the credentials it needs.
func (e *Env) UseStore(url string, env []string) {
	e.StoreURL = url
	e.ExtraEnv = append(e.ExtraEnv, env...)
}

func (e *Env) environ() []string {
	return append(os.Environ(), e.ExtraEnv...)
}

// NewEnv prepares an environment. It fails the test loudly if the real
// etcd binary is missing: run make tools.
func NewEnv(t testing.TB) *Env {
	t.Helper()
	binDir, err := EtcdBinDir()
	if err != nil {
		t.Fatal(err)
	}
	etcd := filepath.Join(binDir, "etcd-v"+DefaultEtcdVersion, "etcd")
	if _, err := os.Stat(etcd); err != nil {
		t.Fatalf("real etcd %s is required but missing at %s (run make tools): %v", DefaultEtcdVersion, etcd, err)
	}
	dir, err := build()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	e := &Env{
		t: t, Root: root, BinDir: binDir,
		AgentBin: filepath.Join(dir, "etcd-manager"), CtlBin: filepath.Join(dir, "etcd-manager-ctl"),
		StoreDir: filepath.Join(root, "backups", "test"),
	}
	e.StoreURL = FileURL(e.StoreDir)
	return e
}

// Ctl runs etcd-manager-ctl against the env's store and etcd installs.
func (e *Env) Ctl(args ...string) (stdout, stderr string, err error) {
	full := append([]string{"--backup-store=" + e.StoreURL}, args...)
	if e.Insecure {
		full = append(full, "--insecure")
	}
	return e.CtlRaw(full...)
}

// CtlRaw runs etcd-manager-ctl with exactly args.
func (e *Env) CtlRaw(args ...string) (stdout, stderr string, err error) {
	// Commands that wait (backup-now, restore-backup) have their own
	// --timeout; this only stops a ctl that hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, e.CtlBin, args...)
	cmd.Env = e.environ()
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// MustCtl runs etcd-manager-ctl and fails the test on error.
func (e *Env) MustCtl(args ...string) string {
	e.t.Helper()
	out, errOut, err := e.Ctl(args...)
	if err != nil {
		e.t.Fatalf("etcd-manager-ctl %v: %v\nstdout: %s\nstderr: %s", args, err, out, errOut)
	}
	return out
}

// AgentOptions tune one agent.
type AgentOptions struct {
	// StoreURL overrides the env's store.
	StoreURL string
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
	// IP fixes the agent's loopback address; empty allocates a fresh one.
	IP string
	// Metrics serves the agent's metrics at MetricsURL.
	Metrics bool
	// PeerFirewall, when set, fronts the agent's etcd peer URL with the
	// firewall's proxy: etcd binds port 2381 and advertises the proxy on
	// 2380.
	PeerFirewall *PeerFirewall
	// Defaults runs the agent with its default timings instead of the fast
	// ones tests use (benchmarks measure the product as shipped).
	Defaults bool
}

// Agent is one etcd-manager process on loopback.
type Agent struct {
	env       *Env
	Name      string
	DataDir   string
	ClientURL string
	QuarURL   string
	PeerURL   string
	// PeerAPI is the agent's peer API address (host:port).
	PeerAPI string
	// MetricsURL is set when the agent serves metrics.
	MetricsURL string
	LogPath    string
	args       []string
	ip         string
	opts       AgentOptions
	cmd        *exec.Cmd
	waitDone   chan struct{}
	waitErr    error
	logFile    *os.File
}

// StartAgent starts an agent with free loopback ports and a fresh data dir.
func (e *Env) StartAgent(name string, opts AgentOptions) *Agent {
	e.t.Helper()
	ip := opts.IP
	if ip == "" {
		ip = AllocIP(e.t)
	}
	a := &Agent{
		env:     e,
		Name:    name,
		DataDir: filepath.Join(e.Root, "data", name),
		PeerAPI: fmt.Sprintf("%s:%d", ip, 8000),
		LogPath: filepath.Join(e.Root, "logs", name+".log"),
		ip:      ip,
		opts:    opts,
	}
	a.configure(!e.Insecure)
	e.agents = append(e.agents, a)
	a.Start()
	e.t.Cleanup(a.cleanup)
	return a
}

// configure sets the agent's URLs and command line, with TLS or without.
func (a *Agent) configure(secure bool) {
	e, ip, opts := a.env, a.ip, a.opts
	scheme := "http"
	if secure {
		scheme = "https"
	}
	a.ClientURL = fmt.Sprintf("%s://%s:%d", scheme, ip, 4001)
	a.QuarURL = fmt.Sprintf("%s://%s:%d", scheme, ip, 8001)
	a.PeerURL = fmt.Sprintf("%s://%s:%d", scheme, ip, 2380)
	store := e.StoreURL
	if opts.StoreURL != "" {
		store = opts.StoreURL
	}
	a.args = nil
	if !secure {
		a.args = append(a.args, "--insecure", "--etcd-insecure")
	}
	a.args = append(a.args, []string{
		"--cluster-name=test",
		"--backup-store=" + store,
		"--data-dir=" + a.DataDir,
		"--address=" + ip, "--etcd-address=" + ip,
		"--peer-port=8000",
		"--client-urls=" + a.ClientURL,
		"--quarantine-client-urls=" + a.QuarURL,
		"--peer-urls=" + a.PeerURL,
		"--etcd-bin-dir=" + e.BinDir,
		"--etcd-stop-timeout=10s",
	}...)
	if fw := opts.PeerFirewall; fw != nil {
		if err := fw.front(a.Name, fmt.Sprintf("%s:%d", ip, 2380), fmt.Sprintf("%s:%d", ip, 2381), false, a.EtcdPID); err != nil {
			e.t.Fatal(err)
		}
		if err := fw.front(a.Name, fmt.Sprintf("%s:%d", ip, 8000), fmt.Sprintf("%s:%d", ip, 8002), true, a.pidOrZero); err != nil {
			e.t.Fatal(err)
		}
		a.args = append(a.args, fmt.Sprintf("--listen-peer-urls=%s://%s:%d", scheme, ip, 2381),
			fmt.Sprintf("--peer-api-listen-address=%s:%d", ip, 8002))
	}
	if opts.Metrics {
		a.MetricsURL = fmt.Sprintf("http://%s:9100/metrics", ip)
		a.args = append(a.args, fmt.Sprintf("--metrics-address=%s:9100", ip))
	}
	if !opts.Defaults {
		a.args = append(a.args, "--loop-interval=300ms", "--leader-lease=2s")
	}
	a.args = append(a.args, opts.ExtraArgs...)
}

// Reconfigure changes a stopped agent's command line to run with TLS
// (secure) or without, as an operator switching a cluster would.
func (a *Agent) Reconfigure(secure bool) {
	a.env.t.Helper()
	if a.Running() {
		a.env.t.Fatalf("agent %s must be stopped to reconfigure it", a.Name)
	}
	a.configure(secure)
}

// SetExtraArgs replaces a stopped agent's extra arguments (AgentOptions'
// ExtraArgs), keeping the rest of its command line, as an operator
// changing a flag before a restart would.
func (a *Agent) SetExtraArgs(args ...string) {
	a.env.t.Helper()
	if a.Running() {
		a.env.t.Fatalf("agent %s must be stopped to change its flags", a.Name)
	}
	a.opts.ExtraArgs = args
	a.configure(strings.HasPrefix(a.PeerURL, "https://"))
}

// Start (re)starts the agent process with its original arguments.
func (a *Agent) Start() {
	t := a.env.t
	t.Helper()
	if a.Running() {
		t.Fatalf("agent %s is already running", a.Name)
	}
	if err := os.MkdirAll(filepath.Dir(a.LogPath), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(a.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "=== harness: starting agent %s\n", a.Name)
	cmd := exec.Command(a.env.AgentBin, a.args...)
	cmd.Env = append(a.env.environ(), testhook.ClockFileEnv+"="+a.clockFile())
	cmd.Stdout, cmd.Stderr = f, f
	// Should the test binary die before its cleanups run, the agent
	// stops, and stops its etcd.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	a.cmd, a.logFile = cmd, f
	a.waitDone = make(chan struct{})
	go func(done chan struct{}) {
		a.waitErr = cmd.Wait()
		close(done)
	}(a.waitDone)
}

// Running reports whether the agent process is alive.
func (a *Agent) Running() bool {
	if a.cmd == nil {
		return false
	}
	select {
	case <-a.waitDone:
		return false
	default:
		return true
	}
}

// PID is the agent's process ID.
func (a *Agent) PID() int { return a.cmd.Process.Pid }

// pidOrZero is the running agent's process ID, 0 when it is not running.
func (a *Agent) pidOrZero() int {
	if !a.Running() {
		return 0
	}
	return a.PID()
}

// Signal sends sig to the agent and waits up to timeout for it to exit.
func (a *Agent) Signal(sig syscall.Signal, timeout time.Duration) error {
	if !a.Running() {
		return nil
	}
	_ = a.cmd.Process.Signal(sig)
	select {
	case <-a.waitDone:
		a.logFile.Close()
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("agent %s did not exit within %s of %s", a.Name, timeout, sig)
	}
}

// clockFile holds the offset the agent's capture adds to its clock (see
// testhook.Clock).
func (a *Agent) clockFile() string { return filepath.Join(a.env.Root, a.Name+".clock") }

// SetClockOffset moves the clock of the agent's capture by d (0: back to
// the real clock) while it runs, within a tenth of a second.
func (a *Agent) SetClockOffset(d time.Duration) error {
	return os.WriteFile(a.clockFile(), []byte(d.String()), 0o644)
}

// Stop sends SIGTERM and waits for a clean exit.
func (a *Agent) Stop() {
	a.env.t.Helper()
	if err := a.Signal(syscall.SIGTERM, 30*time.Second); err != nil {
		a.env.t.Fatal(err)
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (a *Agent) Kill() {
	a.env.t.Helper()
	if err := a.Signal(syscall.SIGKILL, 10*time.Second); err != nil {
		a.env.t.Fatal(err)
	}
}

// NodeID is the agent's node ID, from its state file ("" before it wrote
// one).
func (a *Agent) NodeID() string {
	b, err := os.ReadFile(filepath.Join(a.DataDir, "state.json"))
	if err != nil {
		return ""
	}
	var st struct {
		NodeID string `json:"nodeId"`
	}
	if json.Unmarshal(b, &st) != nil {
		return ""
	}
	return st.NodeID
}

// Paused reports whether the agent process is stopped (SIGSTOP), as the
// pause test hooks leave it.
func (a *Agent) Paused() bool {
	if !a.Running() {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", a.PID()))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && (s[i+2] == 'T' || s[i+2] == 't')
}

// Pause stops the agent process with SIGSTOP; its etcd child runs on.
func (a *Agent) Pause() {
	a.env.t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		a.env.t.Fatal(err)
	}
	WaitFor(a.env.t, 10*time.Second, "agent "+a.Name+" to stop", a.Paused)
}

// Continue resumes a paused agent with SIGCONT.
func (a *Agent) Continue() {
	a.env.t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		a.env.t.Fatal(err)
	}
	WaitFor(a.env.t, 10*time.Second, "agent "+a.Name+" to run again", func() bool { return !a.Paused() })
}

// ExitErr is the agent's exit status once it has exited.
func (a *Agent) ExitErr() error { return a.waitErr }

func (a *Agent) cleanup() {
	if a.Running() {
		_ = a.Signal(syscall.SIGKILL, 10*time.Second)
	}
	// The parent-death signal should have taken etcd down with the agent;
	// make sure nothing outlives the test either way.
	if pid := a.EtcdPID(); pid > 0 && processAlive(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if dir := os.Getenv("ETCD_MANAGER_TEST_LOGS"); dir != "" && (a.env.t.Failed() || os.Getenv("ETCD_MANAGER_TEST_KEEP_LOGS") != "") {
		// Keep the whole log, etcd's lines included, for a post-mortem
		// (of every test with ETCD_MANAGER_TEST_KEEP_LOGS set).
		if b, err := os.ReadFile(a.LogPath); err == nil && os.MkdirAll(dir, 0o755) == nil {
			name := strings.NewReplacer("/", "_").Replace(a.env.t.Name()) + "-agent-" + a.Name + ".log"
			_ = os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
	}
	if a.env.t.Failed() {
		if b, err := os.ReadFile(a.LogPath); err == nil {
			// The agent's own lines; etcd's JSON lines would drown them.
			var own []string
			for _, line := range strings.Split(string(b), "\n") {
				if !strings.HasPrefix(line, "{") {
					own = append(own, line)
				}
			}
			a.env.t.Logf("--- log of agent %s, without etcd's lines (last 80):\n%s", a.Name, tail(strings.Join(own, "\n"), 80))
		}
	}
}

// EtcdPID is the pid of the agent's etcd child, from its pid file, or 0.
func (a *Agent) EtcdPID() int {
	b, err := os.ReadFile(filepath.Join(a.DataDir, "etcd.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// Log returns the agent's log so far.
func (a *Agent) Log() string {
	b, _ := os.ReadFile(a.LogPath)
	return string(b)
}

// WaitLog waits until the log holds substr at least n times.
func (a *Agent) WaitLog(substr string, n int, timeout time.Duration) {
	a.env.t.Helper()
	WaitFor(a.env.t, timeout, fmt.Sprintf("%d× %q in agent %s's log", n, substr, a.Name), func() bool {
		return strings.Count(a.Log(), substr) >= n
	})
}

// Client returns an etcd client for the agent's client URL.
func (a *Agent) Client() *clientv3.Client {
	a.env.t.Helper()
	c, err := a.dial()
	if err != nil {
		a.env.t.Fatal(err)
	}
	a.env.t.Cleanup(func() { c.Close() })
	return c
}

// dial opens an etcd client for the agent's client URL; the caller closes it.
func (a *Agent) dial() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL}, TLS: a.TLS(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// Leads reports whether the agent's etcd member is the raft leader; the
// test fails when etcd does not answer.
func (a *Agent) Leads() bool {
	a.env.t.Helper()
	leads, err := a.Leading()
	if err != nil {
		a.env.t.Fatalf("harness: status of agent %s's etcd: %v", a.Name, err)
	}
	return leads
}

// Leading reports whether the agent's etcd member is the raft leader, or
// why etcd did not answer: for waits across restarts, where a member may be
// briefly down.
func (a *Agent) Leading() (bool, error) {
	a.env.t.Helper()
	// A client of its own, closed after the call: a wait that asks many
	// times does not pile connections up until the test ends.
	c, err := a.dial()
	if err != nil {
		return false, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Status(ctx, a.ClientURL)
	if err != nil {
		return false, err
	}
	return st.Leader == st.Header.MemberId, nil
}

// WaitHealthy waits until the agent's etcd serves a linearizable read.
func (a *Agent) WaitHealthy(timeout time.Duration) {
	a.env.t.Helper()
	c := a.Client()
	WaitFor(a.env.t, timeout, "etcd of agent "+a.Name+" to serve", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Get(ctx, "health-probe")
		return err == nil
	})
}

// WaitFor polls cond every 100ms until it holds or timeout passes.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ProcessAlive reports whether pid is a live (not zombie) process.
func ProcessAlive(pid int) bool { return processAlive(pid) }

func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

// AgentPorts are the ports every agent uses on its own loopback address:
// client, quarantine, etcd peer and peer API, as in the walkthrough, and
// metrics.
var AgentPorts = []int{4001, 8001, 2380, 2381, 8000, 8002, 9100}

var ipCounter atomic.Int32

// AllocIP returns a loopback address (127.B.x.y) that no other agent of
// this test process uses and whose agent ports are free. Each agent having
// its own address means its fixed ports can never collide with an
// ephemeral port taken by some connection in the meantime, as ports picked
// at random on 127.0.0.1 can. B is derived from the process ID, so two
// test processes running at once use different addresses.
func AllocIP(t testing.TB) string {
	t.Helper()
	base := os.Getpid()%200 + 20
	for range 1000 {
		n := ipCounter.Add(1)
		ip := fmt.Sprintf("127.%d.%d.%d", base, n/250, n%250+1)
		if portsFree(ip, AgentPorts) {
			return ip
		}
	}
	t.Fatal("harness: no free loopback address")
	return ""
}

func portsFree(ip string, ports []int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(p)))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// StartAgents starts n agents named 1..n (after any already started).
func (e *Env) StartAgents(n int, opts AgentOptions) []*Agent {
	e.t.Helper()
	var out []*Agent
	base := len(e.agents)
	for i := range n {
		out = append(out, e.StartAgent(strconv.Itoa(base+i+1), opts))
	}
	return out
}

// ClusterState is the etcd cluster as seen through one healthy member.
type ClusterState struct {
	ClusterIDs map[uint64][]string // cluster ID -> agents whose etcd reports it
	Voters     []string            // started voting members' names
	Learners   int
	Unstarted  int
	Healthy    int // members that answer a status call
}

// Observe asks every agent's etcd for its status and one of them for the
// member list.
func Observe(agents []*Agent) ClusterState {
	cs := ClusterState{ClusterIDs: map[uint64][]string{}}
	var listFrom *clientv3.Client
	for _, a := range agents {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{a.ClientURL}, TLS: a.TLS(), DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := c.Status(ctx, a.ClientURL)
		cancel()
		if err != nil {
			c.Close()
			continue
		}
		cs.ClusterIDs[st.Header.ClusterId] = append(cs.ClusterIDs[st.Header.ClusterId], a.Name)
		if listFrom == nil {
			listFrom = c
		} else {
			c.Close()
		}
	}
	if listFrom == nil {
		return cs
	}
	defer listFrom.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := listFrom.MemberList(ctx)
	if err != nil {
		return cs
	}
	for _, m := range resp.Members {
		switch {
		case m.Name == "":
			cs.Unstarted++
		case m.IsLearner:
			cs.Learners++
		default:
			cs.Voters = append(cs.Voters, m.Name)
		}
		if len(m.ClientURLs) > 0 {
			sctx, scancel := context.WithTimeout(context.Background(), time.Second)
			if _, err := listFrom.Status(sctx, m.ClientURLs[0]); err == nil {
				cs.Healthy++
			}
			scancel()
		}
	}
	return cs
}

// Settled reports whether the cluster has exactly n healthy voting
// members, no learners, and a single cluster ID.
func (cs ClusterState) Settled(n int) bool {
	return len(cs.ClusterIDs) == 1 && len(cs.Voters) == n && cs.Learners == 0 && cs.Unstarted == 0 && cs.Healthy == n
}

// WaitSettled waits until the agents' cluster has exactly n healthy
// voters and one cluster ID, and returns that state.
func WaitSettled(t testing.TB, agents []*Agent, n int, timeout time.Duration) ClusterState {
	t.Helper()
	var cs ClusterState
	WaitFor(t, timeout, fmt.Sprintf("a settled cluster of %d members", n), func() bool {
		cs = Observe(agents)
		return cs.Settled(n)
	})
	return cs
}

// Endpoints returns the client URLs of the agents.
func Endpoints(agents []*Agent) []string {
	var out []string
	for _, a := range agents {
		out = append(out, a.ClientURL)
	}
	return out
}
