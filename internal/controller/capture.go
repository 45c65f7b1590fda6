package controller

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// syncCapture starts capture while this agent leads a serving cluster,
// and stops it otherwise or when the cluster changes.
func (lp *loop) syncCapture(obs plan.Observed) {
	want := obs.Cluster != nil && obs.Self.Member != nil && !obs.Self.Member.Quarantined && lp.clientEndpoint != ""
	if err := lp.captureClockErr(); want && err != nil {
		// A revision's time is this agent's clock: one far off would put
		// --to-time's boundaries in the wrong place.
		want = false
		if msg := err.Error(); msg != lp.clockRefused {
			lp.clockRefused = msg
			lp.log.Error("capture refused: this agent's clock is too far off; fix the clocks (NTP)", "error", err)
		}
	} else if err == nil && lp.clockRefused != "" {
		lp.clockRefused = ""
		lp.log.Info("capture may go on: the clocks agree again")
	}
	token := ""
	if want {
		token = obs.Cluster.Token
	}
	lp.capture.Follow(want, token, []string{lp.clientEndpoint}, lp.etcdTLS, obs.BackupDue)
}

// captureClockErr says why this agent's clock is too far off its peers'
// or the store's for it to capture, or nil.
func (lp *loop) captureClockErr() error {
	limit := lp.cfg.Capture.MaxClockOffset
	if limit <= 0 {
		return nil
	}
	// Stores keep modification times to the second.
	if off, storeLimit := lp.storeOffset, limit+time.Second; off > storeLimit || off < -storeLimit {
		return fmt.Errorf("controller: the backup store's clock is %s off this agent's, more than %s (--capture-max-clock-offset and a second)", off.Round(time.Millisecond), storeLimit)
	}
	// Off most peers: this agent's clock is the one that is wrong. One
	// peer off among agreeing ones is that peer's problem, not ours.
	var off []string
	for _, id := range slices.Sorted(maps.Keys(lp.offsets)) {
		if d := lp.offsets[id]; d > limit || d < -limit {
			off = append(off, fmt.Sprintf("%s by %s", id, d.Round(time.Millisecond)))
		}
	}
	if 2*len(off) > len(lp.offsets) {
		return fmt.Errorf("controller: this agent's clock is off the clocks of %s (of %d peers), more than --capture-max-clock-offset=%s",
			strings.Join(off, ", "), len(lp.offsets), limit)
	}
	return nil
}
