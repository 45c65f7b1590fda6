package controller

// The agent's binary is large (its cloud store SDKs alone bring hundreds
// of packages), and starting it runs every package's initialisation once:
// that touches code and read-only data all over the binary, which then
// stays mapped, resident and counted in the agent's RSS, though nothing
// runs it again. A busy spell of the loop (start-up, a backup, a restore)
// does the same on a smaller scale. After such a spell, once the loop has
// been quiet for quietCyclesBeforeRelease cycles, the agent asks the kernel
// to page out its binary's read-only mappings (Env.ReleasePages, which package agent implements): the pages
// are clean copies of the file, so nothing is lost, and those the idle loop
// still uses come back on their next use. Writable mappings (the binary's
// data, the heap) are never touched.

// quietCyclesBeforeRelease is how many quiet cycles in a row (no action
// performed, nothing due within moments) end a busy spell.
const quietCyclesBeforeRelease = 3

// spell follows the loop's busy spells: busy(true) for a cycle that acted
// or waits on something due soon, busy(false) for a quiet one. It reports
// true once per spell, on the quietCyclesBeforeRelease-th quiet cycle
// after it. It starts busy: start-up is a spell.
type spell struct {
	quiet int
	done  bool
}

func (s *spell) cycle(busy bool) (ended bool) {
	if busy {
		s.quiet, s.done = 0, false
		return false
	}
	if s.done {
		return false
	}
	s.quiet++
	if s.quiet < quietCyclesBeforeRelease {
		return false
	}
	s.done = true
	return true
}
