package lease

import (
	"strings"
	"testing"
	"time"
)

// Capture stamps each revision with this agent's clock, so it refuses to
// capture while that clock is too far off a peer's or the store's.
func TestCheckClocks(t *testing.T) {
	tests := []struct {
		name    string
		offsets map[string]time.Duration
		store   time.Duration
		want    string
	}{
		{name: "clocks agree", offsets: map[string]time.Duration{"b": 200 * time.Millisecond, "c": -300 * time.Millisecond}, store: 1500 * time.Millisecond},
		{name: "the only peer ahead", offsets: map[string]time.Duration{"b": 1500 * time.Millisecond}, want: "off the clocks of b by 1.5s (of 1 peers)"},
		{name: "both peers behind", offsets: map[string]time.Duration{"b": -3 * time.Second, "c": -2 * time.Second}, want: "off the clocks of b by -3s, c by -2s (of 2 peers)"},
		{name: "one peer of two off: the peer is wrong", offsets: map[string]time.Duration{"b": 50 * time.Millisecond, "c": -3 * time.Second}},
		{name: "two peers of four off: this agent agrees with the majority", offsets: map[string]time.Duration{"b": 0, "c": 0, "d": 5 * time.Second, "e": 5 * time.Second}},
		{name: "three peers of four off", offsets: map[string]time.Duration{"b": 0, "c": 2 * time.Second, "d": 5 * time.Second, "e": 5 * time.Second}, want: "off the clocks of c by 2s, d by 5s, e by 5s (of 4 peers)"},
		{name: "the store, to the second", store: 2500 * time.Millisecond, want: "the backup store's clock is 2.5s off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckClocks(tt.offsets, tt.store, time.Second)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("CheckClocks = %v, want %q", err, tt.want)
			}
		})
	}
}
