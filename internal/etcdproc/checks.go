package etcdproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Corruption checks, and defragmentation. etcd can check that members agree at start (the
// initial check), every so often (the periodic check, which hashes the
// whole keyspace at one revision on every member), and after each
// compaction (the compact hash check, which is cheap). All three are off
// by default in etcd, and their flags differ between versions: 3.4 and
// 3.5 have experimental flags; 3.6 has feature gates and new names for
// the intervals (the experimental flags deprecated); 3.7 has only those.
// A member being defragmented stalls its clients; etcd 3.5's later
// patches and 3.6 can stop its gRPC service meanwhile, so that clients
// go to another member. The flags are read from the binary's own
// --help, so that a patch release without one is never started with it.

// Help is what a binary's --help offers: its flags, and the feature
// gates of --feature-gates.
type Help struct {
	Flags map[string]bool
	Gates map[string]bool
}

var (
	helpFlagRE = regexp.MustCompile(`(?m)^\s*--([a-z0-9][a-z0-9-]*)`)
	helpGateRE = regexp.MustCompile(`(?m)^\s*([A-Z][A-Za-z0-9]*)=true\|false`)
	helpCache  sync.Map // "<path>@<mtime>" -> Help
)

// ParseHelp reads etcd's --help output.
func ParseHelp(out []byte) Help {
	h := Help{Flags: map[string]bool{}, Gates: map[string]bool{}}
	for _, m := range helpFlagRE.FindAllSubmatch(out, -1) {
		h.Flags[string(m[1])] = true
	}
	for _, m := range helpGateRE.FindAllSubmatch(out, -1) {
		h.Gates[string(m[1])] = true
	}
	return h
}

// Help runs `etcd --help` once per binary (by path and modification
// time) and returns what it offers.
func (b Binaries) Help(ctx context.Context) (Help, error) {
	st, err := os.Stat(b.Etcd)
	if err != nil {
		return Help{}, fmt.Errorf("etcdproc: %w", err)
	}
	key := fmt.Sprintf("%s@%d", b.Etcd, st.ModTime().UnixNano())
	if h, ok := helpCache.Load(key); ok {
		return h.(Help), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// etcd prints its help and exits 0; some versions print it to stderr.
	cmd := exec.CommandContext(ctx, b.Etcd, "--help")
	cmd.Env = ChildEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return Help{}, fmt.Errorf("etcdproc: run %s --help: %w", b.Etcd, err)
	}
	h := ParseHelp(out)
	if len(h.Flags) == 0 {
		return Help{}, fmt.Errorf("etcdproc: %s --help lists no flags", b.Etcd)
	}
	helpCache.Store(key, h)
	return h, nil
}

// ManagedArgs are the flags etcd-manager always sets, in the form h
// offers: etcd's initial corruption check when initial is set, its
// compact hash check, its periodic check every periodic (0: not that
// one), and the stop of a member's gRPC service while it defragments, so
// that its clients fail over to another member instead of stalling.
func ManagedArgs(h Help, initial bool, periodic time.Duration) []string {
	var args, gates []string
	switch {
	case !initial:
	case h.Flags["feature-gates"] && h.Gates["InitialCorruptCheck"]:
		gates = append(gates, "InitialCorruptCheck=true")
	case h.Flags["experimental-initial-corrupt-check"]:
		args = append(args, "--experimental-initial-corrupt-check=true")
	}
	if h.Flags["feature-gates"] && h.Gates["CompactHashCheck"] {
		gates = append(gates, "CompactHashCheck=true")
	} else if h.Flags["experimental-compact-hash-check-enabled"] {
		args = append(args, "--experimental-compact-hash-check-enabled=true")
	}
	if h.Flags["feature-gates"] && h.Gates["StopGRPCServiceOnDefrag"] {
		gates = append(gates, "StopGRPCServiceOnDefrag=true")
	} else if h.Flags["experimental-stop-grpc-service-on-defrag"] {
		args = append(args, "--experimental-stop-grpc-service-on-defrag=true")
	}
	if len(gates) > 0 {
		args = append(args, "--feature-gates="+strings.Join(gates, ","))
	}
	if periodic > 0 {
		switch {
		case h.Flags["corrupt-check-time"]:
			args = append(args, "--corrupt-check-time="+periodic.String())
		case h.Flags["experimental-corrupt-check-time"]:
			args = append(args, "--experimental-corrupt-check-time="+periodic.String())
		}
	}
	return args
}
