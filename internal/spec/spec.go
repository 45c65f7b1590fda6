package spec

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// MaxMemberCount is the largest member count configure-cluster sets
// unless forced. etcd advises 3 or 5 members, 7 at most: every write
// waits for a majority of them, and the leader sends each one every
// entry, so a member more slows writes and tolerates no more failures
// than the even count below it does. The agents run a forced larger
// count, with a warning.
const MaxMemberCount = 9

// Errors returned by validation. Each carries the "spec:" prefix.
var (
	ErrInvalidMemberCount = errors.New("spec: member count must be at least 1")
	ErrMissingVersion     = errors.New("spec: etcd version is required")
	// ErrTooManyMembers is configure-cluster's refusal of a member count
	// above MaxMemberCount that is not forced.
	ErrTooManyMembers = fmt.Errorf("spec: member count is above %d", MaxMemberCount)
)

// ClusterSpec is the desired state of the cluster, kept at
// control/etcd-cluster-spec in the backup store.
type ClusterSpec struct {
	MemberCount int32  `json:"memberCount"`
	EtcdVersion string `json:"etcdVersion"`
	// AllowDumpRestore is our addition: it lets the leader reach
	// EtcdVersion by dump and restore (a new cluster made from a backup,
	// with clients cut off meanwhile) when no rolling change can, such as
	// 3.5 to 3.4. configure-cluster sets it only with the version it was
	// given for.
	AllowDumpRestore bool `json:"allowDumpRestore,omitempty"`
	// OrdinalMembers is our addition, set by the Kubernetes operator: the
	// nodes are a StatefulSet's pods, named <set>-<ordinal>. Only the
	// nodes of ordinals below MemberCount are members, and shrinking
	// removes the highest ordinal first, whatever its health, after
	// moving leadership off it. The StatefulSet shrinks only after.
	OrdinalMembers bool `json:"ordinalMembers,omitempty"`
	// AutoCompactionMode and AutoCompactionRetention are our addition:
	// the compaction policy, in the terms of etcd's flags of the same
	// names (see ParseCompaction). The agent carries it out itself, not
	// etcd, so that compaction keeps behind continuous capture. Unset:
	// periodic, keeping DefaultCompactionRetention.
	AutoCompactionMode      string `json:"autoCompactionMode,omitempty"`
	AutoCompactionRetention string `json:"autoCompactionRetention,omitempty"`
	// EtcdSettings is our addition: etcd flags set on every member (see
	// Settings), rolled out one member at a time when they change.
	EtcdSettings Settings `json:"etcdSettings,omitempty"`
	// Defrag is our addition: when the leader defragments members on its
	// own; nil takes the defaults (see DefragPolicy).
	Defrag *DefragPolicy `json:"defrag,omitempty"`
}

// QuotaBytes is the backend quota the members run with: the
// quota-backend-bytes setting, else etcd's default.
func (s ClusterSpec) QuotaBytes() int64 { return s.EtcdSettings.QuotaBytes() }

// QuotaBytes is the backend quota these settings give etcd: the
// quota-backend-bytes setting, else etcd's default.
func (s Settings) QuotaBytes() int64 {
	if q, err := strconv.ParseInt(s["quota-backend-bytes"], 10, 64); err == nil && q > 0 {
		return q
	}
	return DefaultQuotaBytes
}

// String renders the spec for logs and the CLI.
func (s ClusterSpec) String() string {
	out := fmt.Sprintf("memberCount=%d etcdVersion=%s", s.MemberCount, s.EtcdVersion)
	if s.AllowDumpRestore {
		out += " allowDumpRestore=true"
	}
	if s.OrdinalMembers {
		out += " ordinalMembers=true"
	}
	if s.AutoCompactionMode != "" {
		out += " autoCompactionMode=" + s.AutoCompactionMode
	}
	if s.AutoCompactionRetention != "" {
		out += " autoCompactionRetention=" + s.AutoCompactionRetention
	}
	if len(s.EtcdSettings) > 0 {
		out += " etcdSettings=[" + s.EtcdSettings.String() + "]"
	}
	if s.Defrag != nil {
		out += " defrag=[" + s.Defrag.String() + "]"
	}
	return out
}

// Validate checks the spec. It returns warnings for settings that are
// allowed but unwise (an even member count), and an error for settings that
// cannot work.
func (s ClusterSpec) Validate() (warnings []string, err error) {
	if s.MemberCount < 1 {
		return nil, fmt.Errorf("%w (got %d)", ErrInvalidMemberCount, s.MemberCount)
	}
	if s.EtcdVersion == "" {
		return nil, ErrMissingVersion
	}
	v, err := ParseSupportedVersion(s.EtcdVersion)
	if err != nil {
		return nil, err
	}
	if err := s.EtcdSettings.Validate(v); err != nil {
		return nil, err
	}
	if s.Defrag != nil {
		if err := s.Defrag.Validate(); err != nil {
			return nil, err
		}
	}
	policy, err := s.Compaction()
	if err != nil {
		return nil, err
	}
	if w := compactionWarning(policy); w != "" {
		warnings = append(warnings, w)
	}
	if s.MemberCount > MaxMemberCount {
		warnings = append(warnings, fmt.Sprintf(
			"a member count of %d is above %d: every write waits for a majority of the members, so each one more slows writes; etcd advises 3 or 5 members, 7 at most",
			s.MemberCount, MaxMemberCount))
	}
	if s.MemberCount%2 == 0 {
		warnings = append(warnings, fmt.Sprintf(
			"an even member count (%d) tolerates no more failures than %d members; an odd count is recommended",
			s.MemberCount, s.MemberCount-1))
	}
	return warnings, nil
}

// Ordinal is the StatefulSet ordinal at the end of a node name such as
// etcd-10 (10), compared as a number; ok is false for other names.
func Ordinal(name string) (n int, ok bool) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 || i == len(name)-1 || len(name)-i > 7 {
		return 0, false
	}
	n, err := strconv.Atoi(name[i+1:])
	if err != nil || n < 0 || (name[i+1] == '0' && i+2 != len(name)) {
		return 0, false
	}
	return n, true
}

// ClusterCreated is the marker kept at control/etcd-cluster-created. Once it
// exists, no agent may create a new empty cluster: total loss of the members
// needs an explicit restore.
type ClusterCreated struct {
	Timestamp Int64 `json:"timestamp"`
	// ClusterToken is our addition: the token of the cluster whose creation
	// wrote the marker, so an agent that crashed mid-creation can tell its
	// own marker from another agent's.
	ClusterToken string `json:"clusterToken,omitempty"`
}

// Int64 is an int64 that reads from a JSON number or a JSON string (the
// protobuf JSON mapping writes int64 as a string) and writes a string.
type Int64 int64

// MarshalJSON writes the value as a JSON string, as the protobuf JSON
// mapping does for int64.
func (i Int64) MarshalJSON() ([]byte, error) {
	return json.Marshal(strconv.FormatInt(int64(i), 10))
}

// UnmarshalJSON accepts 123, "123" and null.
func (i *Int64) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	s := string(b)
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("spec: int64 value %s: %w", b, err)
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("spec: int64 value %s is not an integer", b)
	}
	*i = Int64(v)
	return nil
}

// DecodeClusterSpec parses the JSON of control/etcd-cluster-spec. Unknown
// fields are ignored so newer writers stay readable.
func DecodeClusterSpec(data []byte) (ClusterSpec, error) {
	var s ClusterSpec
	if len(bytes.TrimSpace(data)) == 0 {
		return s, errors.New("spec: cluster spec is empty")
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("spec: cluster spec is not valid JSON: %w", err)
	}
	return s, nil
}

// DecodeClusterCreated parses the JSON of control/etcd-cluster-created.
func DecodeClusterCreated(data []byte) (ClusterCreated, error) {
	var c ClusterCreated
	if len(bytes.TrimSpace(data)) == 0 {
		// An empty marker still marks the cluster as created.
		return c, nil
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("spec: cluster-created marker is not valid JSON: %w", err)
	}
	return c, nil
}

// clusterTokenRE is the form of a cluster token: what NewClusterToken
// makes, and kops's names.
var clusterTokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidClusterToken reports whether t has the form of a cluster token,
// safe as a file name and a store key.
func ValidClusterToken(t string) bool { return clusterTokenRE.MatchString(t) }

// CheckClusterToken returns an error naming what (say "the restore's
// token") unless t has the form of a cluster token. A token becomes a
// folder name on every node (data/<token>, trash/<token>-<time>): one
// read from the store or a peer is checked before any path is built.
func CheckClusterToken(what, t string) error {
	if ValidClusterToken(t) {
		return nil
	}
	return fmt.Errorf("%w: %s %s is not a cluster token (1 to 64 of A-Z, a-z, 0-9, _ and -)", ErrInvalidToken, what, QuoteShort(t))
}

// MaxTerm is the largest fencing term an agent takes or obeys. At one
// term a second, a cluster would need 30,000 years to reach it: a term
// above it read from the store is junk, and cannot push the terms to
// where they would overflow.
const MaxTerm = 1 << 40

// ErrInvalidToken is the error of a cluster token of the wrong form.
var ErrInvalidToken = errors.New("spec: invalid cluster token")

// QuoteShort quotes s for a message, escaping control characters, and
// cuts it to its first 80 bytes: s may come from anyone who can write
// to the store.
func QuoteShort(s string) string {
	const max = 80
	if len(s) <= max {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:max]) + fmt.Sprintf("... (%d bytes)", len(s))
}

// NewClusterToken returns a fresh, random cluster token: etcd's
// --initial-cluster-token, and the name of a cluster's data dir on every
// node.
func NewClusterToken() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("spec: cluster token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
