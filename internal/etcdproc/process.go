package etcdproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Spec is everything needed to run one etcd member.
type Spec struct {
	Binaries Binaries
	// Name is etcd's --name (the node ID).
	Name    string
	DataDir string
	// ClientURLs are served and advertised unless Quarantined, in which
	// case QuarantineClientURLs are served instead, so clients cannot write.
	ClientURLs           []string
	QuarantineClientURLs []string
	Quarantined          bool
	// ListenClientURLs are bound instead of ClientURLs when set and not
	// Quarantined: a quarantined etcd binds its quarantine URLs only.
	ListenClientURLs []string
	PeerURLs         []string
	// ListenPeerURLs are bound instead of PeerURLs when set (etcd
	// advertises PeerURLs either way).
	ListenPeerURLs []string
	InitialCluster string
	NewCluster     bool
	ClusterToken   string
	// ForceNewCluster starts etcd with --force-new-cluster: it keeps its
	// data and drops every other member (quorum recovery).
	ForceNewCluster bool
	// SnapshotCount is etcd's --snapshot-count; 0 keeps etcd's default.
	SnapshotCount int
	// Checks are the flags etcd-manager always sets for this binary (see
	// ManagedArgs).
	Checks []string
	// Settings are the spec's etcd flags, checked for Binaries.Version:
	// they come after the flags above, and a snapshot-count among them
	// wins over SnapshotCount.
	Settings spec.Settings
	// TLS, when set, is the node certificate etcd serves clients and
	// peers with, and requires of them (https URLs).
	TLS *TLSFiles
	// PeerCertHostname, with TLS, is a name etcd requires of every peer
	// certificate, its peers' as clients and as servers alike
	// (--peer-cert-allowed-hostname, x509's hostname check on the SANs):
	// the node marker, so that only node certificates carry raft
	// traffic. Empty takes any certificate from the CA.
	PeerCertHostname string
	// RequireData refuses every start, the supervisor's restarts included,
	// unless DataDir holds etcd's data: set once etcd has run on it, so
	// that lost data is never met by a member with an empty log.
	RequireData bool
}

// ErrDataLost means etcd was not started because the data it has run on
// is gone.
var ErrDataLost = errors.New("etcdproc: etcd's data is gone")

// HasData reports whether dir holds etcd's member data.
func HasData(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, "member"))
	return err == nil && st.IsDir()
}

// TLSFiles are PEM files: the CA to trust, and a certificate and key;
// CRL, when set, is a revocation list in DER that etcd reads at each new
// connection on its client and peer ports, refusing the serials it
// lists. etcd refuses every connection while a CRL it is given does not
// read, so Args passes it only when the file is there.
type TLSFiles struct{ CA, Cert, Key, CRL string }

// ServedClientURL is the first client URL etcd serves: a quarantine URL
// while quarantined.
func (s Spec) ServedClientURL() string {
	if s.Quarantined {
		return s.QuarantineClientURLs[0]
	}
	return s.ClientURLs[0]
}

// Args renders etcd's command line (without the binary).
func (s Spec) Args() []string {
	client, listenClient := s.ClientURLs, s.ClientURLs
	if len(s.ListenClientURLs) > 0 {
		listenClient = s.ListenClientURLs
	}
	if s.Quarantined {
		client, listenClient = s.QuarantineClientURLs, s.QuarantineClientURLs
	}
	listenPeer := s.PeerURLs
	if len(s.ListenPeerURLs) > 0 {
		listenPeer = s.ListenPeerURLs
	}
	state := "existing"
	if s.NewCluster {
		state = "new"
	}
	args := []string{
		"--name=" + s.Name,
		"--data-dir=" + s.DataDir,
		"--listen-client-urls=" + strings.Join(listenClient, ","),
		"--advertise-client-urls=" + strings.Join(client, ","),
		"--listen-peer-urls=" + strings.Join(listenPeer, ","),
		"--initial-advertise-peer-urls=" + strings.Join(s.PeerURLs, ","),
		"--initial-cluster=" + s.InitialCluster,
		"--initial-cluster-state=" + state,
		"--initial-cluster-token=" + s.ClusterToken,
		"--strict-reconfig-check=true",
	}
	if s.ForceNewCluster {
		args = append(args, "--force-new-cluster")
	}
	if _, set := s.Settings["snapshot-count"]; s.SnapshotCount > 0 && !set {
		args = append(args, fmt.Sprintf("--snapshot-count=%d", s.SnapshotCount))
	}
	args = append(args, s.Checks...)
	args = append(args, s.Settings.Args()...)
	if t := s.TLS; t != nil {
		// etcd reads the files on every new connection, so a renewed
		// certificate is in use without a restart.
		args = append(args,
			"--cert-file="+t.Cert, "--key-file="+t.Key, "--trusted-ca-file="+t.CA, "--client-cert-auth=true",
			"--peer-cert-file="+t.Cert, "--peer-key-file="+t.Key, "--peer-trusted-ca-file="+t.CA, "--peer-client-cert-auth=true")
		if s.PeerCertHostname != "" {
			// One name: etcd 3.4 takes only one (3.5 and later, a list).
			args = append(args, "--peer-cert-allowed-hostname="+s.PeerCertHostname)
		}
		if t.CRL != "" {
			if _, err := os.Stat(t.CRL); err == nil {
				args = append(args, "--client-crl-file="+t.CRL, "--peer-crl-file="+t.CRL)
			}
		}
	}
	return args
}

