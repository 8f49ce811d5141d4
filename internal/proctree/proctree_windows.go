//go:build windows

package proctree

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"
)

// newContainer holds trees in Job Objects: the only containment here.
func newContainer(want Containment, _ string) (Containment, container, error) {
	if want != Auto && want != Group {
		return "", nil, fmt.Errorf("%s containment: Linux only", want)
	}
	return Group, jobs{}, nil
}

// jobs holds each tree in a Job Object.
type jobs struct{}

// prepare gives the command a console process group of its own, which
// CTRL_BREAK can address.
func (jobs) prepare(cmd *exec.Cmd) (func(*os.Process) (holder, error), error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP}
	return func(p *os.Process) (holder, error) {
		if p == nil {
			return nil, nil
		}
		return track(p)
	}, nil
}

// job is a Job Object holding the command and every process it starts;
// closing its last handle, also when gantry dies, kills them all.
type job struct {
	job   windows.Handle
	group uint32 // the console process group: the command's pid
}

// track puts the started process in a new Job Object with kill-on-close.
func track(p *os.Process) (job, error) {
	h, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return job{}, fmt.Errorf("create job object: %w", err)
	}
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{
		BasicLimitInformation: windows.JOBOBJECT_BASIC_LIMIT_INFORMATION{
			LimitFlags: windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
		},
	}
	if _, err := windows.SetInformationJobObject(h, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		_ = windows.CloseHandle(h)
		return job{}, fmt.Errorf("set job object limits: %w", err)
	}
	ph, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(p.Pid))
	if err != nil {
		_ = windows.CloseHandle(h)
		return job{}, fmt.Errorf("open process %d: %w", p.Pid, err)
	}
	defer windows.CloseHandle(ph)
	if err := windows.AssignProcessToJobObject(h, ph); err != nil {
		_ = windows.CloseHandle(h)
		return job{}, fmt.Errorf("assign process %d to job object: %w", p.Pid, err)
	}
	return job{job: h, group: uint32(p.Pid)}, nil
}

// signal sends CTRL_BREAK for os.Interrupt and kills the job for os.Kill:
// Windows has no other signals for a tree.
func (j job) signal(sig os.Signal) error {
	switch sig {
	case os.Interrupt:
		return j.ctrlBreak()
	case os.Kill:
		return j.kill()
	}
	return fmt.Errorf("signal %v: Windows can send a process tree only os.Interrupt and os.Kill", sig)
}

// ctrlBreak sends CTRL_BREAK to the command's console process group, the
// console's nearest thing to a signal for a group (a Go program receives it
// as os.Interrupt).
func (j job) ctrlBreak() error {
	if err := windows.GenerateConsoleCtrlEvent(windows.CTRL_BREAK_EVENT, j.group); err != nil {
		return fmt.Errorf("send CTRL_BREAK to process group %d: %w", j.group, err)
	}
	return nil
}

// terminate sends CTRL_BREAK, or kills the job when it cannot be sent (the
// command has no console shared with gantry).
func (j job) terminate() error {
	if j.ctrlBreak() != nil {
		return j.kill()
	}
	return nil
}

// kill terminates every process in the job.
func (j job) kill() error {
	if err := windows.TerminateJobObject(j.job, 1); err != nil {
		return fmt.Errorf("terminate job object: %w", err)
	}
	return nil
}

// release kills what is left in the job and closes its handle.
func (j job) release() error {
	err := j.kill()
	_ = windows.CloseHandle(j.job)
	return err
}

// killedBy reports no signal: Windows has none that ends a process.
func killedBy(*os.ProcessState) (int, bool) { return 0, false }

// brokenPipe reports whether err is the write to a pipe nobody reads.
func brokenPipe(err error) bool {
	return errors.Is(err, windows.ERROR_BROKEN_PIPE) || errors.Is(err, windows.ERROR_NO_DATA)
}

func interrupts() []os.Signal { return []os.Signal{os.Interrupt} }

// checkProgram refuses a program exec.Command did not find. A path is
// left to Start, which adds the extensions of PATHEXT.
func checkProgram(cmd *exec.Cmd) error {
	if cmd.Err != nil {
		if errors.Is(cmd.Err, exec.ErrNotFound) {
			return startErrorf(ErrNotFound, "%s: not found in %%PATH%%", name(cmd))
		}
		return cmd.Err
	}
	return nil
}

// startFailed says why starting prog failed where Windows's error tells,
// or returns err.
func startFailed(_, argv0, _ string, err error) error {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, windows.ERROR_FILE_NOT_FOUND), errors.Is(err, windows.ERROR_PATH_NOT_FOUND):
		return startErrorf(ErrNotFound, "%s: not found", argv0)
	case errors.Is(err, windows.ERROR_ACCESS_DENIED), errors.Is(err, windows.ERROR_BAD_EXE_FORMAT):
		return startErrorf(ErrNotExecutable, "%s: not executable (%v)", argv0, err)
	}
	return err
}

// runShim refuses: a Subreaper shim runs on Linux only.
func runShim([]string) int {
	fmt.Fprintln(os.Stderr, "proctree shim: not on windows")
	return 2
}
