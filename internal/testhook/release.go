//go:build !testhooks

package testhook

import (
	"log/slog"
	"time"
)

// Enabled is set in binaries built with the testhooks tag.
const Enabled = false

// Here does nothing in a release binary.
func Here(*slog.Logger, string) {}

// Pause does nothing in a release binary.
func Pause(*slog.Logger, string) {}

// Offset is 0 in a release binary.
func Offset() time.Duration { return 0 }

// Clock returns now itself in a release binary.
func Clock(now func() time.Time) func() time.Time { return now }
