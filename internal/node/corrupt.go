package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
)

// Corrupt data. etcd's initial corruption check (on by default, see
// etcdproc.ManagedArgs) compares a starting member's data with its peers'
// and refuses to start when they differ, saying "found data
// inconsistency with peers" (the words of every etcd from 3.4 to 3.7).
// Restarting it would only fail again. The node moves such data to its
// trash instead: the member then counts as having lost its data, and the
// leader removes it and adds this node back, to sync afresh from its
// healthy peers (never from a backup).

// corruptPhrase is what etcd prints when its initial check fails.
const corruptPhrase = "found data inconsistency with peers"

// outputScanner passes etcd's output through to out, and calls found
// once for each line holding corruptPhrase. Lines are bounded: a longer
// one is scanned in pieces.
type outputScanner struct {
	out   io.Writer
	found func(line string)
	mu    sync.Mutex
	buf   []byte
}

const maxScanLine = 64 << 10

func (s *outputScanner) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 && len(s.buf) < maxScanLine {
			break
		}
		if i < 0 {
			i = len(s.buf) - 1
		}
		line := s.buf[:i+1]
		if bytes.Contains(line, []byte(corruptPhrase)) {
			s.found(string(bytes.TrimSpace(line)))
		}
		s.buf = s.buf[i+1:]
	}
	s.buf = bytes.Clone(s.buf)
	s.mu.Unlock()
	return s.out.Write(p)
}

// etcdOutput is where the node's etcd writes: the agent's stderr, scanned
// for a failed corruption check.
func (n *Node) etcdOutput() io.Writer {
	return &outputScanner{out: os.Stderr, found: func(line string) {
		n.corrupt.Store(&line)
		n.poke()
	}}
}

// CorruptData reports etcd's refusal to start on data that differs from
// its peers', if it was seen since the data was last set aside.
func (n *Node) CorruptData() (string, bool) {
	if p := n.corrupt.Load(); p != nil {
		return *p, true
	}
	return "", false
}

// DiscardCorruptData stops etcd and moves the member's data to the trash,
// keeping the membership: the member then counts as having lost its data
// (see the leader's lost-data rule), and is rebuilt from its peers.
func (n *Node) DiscardCorruptData(ctx context.Context) error {
	line, ok := n.CorruptData()
	if !ok {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.state.Member
	if m == nil {
		n.corrupt.Store(nil)
		return nil
	}
	if err := n.proc.Stop(ctx); err != nil {
		return fmt.Errorf("node: stop etcd with corrupt data: %w", err)
	}
	trashed, err := n.layout.Trash(m.ClusterToken, n.now())
	if err != nil {
		return err
	}
	n.corrupt.Store(nil)
	n.refreshInfoMember()
	n.log.Error("etcd found its data differs from its peers' (its initial corruption check); the data is moved to the trash, and the leader rebuilds this member from its peers",
		"cluster-token", m.ClusterToken, "data-moved-to", trashed, "etcd-said", line)
	return nil
}
