//go:build !windows

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// forwardedSignals are the signals `gantry lease run` passes on to its
// command.
var forwardedSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// newProcessGroup starts c in a process group of its own, so that its whole
// tree can be signalled and killed at once.
func newProcessGroup(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// signalTree sends s to c's process group.
func signalTree(c *exec.Cmd, s os.Signal) error {
	sig, ok := s.(syscall.Signal)
	if !ok {
		sig = syscall.SIGTERM
	}
	return syscall.Kill(-c.Process.Pid, sig)
}

// killTree kills c's whole process group.
func killTree(c *exec.Cmd) error {
	err := syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}

// exitStatus is the code a shell would report: the exit code, or 128+N
// for a process killed by signal N.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
