//go:build !linux

package store

import "os"

// writeback returns f: progressive writeback is a Linux hint.
func writeback(f *os.File) plainWriter { return plainWriter{f} }

type plainWriter struct{ *os.File }

func (plainWriter) release() {}
