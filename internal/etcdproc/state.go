package etcdproc

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// ErrDataDirLocked means another agent is using the same --data-dir.
var ErrDataDirLocked = errors.New("etcdproc: data dir is in use by another etcd-manager")

// State is what a node keeps under --data-dir across restarts. It is
// written atomically (temp file, fsync, rename).
type State struct {
	// Format is the state file's format: 0 before HasRun was recorded, 1
	// since.
	Format int `json:"format,omitempty"`
	// NodeID names this node; it is also the etcd member name.
	NodeID string `json:"nodeId"`
	// Member is set while this node is (or is becoming) an etcd member.
	Member *MemberState `json:"member,omitempty"`
	// ObeyedTerm is the highest fencing term of a procedure call this
	// node has obeyed; calls of older terms are refused.
	ObeyedTerm int64 `json:"obeyedTerm,omitempty"`
	// Hold keeps etcd stopped for a procedure's driver (see
	// peer.FenceRequest.Hold), across restarts of the agent.
	Hold *Hold `json:"hold,omitempty"`
}

// Hold is a driver's hold on a node's etcd: etcd is not started while it
// lasts, unless the driver itself forces it (recover-quorum's survivor).
type Hold struct {
	Term  int64     `json:"term"`
	Until time.Time `json:"until"`
}

// Holds says whether h keeps etcd stopped at now.
func (h *Hold) Holds(now time.Time) bool { return h != nil && now.Before(h.Until) }

// MemberState describes the etcd member this node runs.
type MemberState struct {
	ClusterToken string `json:"clusterToken"`
	EtcdVersion  string `json:"etcdVersion"`
	// InitialCluster is etcd's --initial-cluster: name=peerURL,...
	InitialCluster string `json:"initialCluster"`
	// NewCluster selects --initial-cluster-state=new; otherwise existing.
	NewCluster bool `json:"newCluster"`
	// HasRun is set once etcd has written this member's data: from then on
	// etcd is never started as this member on an empty data dir (it would
	// rejoin with an empty log, or panic); lost data means a new member.
	HasRun bool `json:"hasRun,omitempty"`
	// Quarantined makes etcd serve clients on the quarantine URLs only.
	Quarantined bool `json:"quarantined,omitempty"`
	// V2Until is a raft index up to which this member's log may hold the
	// v2 entries etcd 3.5 writes; set when it moves from 3.5 to 3.6, whose
	// successors cannot replay them. A raft snapshot past it clears them.
	V2Until uint64 `json:"v2Until,omitempty"`
	// ForceNewCluster restarts etcd with --force-new-cluster, once, to
	// recover quorum from this member's data alone.
	ForceNewCluster bool `json:"forceNewCluster,omitempty"`
	// PeerURLs are the peer URLs this member is registered with, which
	// its etcd serves: the agent's --peer-urls, except while a switch to
	// new ones (http to https, say) waits for the leader to register them.
	PeerURLs []string `json:"peerURLs,omitempty"`
	// Pending is set from the moment this node decides to create a cluster
	// until the store's creation marker confirms it was the one to do so.
	Pending bool `json:"pending,omitempty"`
	// Settings are the spec's etcd flags this member's etcd runs with, as
	// the leader last set them (see spec.Settings).
	Settings map[string]string `json:"settings,omitempty"`
	// Since is when this membership began (a join, a creation, a
	// restore): data in the trash from before it is superseded.
	Since time.Time `json:"since,omitzero"`
	// PeerCertHostname is the name this member's etcd requires of peer
	// certificates (the node marker), as the leader last set it; empty
	// while it takes any certificate from the CA. Older agents ignore
	// it: their etcd takes any.
	PeerCertHostname string `json:"peerCertHostname,omitempty"`
}

// Layout is the folder structure under --data-dir:
//
//	state.json           State
//	data/<cluster token>/ etcd's data dir, one per cluster token
//	trash/<token>-<time>/ data moved aside, never deleted
//	etcd.pid             pid of the running etcd child
type Layout struct{ Root string }

func (l Layout) statePath() string { return filepath.Join(l.Root, "state.json") }

// PIDFile is where the running etcd child's pid is kept.
func (l Layout) PIDFile() string { return filepath.Join(l.Root, "etcd.pid") }

// EtcdDataDir is etcd's --data-dir for the cluster with this token. A
// token that could name a folder outside data/ is an error.
func (l Layout) EtcdDataDir(token string) (string, error) {
	if err := spec.CheckClusterToken("the data dir's cluster token", token); err != nil {
		return "", fmt.Errorf("etcdproc: %w", err)
	}
	return filepath.Join(l.Root, "data", token), nil
}

// HasEtcdData reports whether etcd has written its member folder for the
// cluster with this token; never, for a token of the wrong form.
func (l Layout) HasEtcdData(token string) bool {
	dir, err := l.EtcdDataDir(token)
	return err == nil && HasData(dir)
}

