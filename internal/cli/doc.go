// Package cli holds what the commands share at run time: the logger.
package cli