// SupervisorConfig configures a Supervisor.
type SupervisorConfig struct {
	// PIDFile, if set, holds the running child's pid.
	PIDFile string
	// Output receives etcd's stdout and stderr.
	Output io.Writer
	// StopTimeout is how long a graceful stop waits before SIGKILL.
	StopTimeout time.Duration
	// MinBackoff and MaxBackoff bound the delay between restarts.
	MinBackoff, MaxBackoff time.Duration
	// StableAfter is how long etcd must run before the backoff resets.
	StableAfter time.Duration
	// AfterUncleanExit, if set, is called before etcd starts again on the
	// data it ran on (Spec.RequireData) after an unclean exit: etcd
	// exited by itself, was killed after StopTimeout, or left a pid file
	// behind (the agent or the machine died under it). An error refuses
	// the start, as a failed start.
	AfterUncleanExit func(ctx context.Context, spec Spec) error
}

func (c *SupervisorConfig) defaults() {
	if c.Output == nil {
		c.Output = os.Stderr
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 15 * time.Second
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = time.Second
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 30 * time.Second
	}
	if c.StableAfter == 0 {
		c.StableAfter = 30 * time.Second
	}
}

// Supervisor keeps one etcd child running: it restarts etcd with backoff
// when it exits, and stops it gracefully on request. The child gets
// SIGKILL if the agent dies (parent-death signal), so etcd never outlives
// the agent. Methods are safe for concurrent use.
type Supervisor struct {
	cfg SupervisorConfig
	log *slog.Logger

	mu     sync.Mutex
	spec   *Spec
	pid    int
	starts int
	stop   chan struct{} // closed to stop the current run loop
	done   chan struct{} // closed when the run loop has exited
	// exiting is the done of a stopped run loop that a Stop gave up
	// waiting for: no etcd starts before it has exited.
	exiting  chan struct{}
	lastErr  error
	dataLost bool
	// killedDir is the data dir of an etcd a stop had to kill: the next
	// start on it follows an unclean exit.
	killedDir string
	// grace is how long the current stop waits before SIGKILL.
	grace time.Duration
}

// NewSupervisor returns an idle supervisor.
func NewSupervisor(cfg SupervisorConfig, log *slog.Logger) *Supervisor {
	cfg.defaults()
	return &Supervisor{cfg: cfg, log: log}
}

// Status describes the supervised child.
type Status struct {
	// Wanted is true while the supervisor keeps etcd running.
	Wanted bool
	Spec   *Spec
	// PID is the running child's pid, or 0 between restarts.
	PID int
	// Starts counts how often etcd was started under this spec.
	Starts  int
	LastErr error
	// DataLost is set when the supervisor stopped restarting etcd because
	// the data it had run on is gone (see Spec.RequireData).
	DataLost bool
}

// Status returns a snapshot of the supervisor's state.
func (s *Supervisor) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{Wanted: s.spec != nil, Spec: s.spec, PID: s.pid, Starts: s.starts, LastErr: s.lastErr, DataLost: s.dataLost}
}

// Start begins supervising etcd with spec. It stops any etcd already
// supervised first. It returns once the first start was attempted; later
// exits are restarted in the background.
func (s *Supervisor) Start(ctx context.Context, spec Spec) error {
	if err := s.Stop(ctx); err != nil {
		return err
	}
	unclean := false
	if s.cfg.PIDFile != "" {
		if _, err := os.Stat(s.cfg.PIDFile); err == nil {
			unclean = true // no stop ever saw the last etcd exit
		}
	}
	killOrphan(s.cfg.PIDFile, spec.DataDir, s.log)
	s.mu.Lock()
	unclean = unclean || s.killedDir == spec.DataDir
	s.killedDir = ""
	s.spec = &spec
	s.starts = 0
	s.lastErr = nil
	s.dataLost = false
	s.stop = make(chan struct{})
	s.done = make(chan struct{})
	stop, done := s.stop, s.done
	s.mu.Unlock()

	started := make(chan error, 1)
	go s.loop(stop, done, started, unclean)
	select {
	case err := <-started:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop stops etcd gracefully (SIGTERM, then SIGKILL after StopTimeout)
// and waits for it to exit. Stopping an idle supervisor is a no-op. When
// ctx ends first, etcd still stops, and the next Start waits for it: two
// etcds never run on one data directory.
func (s *Supervisor) Stop(ctx context.Context) error {
	return s.StopWithin(ctx, s.cfg.StopTimeout)
}

// StopWithin is Stop with grace in place of StopTimeout (0 means
// StopTimeout): for an etcd whose cluster is being replaced, which need
// not wait for its clients' requests to drain (etcd waits up to its
// request timeout, seconds, for requests that a cluster without quorum
// never answers). A kill is safe for etcd's data, and the next start on
// the same data dir checks it.
func (s *Supervisor) StopWithin(ctx context.Context, grace time.Duration) error {
	s.mu.Lock()
	s.grace = grace
	stop, done := s.stop, s.done
	s.stop, s.done, s.spec = nil, nil, nil
	if done != nil {
		s.exiting = done
	}
	exiting := s.exiting
	s.mu.Unlock()
	if stop != nil {
		close(stop)
	}
	if exiting == nil {
		return nil
	}
	select {
	case <-exiting:
	default:
		select {
		case <-exiting:
		case <-ctx.Done():
			return fmt.Errorf("etcdproc: stop etcd: %w", ctx.Err())
		}
	}
	s.mu.Lock()
	if s.exiting == exiting {
		s.exiting = nil
	}
	s.mu.Unlock()
	return nil
}

// Update replaces the spec used by later restarts without restarting the
// running etcd. It is a no-op on an idle supervisor.
func (s *Supervisor) Update(spec Spec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spec != nil {
		s.spec = &spec
	}
}

func (s *Supervisor) loop(stop, done chan struct{}, started chan<- error, unclean bool) {
	defer close(done)
	backoff := s.cfg.MinBackoff
	first := true
	onStart := func(startErr error) {
		if first {
			started <- startErr
			first = false
		}
	}
	for {
		s.mu.Lock()
		if s.spec == nil {
			s.mu.Unlock()
			return
		}
		spec := *s.spec
		s.mu.Unlock()
		begin := time.Now()
		var err error
		if unclean {
			err = s.checkAfterUncleanExit(spec, stop)
			if err != nil {
				s.setErr(err)
				onStart(err)
			}
		}
		if err == nil {
			err = s.runOnce(spec, stop, onStart)
		}
		// etcd's exit by itself is an unclean one; a stop ends the loop.
		unclean = true
		select {
		case <-stop:
			return
		default:
		}
		if errors.Is(err, ErrDataLost) {
			// Never again on this spec: the node is told what to do.
			s.log.Error("etcd's data is gone; not starting etcd as the old member (the leader replaces it with a new one)",
				"data-dir", spec.DataDir)
			s.mu.Lock()
			if s.stop == stop { // not a newer run's spec
				s.spec, s.dataLost = nil, true
			}
			s.mu.Unlock()
			return
		}
		if time.Since(begin) >= s.cfg.StableAfter {
			backoff = s.cfg.MinBackoff
		}
		s.log.Warn("etcd exited; restarting after backoff", "error", err, "backoff", backoff, "ran-for", time.Since(begin).Round(time.Millisecond))
		select {
		case <-stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, s.cfg.MaxBackoff)
	}
}

// runOnce starts etcd and waits for it to exit or for stop. The goroutine
// is locked to its OS thread for the child's lifetime, because the kernel
// sends the parent-death signal when the thread that forked the child
// exits, not the process.
func (s *Supervisor) runOnce(spec Spec, stop <-chan struct{}, onStart func(error)) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	if spec.RequireData && !HasData(spec.DataDir) {
		err := fmt.Errorf("%w: %s has no member data", ErrDataLost, spec.DataDir)
		s.setErr(err)
		onStart(err)
		return err
	}
	cmd := exec.Command(spec.Binaries.Etcd, spec.Args()...)
	cmd.Env = ChildEnv()
	cmd.Stdout = s.cfg.Output
	cmd.Stderr = s.cfg.Output
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Pdeathsig: syscall.SIGKILL,
		// Its own process group: a Ctrl-C in the agent's terminal reaches
		// the agent only, which then stops etcd in order.
		Setpgid: true,
	}
	if err := cmd.Start(); err != nil {
		err = fmt.Errorf("etcdproc: start %s: %w", spec.Binaries.Etcd, err)
		s.setErr(err)
		onStart(err)
		return err
	}
	pid := cmd.Process.Pid
	s.mu.Lock()
	s.pid = pid
	s.starts++
	s.mu.Unlock()
	s.writePID(pid)
	s.log.Info("etcd started", "pid", pid, "version", spec.Binaries.Version.String(), "data-dir", spec.DataDir, "quarantined", spec.Quarantined)
	onStart(nil)

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-stop:
		err = s.terminate(cmd, exited, spec.DataDir)
	}
	s.mu.Lock()
	s.pid = 0
	s.mu.Unlock()
	s.removePID(pid)
	if err == nil {
		err = errors.New("etcd exited with status 0")
	}
	s.setErr(err)
	return err
}

// checkAfterUncleanExit runs the AfterUncleanExit hook for a start on
// data etcd ran on; stop cancels it.
func (s *Supervisor) checkAfterUncleanExit(spec Spec, stop <-chan struct{}) error {
	if s.cfg.AfterUncleanExit == nil || !spec.RequireData || !HasData(spec.DataDir) {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return s.cfg.AfterUncleanExit(ctx, spec)
}

func (s *Supervisor) terminate(cmd *exec.Cmd, exited <-chan error, dataDir string) error {
	pid := cmd.Process.Pid
	s.mu.Lock()
	grace := s.grace
	s.mu.Unlock()
	if grace <= 0 {
		grace = s.cfg.StopTimeout
	}
	s.log.Info("stopping etcd", "pid", pid)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		s.log.Info("etcd stopped", "pid", pid)
		return err
	case <-time.After(grace):
		s.log.Warn("etcd did not stop in time; killing it", "pid", pid, "timeout", grace)
		_ = cmd.Process.Kill()
		s.mu.Lock()
		s.killedDir = dataDir
		s.mu.Unlock()
		return <-exited
	}
}

func (s *Supervisor) setErr(err error) {
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
}

func (s *Supervisor) writePID(pid int) {
	if s.cfg.PIDFile == "" {
		return
	}
	if err := writeFileAtomic(s.cfg.PIDFile, []byte(strconv.Itoa(pid)+"\n")); err != nil {
		s.log.Warn("cannot write etcd pid file", "path", s.cfg.PIDFile, "error", err)
	}
}

func (s *Supervisor) removePID(pid int) {
	if s.cfg.PIDFile == "" {
		return
	}
	if data, err := os.ReadFile(s.cfg.PIDFile); err == nil && strings.TrimSpace(string(data)) == strconv.Itoa(pid) {
		_ = os.Remove(s.cfg.PIDFile)
	}
}

// killOrphan kills an etcd left running from an earlier agent if its pid
// file names a live process serving a data dir beside dataDir (the same
// node's data/ folder). The parent-death
// signal makes this rare, but a left-over etcd would hold the ports and
// the data.
func killOrphan(pidFile, dataDir string, log *slog.Logger) {
	if pidFile == "" {
		return
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 1 {
		return
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte("--data-dir="+filepath.Dir(dataDir)+string(filepath.Separator))) {
		return
	}
	log.Warn("killing etcd left over from an earlier agent", "pid", pid, "data-dir", dataDir)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 50; i++ {
		if syscall.Kill(pid, 0) != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = os.Remove(pidFile)
}
