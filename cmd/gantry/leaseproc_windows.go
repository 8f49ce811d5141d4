//go:build windows

package main

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// forwardedSignals are the signals `gantry lease run` passes on to its
// command.
var forwardedSignals = []os.Signal{os.Interrupt}

// createNewProcessGroup is CREATE_NEW_PROCESS_GROUP: the command gets a
// console process group of its own, which CTRL_BREAK can address.
const createNewProcessGroup = 0x00000200

// ctrlBreakEvent is CTRL_BREAK_EVENT.
const ctrlBreakEvent = 1

// newProcessGroup starts c in a process group of its own.
func newProcessGroup(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{CreationFlags: createNewProcessGroup}
}

// signalTree sends CTRL_BREAK to c's process group, the console's nearest
// thing to SIGINT for a group.
func signalTree(c *exec.Cmd, _ os.Signal) error {
	proc := syscall.NewLazyDLL("kernel32.dll").NewProc("GenerateConsoleCtrlEvent")
	r, _, err := proc.Call(ctrlBreakEvent, uintptr(c.Process.Pid))
	if r == 0 {
		return err
	}
	return nil
}

// killTree kills c and every process it started (taskkill /T /F).
func killTree(c *exec.Cmd) error {
	if err := exec.Command("taskkill", "/T", "/F", "/PID", strconv.Itoa(c.Process.Pid)).Run(); err != nil {
		return c.Process.Kill()
	}
	return nil
}

// exitStatus returns the process's exit code.
func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }
