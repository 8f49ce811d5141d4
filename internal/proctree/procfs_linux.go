//go:build linux

package proctree

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// statFields returns the fields of /proc/<pid>/stat after the command
// name: the process state is [0], the parent [1], the start time [19].
func statFields(pid int) ([][]byte, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := bytes.Fields(data[i+1:])
	if len(f) < 20 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return f, nil
}

// startTime is when pid started, in clock ticks after boot: with the pid,
// it names one process for as long as the machine runs.
func startTime(pid int) (uint64, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
}

// parentOf returns pid's parent.
func parentOf(pid int) (int, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(f[1]))
}

// descendants returns every process below root, found in /proc, each
// after its parent.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parentOf(pid); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	seen := map[int]bool{}
	next := []int{root}
	for len(next) > 0 {
		pid := next[len(next)-1]
		next = next[:len(next)-1]
		for _, c := range children[pid] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				next = append(next, c)
			}
		}
	}
	return out
}

// signalPinned sends sig to pid if ours says, once pid is pinned by a
// pidfd, that it is still the process meant: a pid that exited and was
// reused by another process between the listing and the signal is not
// signalled. Without pidfds (Linux before 5.3) the check and the signal
// are not atomic.
func signalPinned(pid int, sig syscall.Signal, ours func() bool) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ENOSYS) {
		if !ours() {
			return os.ErrProcessDone
		}
		return unix.Kill(pid, sig)
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if !ours() {
		return os.ErrProcessDone
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0)
}
