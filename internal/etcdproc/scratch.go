package etcdproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// A scratch etcd is a throwaway one-member etcd on loopback, run on data
// restored from a backup to check it (a restore drill). It is no member of
// any cluster, and dies with the agent.

// FreeLoopbackPorts returns n TCP ports free on 127.0.0.1 now. Another
// process may take one before it is used; the caller then fails and
// tries again later.
func FreeLoopbackPorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("etcdproc: find a free loopback port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// LoopbackURL is the URL of port on 127.0.0.1, https unless insecure.
func LoopbackURL(port int, insecure bool) string {
	scheme := "https"
	if insecure {
		scheme = "http"
	}
	return scheme + "://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// ErrScratchExited means a scratch etcd exited before it served.
var ErrScratchExited = errors.New("etcdproc: scratch etcd exited before it was ready")

// scratchNice is the scratch etcd's scheduling priority: below the live
// etcd's, whose node it shares.
const scratchNice = 10

// Scratch is a running scratch etcd.
type Scratch struct {
	cmd    *exec.Cmd
	exited chan error
	log    *os.File
}

// StartScratch starts etcd as spec says, with its output in logPath. The
// spec's data dir must hold restored data, and its URLs be on loopback.
func StartScratch(spec Spec, logPath string) (*Scratch, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("etcdproc: scratch etcd's log: %w", err)
	}
	s := &Scratch{exited: make(chan error, 1), log: logFile}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the thread that started etcd ends: hold it
		// while etcd runs.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command(spec.Binaries.Etcd, spec.Args()...)
		cmd.Env = ChildEnv()
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("etcdproc: start scratch etcd %s: %w", spec.Binaries.Etcd, err)
			return
		}
		s.cmd = cmd
		_ = syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, scratchNice)
		started <- nil
		s.exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		logFile.Close()
		return nil, err
	}
	return s, nil
}

// Stop stops etcd, by SIGTERM and after timeout by SIGKILL, and waits for
// it to exit.
func (s *Scratch) Stop(timeout time.Duration) {
	defer s.log.Close()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(timeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// WaitReady polls ready until it succeeds, etcd exits, or ctx ends.
func (s *Scratch) WaitReady(ctx context.Context, ready func(context.Context) error) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = ready(cctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case err := <-s.exited:
			s.exited <- err // for Stop
			if err == nil {
				err = errors.New("exit status 0")
			}
			return fmt.Errorf("%w: %w", ErrScratchExited, err)
		case <-ctx.Done():
			return fmt.Errorf("etcdproc: scratch etcd not ready: %w (last: %v)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// LogTail is the last lines of the scratch etcd's output, for an error.
func LogTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(data) > 64<<10 {
		data = data[len(data)-64<<10:]
	}
	return lastLines(string(data), 3)
}
