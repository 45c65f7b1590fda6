package monitoring_test

import "syscall"

// agentProcAttr kills the agent (and with it its etcd) if the test
// binary dies first, a timeout say.
func agentProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
