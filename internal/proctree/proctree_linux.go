//go:build linux

package proctree

import "syscall"

// sysProcAttr makes the command lead a new process group, and has the
// kernel SIGKILL it when gantry dies, even by SIGKILL. (The kernel sends the
// signal when the thread that started the command exits; Go keeps its
// threads unless a goroutine exits locked to one.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
