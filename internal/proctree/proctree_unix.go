//go:build unix

package proctree

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// groups holds each tree as the process group its command leads.
type groups struct{}

func (groups) prepare(cmd *exec.Cmd) (func(*os.Process) (holder, error), error) {
	cmd.SysProcAttr = groupAttr()
	return func(p *os.Process) (holder, error) {
		if p == nil {
			return nil, nil
		}
		return group(p.Pid), nil
	}, nil
}

// group is the process group a command leads: its id is the command's pid.
type group int

// signal sends sig to the process group; os.ErrProcessDone if it is empty.
func (g group) signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("signal %v: not a Unix signal", sig)
	}
	err := syscall.Kill(-int(g), s)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

func (g group) terminate() error { return g.signal(syscall.SIGTERM) }

func (g group) kill() error { return g.signal(syscall.SIGKILL) }

func (g group) release() error {
	if err := g.kill(); !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// checkProgram refuses a program that is not there or not executable, so
// that the error says so rather than blaming the fork.
func checkProgram(cmd *exec.Cmd) error {
	argv0 := name(cmd)
	if cmd.Err != nil {
		if errors.Is(cmd.Err, exec.ErrNotFound) {
			return startErrorf(ErrNotFound, "%s: not found in $PATH", argv0)
		}
		return cmd.Err
	}
	fi, err := os.Stat(programPath(cmd.Path, cmd.Dir))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return startErrorf(ErrNotFound, "%s: not found", argv0)
	case errors.Is(err, os.ErrPermission):
		return startErrorf(ErrNotExecutable, "%s: not executable (permission denied)", argv0)
	case err != nil:
		return fmt.Errorf("%s: %w", argv0, err)
	case fi.IsDir():
		return startErrorf(ErrNotExecutable, "%s: not executable (a directory)", argv0)
	case fi.Mode().Perm()&0o111 == 0:
		return startErrorf(ErrNotExecutable, "%s: not executable (no execute permission)", argv0)
	}
	return nil
}

// programPath is where the command's program is: a relative path is
// relative to the command's dir.
func programPath(path, dir string) string {
	if filepath.IsAbs(path) || dir == "" {
		return path
	}
	return filepath.Join(dir, path)
}

// startFailed says why exec of prog failed where the kernel's error tells
// (the program found executable a moment before), or returns err.
func startFailed(prog, argv0, dir string, err error) error {
	var pe *os.PathError
	if !errors.As(err, &pe) {
		return err
	}
	var errno syscall.Errno
	if !errors.As(pe.Err, &errno) {
		return err
	}
	switch errno {
	case syscall.ENOENT, syscall.ENOTDIR:
		if _, serr := os.Stat(programPath(prog, dir)); serr != nil {
			return startErrorf(ErrNotFound, "%s: not found", argv0)
		}
		// The program is there: its interpreter (#! line or ELF loader)
		// is not.
		return startErrorf(ErrNotExecutable, "%s: not executable (its interpreter was not found)", argv0)
	case syscall.EACCES, syscall.EPERM, syscall.ENOEXEC, syscall.EISDIR:
		return startErrorf(ErrNotExecutable, "%s: not executable (%v)", argv0, errno)
	}
	return err
}

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
