//go:build unix

package proctree

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// sysTree is the process group the command leads.
type sysTree struct{ pgid int }

// track returns the tree of a process started with sysProcAttr: its group.
func track(p *os.Process) (sysTree, error) { return sysTree{pgid: p.Pid}, nil }

// signal sends sig to the process group; os.ErrProcessDone if it is empty.
func (g sysTree) signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("signal %v: not a Unix signal", sig)
	}
	err := syscall.Kill(-g.pgid, s)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

func (g sysTree) terminate() error { return g.signal(syscall.SIGTERM) }

func (g sysTree) kill() error { return g.signal(syscall.SIGKILL) }

// release frees what the tree holds: nothing on Unix.
func (g sysTree) release() {}

// killedBy returns the signal that killed the process, if one did.
func killedBy(ps *os.ProcessState) (int, bool) {
	if ps == nil {
		return 0, false
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return int(ws.Signal()), true
	}
	return 0, false
}

// brokenPipe reports whether err is the write to a pipe nobody reads.
func brokenPipe(err error) bool { return errors.Is(err, syscall.EPIPE) }

func interrupts() []os.Signal { return []os.Signal{os.Interrupt, syscall.SIGTERM} }