// SnapIndex is the raft index of etcd's newest raft snapshot file
// (member/snap/<term>-<index>.snap), or 0 when it has none.
func (l Layout) SnapIndex(token string) uint64 {
	dir, err := l.EtcdDataDir(token)
	if err != nil {
		return 0
	}
	entries, err := os.ReadDir(filepath.Join(dir, "member", "snap"))
	if err != nil {
		return 0
	}
	var best uint64
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".snap")
		if !ok {
			continue
		}
		_, idx, ok := strings.Cut(name, "-")
		if !ok {
			continue
		}
		if v, err := strconv.ParseUint(idx, 16, 64); err == nil && v > best {
			best = v
		}
	}
	return best
}

// Lock takes an exclusive lock on the data dir, so that two agents never
// share it. The lock is released when the process exits or unlock is called.
func (l Layout) Lock() (unlock func(), err error) {
	if err := os.MkdirAll(l.Root, 0o700); err != nil {
		return nil, fmt.Errorf("etcdproc: create data dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(l.Root, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("etcdproc: open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrDataDirLocked, l.Root)
		}
		return nil, fmt.Errorf("etcdproc: lock data dir %s: %w", l.Root, err)
	}
	return func() { f.Close() }, nil
}

// StateFormat is the format of the state file this version writes.
const StateFormat = 1

// LoadState reads the node's state, creating a node ID on first use:
// name when it is set (a StatefulSet pod's name), else a random one. A
// state from before HasRun was recorded counts every member that is past
// its creation as having run: the safe side, since a member that never
// ran is only removed and added again.
func (l Layout) LoadState(name string) (State, error) {
	data, err := os.ReadFile(l.statePath())
	if errors.Is(err, os.ErrNotExist) {
		id := name
		if id == "" {
			if id, err = newNodeID(); err != nil {
				return State{}, err
			}
		}
		st := State{Format: StateFormat, NodeID: id}
		return st, l.SaveState(st)
	}
	if err != nil {
		return State{}, fmt.Errorf("etcdproc: read state: %w", err)
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return State{}, fmt.Errorf("etcdproc: state file %s is corrupt (%v); move it aside to start this node afresh", l.statePath(), err)
	}
	if st.NodeID == "" {
		return State{}, fmt.Errorf("etcdproc: state file %s has no node ID", l.statePath())
	}
	if m := st.Member; m != nil {
		if err := spec.CheckClusterToken("its member's cluster token", m.ClusterToken); err != nil {
			return State{}, fmt.Errorf("etcdproc: state file %s: %w; move it aside to start this node afresh", l.statePath(), err)
		}
	}
	if st.Format < StateFormat {
		if m := st.Member; m != nil && !m.NewCluster && !m.Pending {
			mm := *m
			mm.HasRun = true
			if mm.Since.IsZero() {
				// Whatever is in the trash was moved there before now.
				mm.Since = time.Now().UTC()
			}
			st.Member = &mm
		}
		st.Format = StateFormat
		if err := l.SaveState(st); err != nil {
			return State{}, err
		}
	}
	return st, nil
}

// SaveState replaces the state file atomically and durably.
func (l Layout) SaveState(st State) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("etcdproc: encode state: %w", err)
	}
	return writeFileAtomic(l.statePath(), append(data, '\n'))
}

// Trash moves the etcd data of the cluster with this token into
// trash/<token>-<time>. Data is never deleted. A missing folder is not an
// error.
func (l Layout) Trash(token string, now time.Time) (string, error) {
	src, err := l.EtcdDataDir(token)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	dst := filepath.Join(l.Root, "trash", fmt.Sprintf("%s-%s", token, now.UTC().Format(trashTimeLayout)))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return "", fmt.Errorf("etcdproc: create trash: %w", err)
	}
	if err := os.Rename(src, dst); err != nil {
		return "", fmt.Errorf("etcdproc: move %s to trash: %w", src, err)
	}
	return dst, syncDir(filepath.Dir(src))
}

func newNodeID() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("etcdproc: node id: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("etcdproc: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("etcdproc: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("etcdproc: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("etcdproc: sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("etcdproc: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("etcdproc: %w", err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("etcdproc: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("etcdproc: sync %s: %w", dir, err)
	}
	return nil
}

// FreeBytes is the space an unprivileged writer may still use on the
// file system that holds dir.
func FreeBytes(dir string) (int64, error) {
	free, _, err := DiskSpace(dir)
	return free, err
}

// DiskSpace is the space an unprivileged writer may still use on the
// file system that holds dir, and that file system's size.
func DiskSpace(dir string) (free, total int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("etcdproc: free space of %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), int64(st.Blocks) * int64(st.Bsize), nil
}
