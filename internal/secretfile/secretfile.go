package secretfile

import (
	"fmt"
	"os"
	"syscall"
)

// Check says why the open file f, named path, is not kept private, or
// nil when it is. A file is private when:
//   - it is a regular file, owned by the agent's user, that neither group
//     nor others may access (0600 or 0400); or
//   - it is owned by root and readable by a group the agent's user is in,
//     writable by no one, readable by no other, on a read-only file
//     system: a Secret volume's file under the pod's fsGroup (mode 0440).
//
// Anything wider is refused, with the fix in the message.
func Check(f *os.File, path string) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	perm := st.Mode().Perm()
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		// No owner to check: the mode alone.
		if perm&0o077 != 0 {
			return wide(path, perm)
		}
		return nil
	}
	uid := uint32(os.Geteuid())
	switch {
	case sys.Uid == uid && perm&0o077 == 0:
		return nil
	case sys.Uid == 0 && perm&0o237 == 0 && perm&0o040 != 0 && inGroup(sys.Gid):
		ro, err := readOnly(f)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if ro {
			return nil
		}
		return fmt.Errorf("%s has mode %04o and group %d on a writable file system: a group-readable secret is taken only from a read-only mount (a Kubernetes Secret volume); otherwise make it the agent's own and private (chown it to uid %d, chmod 600 %s)",
			path, perm, sys.Gid, uid, path)
	case sys.Uid != uid && perm&0o077 == 0:
		return fmt.Errorf("%s is owned by uid %d, not the agent's user (uid %d), and private to it: chown it to uid %d", path, sys.Uid, uid, uid)
	}
	return wide(path, perm)
}

func wide(path string, perm os.FileMode) error {
	return fmt.Errorf("%s has mode %04o: group or others may access it, and it holds a secret key; make it private (chmod 600 %s), or mount it from a Kubernetes Secret with defaultMode 0440 under the pod's fsGroup",
		path, perm, path)
}

// inGroup says whether the agent's process is in group gid.
func inGroup(gid uint32) bool {
	if uint32(os.Getegid()) == gid {
		return true
	}
	groups, err := os.Getgroups()
	if err != nil {
		return false
	}
	for _, g := range groups {
		if uint32(g) == gid {
			return true
		}
	}
	return false
}
