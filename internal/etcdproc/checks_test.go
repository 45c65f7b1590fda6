package etcdproc

import (
	"reflect"
	"testing"
	"time"
)

// The forms of the corruption-check and defrag flags, from the help of etcd 3.4,
// 3.5, 3.6 and 3.7 (abridged to the lines that matter).
func TestManagedArgs(t *testing.T) {
	const (
		help34 = `  --experimental-initial-corrupt-check 'false'
    Enable to check data corruption before serving any client/peer traffic.
  --experimental-corrupt-check-time '0s'
    Duration of time between cluster corruption check passes.
`
		help35 = help34 + `  --experimental-compact-hash-check-enabled 'false'
    Enable leader to periodically check followers compaction hashes.
  --experimental-stop-grpc-service-on-defrag 'false'
    Enable etcd gRPC service to stop serving client requests on defragmentation.
`
		gates = `  --feature-gates ''
    A set of key=value pairs that describe server level feature gates for alpha/experimental features. Options are:
    AllAlpha=true|false (ALPHA - default=false)
    CompactHashCheck=true|false (ALPHA - default=false)
    InitialCorruptCheck=true|false (ALPHA - default=false)
    StopGRPCServiceOnDefrag=true|false (ALPHA - default=false)
`
		help36 = help35 + gates + `  --corrupt-check-time '0s'
    Duration of time between cluster corruption check passes.
`
		help37 = gates + `  --corrupt-check-time '0s'
  --compact-hash-check-time '1m'
`
	)
	tests := []struct {
		name     string
		help     string
		periodic time.Duration
		want     []string
	}{
		{"3.4", help34, time.Hour, []string{"--experimental-initial-corrupt-check=true", "--experimental-corrupt-check-time=1h0m0s"}},
		{"3.5", help35, time.Hour, []string{"--experimental-initial-corrupt-check=true", "--experimental-compact-hash-check-enabled=true", "--experimental-stop-grpc-service-on-defrag=true", "--experimental-corrupt-check-time=1h0m0s"}},
		{"3.6: feature gates, not the deprecated flags", help36, time.Hour, []string{"--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true,StopGRPCServiceOnDefrag=true", "--corrupt-check-time=1h0m0s"}},
		{"3.7", help37, 10 * time.Minute, []string{"--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true,StopGRPCServiceOnDefrag=true", "--corrupt-check-time=10m0s"}},
		{"no periodic check", help37, 0, []string{"--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true,StopGRPCServiceOnDefrag=true"}},
		{"a binary with none of them", "  --name 'default'\n", time.Hour, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ManagedArgs(ParseHelp([]byte(tt.help)), true, tt.periodic); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
	// Without the initial check (no peer serves to compare with).
	if got, want := ManagedArgs(ParseHelp([]byte(help36)), false, 0), []string{"--feature-gates=CompactHashCheck=true,StopGRPCServiceOnDefrag=true"}; !reflect.DeepEqual(got, want) {
		t.Errorf("3.6 without the initial check: got %q, want %q", got, want)
	}
	if got, want := ManagedArgs(ParseHelp([]byte(help34)), false, 0), []string(nil); !reflect.DeepEqual(got, want) {
		t.Errorf("3.4 without the initial check: got %q, want %q", got, want)
	}
}
