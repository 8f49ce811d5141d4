//go:build windows

package main

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"unsafe"
)

// forwardedSignals are the signals `gantry lease run` passes on to its
// command.
var forwardedSignals = []os.Signal{os.Interrupt}

// Windows constants (winbase.h, winnt.h).
const (
	createNewProcessGroup        = 0x00000200 // CREATE_NEW_PROCESS_GROUP
	ctrlBreakEvent               = 1          // CTRL_BREAK_EVENT
	jobObjectExtendedLimitInfo   = 9          // JobObjectExtendedLimitInformation
	jobObjectLimitKillOnJobClose = 0x00002000 // JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
	processSetQuotaAndTerminate  = 0x0100 | 0x0001
	terminatedByGantryExitCode   = 1
	ioCountersSize               = 6 * 8
)

// jobObjectBasicLimitInformation is JOBOBJECT_BASIC_LIMIT_INFORMATION.
type jobObjectBasicLimitInformation struct {
	PerProcessUserTimeLimit int64
	PerJobUserTimeLimit     int64
	LimitFlags              uint32
	MinimumWorkingSetSize   uintptr
	MaximumWorkingSetSize   uintptr
	ActiveProcessLimit      uint32
	Affinity                uintptr
	PriorityClass           uint32
	SchedulingClass         uint32
}

// jobObjectExtendedLimitInformation is JOBOBJECT_EXTENDED_LIMIT_INFORMATION.
type jobObjectExtendedLimitInformation struct {
	BasicLimitInformation jobObjectBasicLimitInformation
	IoInfo                [ioCountersSize]byte
	ProcessMemoryLimit    uintptr
	JobMemoryLimit        uintptr
	PeakProcessMemoryUsed uintptr
	PeakJobMemoryUsed     uintptr
}

// procTree is a started command and every process it starts: a Job Object
// that kills them all when terminated or when gantry exits (its handle
// closes), with taskkill /T /F as the fallback when no job could be made.
type procTree struct {
	c        *exec.Cmd
	kernel32 *syscall.LazyDLL
	job      syscall.Handle
}

// prepareTree gives c a console process group of its own, which CTRL_BREAK
// can address.
func prepareTree(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{CreationFlags: createNewProcessGroup}
}

// startTree starts c and puts it in a new Job Object. Processes c starts
// before it is assigned escape the job; kill also runs taskkill /T for them.
func startTree(c *exec.Cmd) (*procTree, error) {
	if err := c.Start(); err != nil {
		return nil, err
	}
	t := &procTree{c: c, kernel32: syscall.NewLazyDLL("kernel32.dll")}
	if job, err := t.newJob(); err == nil {
		t.job = job
	}
	return t, nil
}

func (t *procTree) newJob() (syscall.Handle, error) {
	h, _, err := t.kernel32.NewProc("CreateJobObjectW").Call(0, 0)
	if h == 0 {
		return 0, err
	}
	job := syscall.Handle(h)
	var info jobObjectExtendedLimitInformation
	info.BasicLimitInformation.LimitFlags = jobObjectLimitKillOnJobClose
	r, _, err := t.kernel32.NewProc("SetInformationJobObject").Call(uintptr(job), jobObjectExtendedLimitInfo,
		uintptr(unsafe.Pointer(&info)), unsafe.Sizeof(info))
	if r == 0 {
		_ = syscall.CloseHandle(job)
		return 0, err
	}
	proc, err := syscall.OpenProcess(processSetQuotaAndTerminate, false, uint32(t.c.Process.Pid))
	if err != nil {
		_ = syscall.CloseHandle(job)
		return 0, err
	}
	defer func() { _ = syscall.CloseHandle(proc) }()
	r, _, err = t.kernel32.NewProc("AssignProcessToJobObject").Call(uintptr(job), uintptr(proc))
	if r == 0 {
		_ = syscall.CloseHandle(job)
		return 0, err
	}
	return job, nil
}

// signal sends CTRL_BREAK to the command's process group, the console's
// nearest thing to SIGINT for a group.
func (t *procTree) signal(os.Signal) error {
	r, _, err := t.kernel32.NewProc("GenerateConsoleCtrlEvent").Call(ctrlBreakEvent, uintptr(t.c.Process.Pid))
	if r == 0 {
		return err
	}
	return nil
}

// kill terminates the job; without a job, it falls back to taskkill /T /F
// on the command's pid (the command must not have been waited for yet, or
// the pid may name another process).
func (t *procTree) kill() error {
	if t.job != 0 {
		return t.killLeftovers()
	}
	if err := exec.Command("taskkill", "/T", "/F", "/PID", strconv.Itoa(t.c.Process.Pid)).Run(); err != nil {
		return errors.Join(err, t.c.Process.Kill())
	}
	return nil
}

// killLeftovers terminates whatever is still in the job after the command
// ended; without a job there is nothing it can safely address.
func (t *procTree) killLeftovers() error {
	if t.job == 0 {
		return nil
	}
	if r, _, err := t.kernel32.NewProc("TerminateJobObject").Call(uintptr(t.job), terminatedByGantryExitCode); r == 0 {
		return err
	}
	return nil
}

// close releases the job handle.
func (t *procTree) close() {
	if t.job != 0 {
		_ = syscall.CloseHandle(t.job)
		t.job = 0
	}
}

// exitStatus returns the process's exit code.
func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }
