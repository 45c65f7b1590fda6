package spec

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
)

// Version errors.
var (
	ErrInvalidVersion     = errors.New("spec: invalid etcd version")
	ErrV2Unsupported      = errors.New("spec: etcd v2 is not supported; run etcd 3.4 or later")
	ErrVersionUnsupported = errors.New("spec: etcd version is not supported")
)

// OldestSupportedMinor is the oldest etcd 3.x minor we can run (3.4 only as
// a source for migrations).
const OldestSupportedMinor = 4

// Version is an etcd release version: major.minor.patch with an optional
// pre-release suffix.
type Version struct {
	Major, Minor, Patch int
	Pre                 string
}

var versionRE = regexp.MustCompile(`^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?$`)

// ParseVersion parses "3.6.16", "v3.6.16" or "3.6.0-rc.1".
func ParseVersion(s string) (Version, error) {
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("%w %q: want MAJOR.MINOR.PATCH, such as 3.6.16", ErrInvalidVersion, s)
	}
	var v Version
	var err error
	for i, p := range []*int{&v.Major, &v.Minor, &v.Patch} {
		if *p, err = strconv.Atoi(m[i+1]); err != nil {
			return Version{}, fmt.Errorf("%w %q: %v", ErrInvalidVersion, s, err)
		}
	}
	v.Pre = m[4]
	return v, nil
}

// ParseSupportedVersion parses s and refuses versions this project cannot
// run: any 2.x, and 3.x older than 3.4.
func ParseSupportedVersion(s string) (Version, error) {
	v, err := ParseVersion(s)
	if err != nil {
		return v, err
	}
	switch {
	case v.Major == 2:
		return v, fmt.Errorf("%w (got %s)", ErrV2Unsupported, s)
	case v.Major != 3:
		return v, fmt.Errorf("%w: %s (only etcd 3.x is supported)", ErrVersionUnsupported, s)
	case v.Minor < OldestSupportedMinor:
		return v, fmt.Errorf("%w: %s (the oldest supported is 3.%d)", ErrVersionUnsupported, s, OldestSupportedMinor)
	}
	return v, nil
}

// String renders the version without a leading "v".
func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Pre != "" {
		s += "-" + v.Pre
	}
	return s
}

// Compare orders versions by major, minor and patch; a pre-release sorts
// before its release. It returns -1, 0 or +1.
func (v Version) Compare(o Version) int {
	for _, d := range [][2]int{{v.Major, o.Major}, {v.Minor, o.Minor}, {v.Patch, o.Patch}} {
		if d[0] != d[1] {
			if d[0] < d[1] {
				return -1
			}
			return 1
		}
	}
	switch {
	case v.Pre == o.Pre:
		return 0
	case v.Pre == "":
		return 1
	case o.Pre == "":
		return -1
	case v.Pre < o.Pre:
		return -1
	default:
		return 1
	}
}
