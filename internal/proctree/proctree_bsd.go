//go:build unix && !linux

package proctree

import "syscall"

// sysProcAttr makes the command lead a new process group. macOS and the
// BSDs have no parent-death signal here: a gantry killed with SIGKILL
// leaves the command running.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
