package backup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// A verify child's hard memory bound. Where this process may make a
// memory cgroup beneath its own (root, with cgroup v1's memory
// controller, or cgroup v2 with the memory controller enabled for its
// children), each verify child runs in one of its own, limited to its
// ceiling and a margin: the kernel stops an allocation the child's own
// watch is too slow for, whatever its address space. Elsewhere the
// child's own bounds hold alone (see enforceCeiling).

// cgroupMargin is what a verify child's cgroup allows above its
// ceiling: the runtime, and the watch's slack. The file bbolt maps is
// page cache, which the kernel reclaims rather than count against it.
const cgroupMargin = 128 << 20

// memCgroup is a memory cgroup made for one verify child.
type memCgroup struct {
	dir string
	v2  bool
}

// cgroupSeq names the cgroups of one process apart.
var cgroupSeq atomic.Int64

// newMemCgroup makes a memory cgroup beneath this process's own, limited
// to limit bytes with no swap, or returns nil and why none can be made
// here.
func newMemCgroup(limit int64) (*memCgroup, error) {
	mount, own, v2, err := memoryHierarchy()
	if err != nil {
		return nil, err
	}
	parent := filepath.Join(mount, own)
	if _, err := os.Stat(parent); err != nil {
		// In a cgroup namespace, or a container that mounts only its
		// own part: the mount's root is this process's.
		parent = mount
	}
	removeStale(parent)
	dir := filepath.Join(parent, fmt.Sprintf("%s%d-%d", cgroupPrefix, os.Getpid(), cgroupSeq.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("backup: memory cgroup: %w", err)
	}
	c := &memCgroup{dir: dir, v2: v2}
	limitFile, swapFile := "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"
	if v2 {
		limitFile, swapFile = "memory.max", "memory.swap.max"
	}
	if err := c.write(limitFile, strconv.FormatInt(limit, 10)); err != nil {
		c.remove()
		return nil, err
	}
	swap := strconv.FormatInt(limit, 10) // v1 counts memory and swap together
	if v2 {
		swap = "0"
	}
	if _, err := os.Stat(filepath.Join(dir, swapFile)); err == nil {
		if err := c.write(swapFile, swap); err != nil {
			c.remove()
			return nil, err
		}
	}
	return c, nil
}

// cgroupPrefix starts the names of verify children's cgroups, before the
// agent's pid.
const cgroupPrefix = "etcd-manager-verify-"

// removeStale removes the cgroups of verify children whose agent is gone
// (killed while a check ran): the kernel refuses to remove one that
// still holds a process.
func removeStale(parent string) {
	dirs, _ := filepath.Glob(filepath.Join(parent, cgroupPrefix+"*"))
	for _, d := range dirs {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(d), cgroupPrefix), "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", n)); errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(d)
		}
	}
}

// memoryHierarchy finds the mount of the cgroup hierarchy that holds the
// memory controller, and this process's cgroup in it.
func memoryHierarchy() (mount, own string, v2 bool, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", false, fmt.Errorf("backup: memory cgroup: %w", err)
	}
	defer f.Close()
	var v2Mount string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ... - FSTYPE SOURCE SUPEROPTIONS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		switch tail[0] {
		case "cgroup":
			if hasOption(tail[2], "memory") {
				mount = fields[4]
			}
		case "cgroup2":
			v2Mount = fields[4]
		}
	}
	if mount == "" && v2Mount == "" {
		return "", "", false, errors.New("backup: memory cgroup: no cgroup hierarchy with the memory controller is mounted")
	}
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", "", false, fmt.Errorf("backup: memory cgroup: %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if mount != "" && hasOption(parts[1], "memory") {
			return mount, parts[2], false, nil
		}
		if mount == "" && parts[0] == "0" && parts[1] == "" {
			return v2Mount, parts[2], true, nil
		}
	}
	return "", "", false, errors.New("backup: memory cgroup: this process's cgroup is not in /proc/self/cgroup")
}

func hasOption(list, opt string) bool {
	for _, o := range strings.Split(list, ",") {
		if o == opt {
			return true
		}
	}
	return false
}

func (c *memCgroup) write(name, value string) error {
	if err := os.WriteFile(filepath.Join(c.dir, name), []byte(value), 0); err != nil {
		return fmt.Errorf("backup: memory cgroup: %w", err)
	}
	return nil
}

// add moves process pid into the cgroup.
func (c *memCgroup) add(pid int) error { return c.write("cgroup.procs", strconv.Itoa(pid)) }

// oomKilled reports whether the kernel killed a process of the cgroup
// for passing its limit.
func (c *memCgroup) oomKilled() bool {
	name := "memory.oom_control"
	if c.v2 {
		name = "memory.events"
	}
	data, err := os.ReadFile(filepath.Join(c.dir, name))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return err == nil && n > 0
		}
	}
	return false
}

// remove removes the cgroup, once its processes are gone: the kernel
// takes a moment to empty it after the last one exits.
func (c *memCgroup) remove() {
	for range 50 {
		if err := os.Remove(c.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
