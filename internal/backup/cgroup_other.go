//go:build !linux

package backup

import "errors"

// cgroupMargin: see cgroup_linux.go.
const cgroupMargin = 128 << 20

// memCgroup: only Linux has memory cgroups; a verify child's own bounds
// hold alone elsewhere.
type memCgroup struct{}

func newMemCgroup(int64) (*memCgroup, error) {
	return nil, errors.New("backup: memory cgroups are Linux's")
}
func (*memCgroup) add(int) error   { return nil }
func (*memCgroup) oomKilled() bool { return false }
func (*memCgroup) remove()         {}
