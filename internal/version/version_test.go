package version

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	tests := []struct {
		name          string
		bi            debug.BuildInfo
		string, short string
	}{
		{"a release", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.time", Value: "2026-12-04T01:00:00Z"}}},
			"v0.3.0 (revision 0123456789ab, 2026-12-04T01:00:00Z) go1.26.8", "v0.3.0"},
		{"a checkout with changes", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"}}},
			"(devel) (revision 0123456789ab, modified) go1.26.8", "(devel)@0123456789ab+modified"},
		{"no VCS", debug.BuildInfo{GoVersion: "go1.26.8"}, "(devel) go1.26.8", "(devel)"},
	}
	for _, tt := range tests {
		in := fromBuildInfo(&tt.bi)
		if in.String() != tt.string || in.Short() != tt.short {
			t.Errorf("%s: %q, %q; want %q, %q", tt.name, in.String(), in.Short(), tt.string, tt.short)
		}
	}
}
