//go:build windows

package proctree

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"
)

// sysProcAttr gives the command a console process group of its own, which
// CTRL_BREAK can address.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP}
}

// sysTree is a Job Object holding the command and every process it starts;
// closing its last handle, also when gantry dies, kills them all.
type sysTree struct {
	job   windows.Handle
	group uint32 // the console process group: the command's pid
}

// track puts the started process in a new Job Object with kill-on-close.
func track(p *os.Process) (sysTree, error) {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return sysTree{}, fmt.Errorf("create job object: %w", err)
	}
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{
		BasicLimitInformation: windows.JOBOBJECT_BASIC_LIMIT_INFORMATION{
			LimitFlags: windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
		},
	}
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		_ = windows.CloseHandle(job)
		return sysTree{}, fmt.Errorf("set job object limits: %w", err)
	}
	h, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(p.Pid))
	if err != nil {
		_ = windows.CloseHandle(job)
		return sysTree{}, fmt.Errorf("open process %d: %w", p.Pid, err)
	}
	defer windows.CloseHandle(h)
	if err := windows.AssignProcessToJobObject(job, h); err != nil {
		_ = windows.CloseHandle(job)
		return sysTree{}, fmt.Errorf("assign process %d to job object: %w", p.Pid, err)
	}
	return sysTree{job: job, group: uint32(p.Pid)}, nil
}

// signal sends CTRL_BREAK for os.Interrupt and kills the job for os.Kill:
// Windows has no other signals for a tree.
func (j sysTree) signal(sig os.Signal) error {
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
func (j sysTree) ctrlBreak() error {
	if err := windows.GenerateConsoleCtrlEvent(windows.CTRL_BREAK_EVENT, j.group); err != nil {
		return fmt.Errorf("send CTRL_BREAK to process group %d: %w", j.group, err)
	}
	return nil
}

// terminate sends CTRL_BREAK, or kills the job when it cannot be sent (the
// command has no console shared with gantry).
func (j sysTree) terminate() error {
	if j.ctrlBreak() != nil {
		return j.kill()
	}
	return nil
}

// kill terminates every process in the job.
func (j sysTree) kill() error {
	if err := windows.TerminateJobObject(j.job, 1); err != nil {
		return fmt.Errorf("terminate job object: %w", err)
	}
	return nil
}

// release closes the job's handle, which kills whatever is left in it.
func (j sysTree) release() { _ = windows.CloseHandle(j.job) }

// killedBy reports no signal: Windows has none that ends a process.
func killedBy(*os.ProcessState) (int, bool) { return 0, false }

// brokenPipe reports whether err is the write to a pipe nobody reads.
func brokenPipe(err error) bool {
	return errors.Is(err, windows.ERROR_BROKEN_PIPE) || errors.Is(err, windows.ERROR_NO_DATA)
}

func interrupts() []os.Signal { return []os.Signal{os.Interrupt} }
