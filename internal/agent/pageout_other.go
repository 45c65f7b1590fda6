//go:build !linux

package agent

// releaseCodePages does nothing off Linux.
func releaseCodePages() (int64, error) { return 0, nil }
