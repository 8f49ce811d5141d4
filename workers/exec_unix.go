//go:build unix

package workers

import (
	"errors"
	"os/exec"
	"syscall"
)

// prepare makes the command lead a new process group, so that the whole
// tree can be signalled, and asks the kernel to kill it if gantry dies
// (Linux).
func prepare(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(cmd.SysProcAttr)
}

type processGroup struct{ pgid int }

func track(cmd *exec.Cmd) (procTree, error) { return processGroup{pgid: cmd.Process.Pid}, nil }

func (g processGroup) signal(sig syscall.Signal) error {
	if err := syscall.Kill(-g.pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

func (g processGroup) terminate() error { return g.signal(syscall.SIGTERM) }
func (g processGroup) kill() error      { return g.signal(syscall.SIGKILL) }
func (g processGroup) release()         { _ = g.kill() }
