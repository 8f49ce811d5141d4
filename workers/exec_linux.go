//go:build linux

package workers

import "syscall"

// setParentDeathSignal has the kernel SIGKILL the task's process when the
// worker dies, even by SIGKILL.
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
