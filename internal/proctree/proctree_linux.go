//go:build linux

package proctree

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// groupAttr makes the command lead a new process group, and has the kernel
// SIGKILL it when gantry dies, even by SIGKILL. (The kernel sends the
// signal when the thread that started the command exits; Go keeps its
// threads unless a goroutine exits locked to one.)
func groupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// newContainer makes the containment wanted, or for Auto the strongest
// the machine allows: a cgroup, else a subreaper shim, else the group.
func newContainer(want Containment, shim string) (Containment, container, error) {
	switch want {
	case Group:
		return Group, groups{}, nil
	case Cgroup:
		c, err := newCgroups(shim)
		if err != nil {
			return "", nil, fmt.Errorf("cgroup containment: %w", err)
		}
		return Cgroup, c, nil
	case Subreaper:
		s, err := newShims(shim)
		if err != nil {
			return "", nil, fmt.Errorf("subreaper containment: %w", err)
		}
		return Subreaper, s, nil
	}
	if c, err := newCgroups(shim); err == nil {
		return Cgroup, c, nil
	}
	if s, err := newShims(shim); err == nil {
		return Subreaper, s, nil
	}
	return Group, groups{}, nil
}

// newShims checks that shim names an executable.
func newShims(shim string) (shims, error) {
	if shim == "" {
		return shims{}, errors.New("no shim executable (Config.Shim)")
	}
	// The shim starts in the command's dir.
	shim, err := filepath.Abs(shim)
	if err != nil {
		return shims{}, fmt.Errorf("shim: %w", err)
	}
	fi, err := os.Stat(shim)
	if err != nil {
		return shims{}, fmt.Errorf("shim: %w", err)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return shims{}, fmt.Errorf("shim %s: not executable", shim)
	}
	return shims{path: shim}, nil
}
