package spec

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Settings are etcd flags the spec sets on every member, by etcd's own
// flag names (without the dashes) to their values in etcd's own syntax.
// Only the flags in SettingNames may be set; each is checked against the
// etcd version the members run. A flag not set keeps etcd's default.
type Settings map[string]string

// setting is one etcd flag the spec may carry.
type setting struct {
	name string
	// check validates a value.
	check func(string) error
	// since is the oldest etcd that has the flag.
	since Version
	help  string
}

var (
	v3_4 = Version{Major: 3, Minor: 4}
	v3_6 = Version{Major: 3, Minor: 6}
)

// maxQuota is the largest backend quota accepted: etcd warns above 8 GiB
// and its own hard limit is 100 GiB.
const maxQuota = 100 << 30

// settings is the allow-list, in the order they are shown.
var settings = []setting{
	{name: "quota-backend-bytes", check: intIn(0, maxQuota), since: v3_4,
		help: "the backend's size quota in bytes; writes fail with NOSPACE beyond it (0: etcd's default, 2 GiB)"},
	{name: "snapshot-count", check: intIn(1, 1<<40), since: v3_4,
		help: "committed raft entries between snapshots"},
	{name: "heartbeat-interval", check: intIn(1, 10_000), since: v3_4,
		help: "raft heartbeat interval in milliseconds"},
	{name: "election-timeout", check: intIn(1, 50_000), since: v3_4,
		help: "raft election timeout in milliseconds; at least 5 times the heartbeat interval"},
	{name: "max-request-bytes", check: intIn(1, 1<<31-1), since: v3_4,
		help: "the largest request a client may send, in bytes"},
	{name: "max-concurrent-streams", check: intIn(1, 1<<32-1), since: v3_4,
		help: "the most concurrent gRPC streams one client connection may open"},
	{name: "max-txn-ops", check: intIn(1, 1<<31-1), since: v3_4,
		help: "the most operations one transaction may hold"},
	{name: "grpc-keepalive-min-time", check: duration, since: v3_4,
		help: "the shortest interval a client may send keepalive pings at"},
	{name: "grpc-keepalive-interval", check: duration, since: v3_4,
		help: "how often etcd pings an idle client connection"},
	{name: "grpc-keepalive-timeout", check: duration, since: v3_4,
		help: "how long etcd waits for a ping's answer before it closes the connection"},
	{name: "backend-batch-interval", check: duration, since: v3_4,
		help: "the longest time before a backend transaction is committed"},
	{name: "backend-batch-limit", check: intIn(1, 1<<31-1), since: v3_4,
		help: "the most operations before a backend transaction is committed"},
	{name: "warning-apply-duration", check: duration, since: v3_6,
		help: "apply time beyond which etcd logs a warning (etcd 3.6 and later)"},
}

// SettingNames are the flags the spec may set, in the order shown.
func SettingNames() []string {
	out := make([]string, len(settings))
	for i, s := range settings {
		out[i] = s.name
	}
	return out
}

// SettingsFor are the flags the spec may set for etcd v.
func SettingsFor(v Version) []string {
	var out []string
	for _, s := range settings {
		if v.Compare(s.since) >= 0 {
			out = append(out, s.name)
		}
	}
	return out
}

// SettingHelp is the help text of a setting's flag.
func SettingHelp(name string) string {
	for _, s := range settings {
		if s.name == name {
			return "etcd's --" + name + ": " + s.help + " (rolled out one member at a time; empty: etcd's default)"
		}
	}
	return ""
}

func lookupSetting(name string) (setting, bool) {
	for _, s := range settings {
		if s.name == name {
			return s, true
		}
	}
	return setting{}, false
}

func intIn(lo, hi int64) func(string) error {
	return func(v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return errors.New("want a whole number")
		}
		if n < lo || n > hi {
			return fmt.Errorf("want %d to %d", lo, hi)
		}
		return nil
	}
}

func duration(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("want a duration such as 2h or 30s")
	}
	if d < 0 || d > 24*time.Hour {
		return errors.New("want 0 to 24h")
	}
	return nil
}

// ErrSetting means a setting is not allowed, malformed, or unknown to
// the etcd version.
var ErrSetting = errors.New("spec: etcd setting refused")

// maxSettingValue bounds a value read from the store or a peer.
const maxSettingValue = 64

// Validate checks every setting for etcd version v.
func (s Settings) Validate(v Version) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(s)) {
		if err := (Settings{name: s[name]}).validateOne(v); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	hb, el := int64(100), int64(1000) // etcd's defaults
	if x, ok := s["heartbeat-interval"]; ok {
		hb, _ = strconv.ParseInt(x, 10, 64)
	}
	if x, ok := s["election-timeout"]; ok {
		el, _ = strconv.ParseInt(x, 10, 64)
	}
	if el < 5*hb {
		return fmt.Errorf("%w: --election-timeout (%dms) must be at least 5 times --heartbeat-interval (%dms), as etcd requires", ErrSetting, el, hb)
	}
	return nil
}

// validateOne checks a single setting.
func (s Settings) validateOne(v Version) error {
	for name, val := range s {
		def, ok := lookupSetting(name)
		switch {
		case !ok:
			return fmt.Errorf("%w: %q is not an etcd flag etcd-manager sets (allowed: %s)", ErrSetting, name, strings.Join(SettingNames(), ", "))
		case len(val) > maxSettingValue:
			return fmt.Errorf("%w: --%s: a value of %d bytes", ErrSetting, name, len(val))
		case v.Compare(def.since) < 0:
			return fmt.Errorf("%w: --%s is unknown to etcd %s", ErrSetting, name, v)
		}
		if err := def.check(val); err != nil {
			return fmt.Errorf("%w: --%s=%q: %w", ErrSetting, name, val, err)
		}
	}
	return nil
}

// Equal reports whether two sets of settings are the same; nil and empty
// are.
func (s Settings) Equal(o Settings) bool { return maps.Equal(s, o) }

// Clone copies the settings; nil stays nil.
func (s Settings) Clone() Settings { return maps.Clone(s) }

// Args renders the settings as etcd flags, sorted by name.
func (s Settings) Args() []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(s)) {
		out = append(out, "--"+name+"="+s[name])
	}
	return out
}

// String renders the settings for logs and the CLI: name=value, sorted.
func (s Settings) String() string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(s)) {
		out = append(out, name+"="+s[name])
	}
	return strings.Join(out, " ")
}

// Usable returns the settings etcd v accepts, and the names of those it
// does not: a member keeps the settings it was given when it moves to
// another version, and must not fail to start on one the new version
// dropped or rejects.
func (s Settings) Usable(v Version) (Settings, []string) {
	var out Settings
	var dropped []string
	for _, name := range slices.Sorted(maps.Keys(s)) {
		if err := (Settings{name: s[name]}).validateOne(v); err != nil {
			dropped = append(dropped, name)
			continue
		}
		if out == nil {
			out = Settings{}
		}
		out[name] = s[name]
	}
	return out, dropped
}
