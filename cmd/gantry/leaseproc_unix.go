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

// procTree is a started command and every process it starts: a process
// group of its own.
type procTree struct{ c *exec.Cmd }

// prepareTree makes c start in a process group of its own, so that its
// whole tree can be signalled and killed at once.
func prepareTree(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// startTree starts c (prepared by prepareTree).
func startTree(c *exec.Cmd) (*procTree, error) {
	if err := c.Start(); err != nil {
		return nil, err
	}
	return &procTree{c: c}, nil
}

// signal sends s to the process group.
func (t *procTree) signal(s os.Signal) error {
	sig, ok := s.(syscall.Signal)
	if !ok {
		sig = syscall.SIGTERM
	}
	return syscall.Kill(-t.c.Process.Pid, sig)
}

// kill kills the whole process group.
func (t *procTree) kill() error {
	err := syscall.Kill(-t.c.Process.Pid, syscall.SIGKILL)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}

// killLeftovers kills what is left of the process group after the command
// ended.
func (t *procTree) killLeftovers() error { return t.kill() }

// close releases what the tree holds; nothing on Unix.
func (t *procTree) close() {}

// exitStatus is the code a shell would report: the exit code, or 128+N
// for a process killed by signal N.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
