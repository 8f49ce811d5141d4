//go:build unix && !linux

package proctree

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
)

// groupAttr makes the command lead a new process group. macOS and the BSDs
// have no parent-death signal here: a gantry killed with SIGKILL leaves the
// command running.
func groupAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// newContainer holds trees as process groups: the only containment here.
func newContainer(want Containment, _ string) (Containment, container, error) {
	if want != Auto && want != Group {
		return "", nil, fmt.Errorf("%s containment: Linux only", want)
	}
	return Group, groups{}, nil
}

// runShim refuses: a Subreaper shim runs on Linux only.
func runShim([]string) int {
	fmt.Fprintf(os.Stderr, "proctree shim: not on %s\n", runtime.GOOS)
	return 2
}
