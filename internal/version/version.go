// Package version says which build of etcd-manager is running: the
// module version and the VCS revision Go records in every binary.
package version

import (
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
)

// Info is a build's version.
type Info struct {
	// Version is the module's version: a release tag, or "(devel)" for
	// a build from a checkout.
	Version string `json:"version"`
	// Revision and Time are the VCS commit built from and its time;
	// Modified says the checkout had changes not committed.
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	// GoVersion is the Go toolchain that built it.
	GoVersion string `json:"goVersion"`
}

// release, when set at link time (-ldflags "-X
// github.com/etcd-manager/etcd-manager/internal/version.release=v0.3.0"),
// is the version of a release built from a checkout, where Go records
// the module's version as "(devel)".
var release string

// Get is this binary's version, read once: the agent puts it in every
// cycle's Info.
var Get = sync.OnceValue(read)

func read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown"}
	}
	in := fromBuildInfo(bi)
	if release != "" {
		in.Version = release
	}
	return in
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if in.Version == "" {
		in.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// String is the version as --version prints it, as in
// "v0.3.0 (revision 0123456789ab, 2026-12-04T01:00:00Z) go1.26.8".
func (i Info) String() string {
	var extra []string
	if i.Revision != "" {
		r := "revision " + i.Revision[:min(12, len(i.Revision))]
		if i.Modified {
			r += ", modified"
		}
		extra = append(extra, r)
	}
	if i.Time != "" {
		extra = append(extra, i.Time)
	}
	s := i.Version
	if len(extra) > 0 {
		s += " (" + strings.Join(extra, ", ") + ")"
	}
	if i.GoVersion != "" {
		s += " " + i.GoVersion
	}
	return s
}

// Short is the version and the revision, for a label or a status line:
// "v0.3.0" or "(devel)@0123456789ab".
func (i Info) Short() string {
	if i.Revision == "" || !strings.HasPrefix(i.Version, "(") {
		return i.Version
	}
	s := fmt.Sprintf("%s@%s", i.Version, i.Revision[:min(12, len(i.Revision))])
	if i.Modified {
		s += "+modified"
	}
	return s
}
