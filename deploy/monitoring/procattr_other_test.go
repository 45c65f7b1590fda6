//go:build !linux

package monitoring_test

import "syscall"

func agentProcAttr() *syscall.SysProcAttr { return nil }
