package controller

import (
	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/plan"
)

// syncCapture starts capture while this agent leads a serving cluster,
// and stops it otherwise or when the cluster changes.
func (lp *loop) syncCapture(obs plan.Observed) {
	want := obs.Cluster != nil && obs.Self.Member != nil && !obs.Self.Member.Quarantined && lp.clientEndpoint != ""
	if err := lease.CheckClocks(lp.offsets, lp.storeOffset, lp.cfg.Capture.MaxClockOffset); want && err != nil {
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
	lp.capture.Follow(want, token, []string{lp.clientEndpoint}, lp.env.EtcdTLS, obs.BackupDue)
}
