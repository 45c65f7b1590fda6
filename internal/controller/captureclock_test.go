package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/wal"
)

// Capture stamps each revision with this agent's clock, so it refuses to
// capture while that clock is too far off a peer's or the store's.
func TestCaptureClockErr(t *testing.T) {
	tests := []struct {
		name    string
		offsets map[string]time.Duration
		store   time.Duration
		want    string
	}{
		{name: "clocks agree", offsets: map[string]time.Duration{"b": 200 * time.Millisecond, "c": -300 * time.Millisecond}, store: 1500 * time.Millisecond},
		{name: "a peer ahead", offsets: map[string]time.Duration{"b": 1500 * time.Millisecond}, want: "the clock of b is 1.5s off"},
		{name: "a peer behind", offsets: map[string]time.Duration{"c": -3 * time.Second}, want: "the clock of c is -3s off"},
		{name: "the store, to the second", store: 2500 * time.Millisecond, want: "the backup store's clock is 2.5s off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lp := &loop{Agent: &Agent{cfg: Config{Capture: wal.Config{MaxClockOffset: time.Second}}}, offsets: tt.offsets, storeOffset: tt.store}
			err := lp.captureClockErr()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("captureClockErr() = %v, want %q", err, tt.want)
			}
		})
	}
}
