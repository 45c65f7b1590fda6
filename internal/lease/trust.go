package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/store"
)

// Leader election rests on two things no agent can see for itself: that
// the store honours create-if-absent (one object created twice fails the
// second time), and that the agents' clocks agree to well within the
// lease. An agent checks the first once, and measures the second every
// cycle; it does not take the store lock while either fails.

// ErrUntrustedStore means the store did not honour create-if-absent.
var ErrUntrustedStore = errors.New("lease: the backup store does not honour create-if-absent; leader election by the store lock is unsafe on it, so this agent never takes the lock")

// createOnceStore is the part of the store the check needs.
type createOnceStore interface {
	Create(ctx context.Context, key string, data []byte) error
	Delete(ctx context.Context, key string) error
}

// probePrefix holds the objects of the create-if-absent check.
const probePrefix = "control/probe/"

// CheckCreateOnce creates one object twice: the second create must fail
// with store.ErrExists. It returns ErrUntrustedStore when it does not,
// and other errors (an unreachable store) to be retried.
func CheckCreateOnce(ctx context.Context, s createOnceStore, nodeID string) error {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	key := probePrefix + nodeID + "-" + hex.EncodeToString(b)
	if err := s.Create(ctx, key, []byte("create-if-absent check\n")); err != nil {
		return fmt.Errorf("lease: check create-if-absent: %w", err)
	}
	defer func() { _ = s.Delete(context.WithoutCancel(ctx), key) }()
	err := s.Create(ctx, key, []byte("second create\n"))
	switch {
	case errors.Is(err, store.ErrExists):
		return nil
	case err == nil:
		return fmt.Errorf("%w (a second create of %s succeeded)", ErrUntrustedStore, key)
	default:
		return fmt.Errorf("lease: check create-if-absent: %w", err)
	}
}

// MaxClockOffset is the largest clock offset between agents at which the
// store lock may still be taken: a fifth of the lease, well inside the
// margin the lease keeps (see Fence).
func MaxClockOffset(leaseTTL time.Duration) time.Duration { return leaseTTL / 5 }

// ClockOffset estimates a peer's clock offset from one call: its clock
// read in the middle of the round trip [sent, received], against ours,
// which is off by at most half the round trip. A round trip longer than
// maxRTT (a peer paused, then resumed; a slow link) bounds the offset too
// loosely either way, so it is no sample: ok is false, and the caller
// keeps its last good one. A peer that reports no clock has no offset.
func ClockOffset(peerNow, sent, received time.Time, maxRTT time.Duration) (off time.Duration, ok bool) {
	rtt := received.Sub(sent)
	switch {
	case peerNow.IsZero():
		return 0, true
	case rtt > maxRTT:
		return 0, false
	}
	return peerNow.Sub(sent.Add(rtt / 2)), true
}

// NoLeaderSettle is how long a member must have seen no raft leader for
// that to count as lost quorum, not an election (which takes etcd about a
// second): a quarter of the lease, at least 3 s.
func NoLeaderSettle(lease time.Duration) time.Duration { return max(3*time.Second, lease/4) }

// CheckClocks says why this agent's clock is too far off its peers' or
// the store's for it to stamp revisions with (continuous capture), or
// nil: peers holds the offset measured to each peer by node ID, store the
// one to the store's clock, and limit the most either may be off (0: no
// check).
func CheckClocks(peers map[string]time.Duration, store, limit time.Duration) error {
	if limit <= 0 {
		return nil
	}
	// Stores keep modification times to the second.
	if off, storeLimit := store, limit+time.Second; off > storeLimit || off < -storeLimit {
		return fmt.Errorf("lease: the backup store's clock is %s off this agent's, more than %s (--capture-max-clock-offset and a second)", off.Round(time.Millisecond), storeLimit)
	}
	// Off most peers: this agent's clock is the one that is wrong. One
	// peer off among agreeing ones is that peer's problem, not ours.
	var off []string
	for _, id := range slices.Sorted(maps.Keys(peers)) {
		if d := peers[id]; d > limit || d < -limit {
			off = append(off, fmt.Sprintf("%s by %s", id, d.Round(time.Millisecond)))
		}
	}
	if 2*len(off) > len(peers) {
		return fmt.Errorf("lease: this agent's clock is off the clocks of %s (of %d peers), more than --capture-max-clock-offset=%s",
			strings.Join(off, ", "), len(peers), limit)
	}
	return nil
}
