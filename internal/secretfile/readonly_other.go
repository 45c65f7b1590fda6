//go:build !linux

package secretfile

import "os"

// readOnly cannot tell a read-only mount here: a group-readable secret is
// refused.
func readOnly(*os.File) (bool, error) { return false, nil }
