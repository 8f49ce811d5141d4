//go:build windows

package workers

import (
	"fmt"
	"os/exec"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"
)

// prepare starts the command in its own process group.
func prepare(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP}
}

// jobObject is a Job Object holding the task's process and every process
// it starts; closing its last handle (also when gantry dies) kills them all.
type jobObject struct{ h windows.Handle }

func track(cmd *exec.Cmd) (procTree, error) {
	h, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return nil, fmt.Errorf("create job object: %w", err)
	}
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{
		BasicLimitInformation: windows.JOBOBJECT_BASIC_LIMIT_INFORMATION{
			LimitFlags: windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
		},
	}
	if _, err := windows.SetInformationJobObject(h, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		_ = windows.CloseHandle(h)
		return nil, fmt.Errorf("set job object limits: %w", err)
	}
	p, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(cmd.Process.Pid))
	if err != nil {
		_ = windows.CloseHandle(h)
		return nil, fmt.Errorf("open process: %w", err)
	}
	defer windows.CloseHandle(p)
	if err := windows.AssignProcessToJobObject(h, p); err != nil {
		_ = windows.CloseHandle(h)
		return nil, fmt.Errorf("assign process to job object: %w", err)
	}
	return &jobObject{h: h}, nil
}

// terminate kills the tree: Windows has no SIGTERM for a process tree.
func (j *jobObject) terminate() error { return j.kill() }

func (j *jobObject) kill() error { return windows.TerminateJobObject(j.h, 1) }

func (j *jobObject) release() { _ = windows.CloseHandle(j.h) }
