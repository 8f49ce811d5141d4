// Command gantry runs the gantry task pipeline and talks to it: `gantry run`
// starts the embedded broker and every component in one process; the other
// commands are clients of a running system.
package main

import (
	"context"
	"os"

	"github.com/gantry-dev/gantry/internal/proctree"
)

// shimPath is gantry's own executable, the shim of the process trees it
// starts under a subreaper (see internal/proctree), or "" if it cannot be
// found: then no subreaper is used.
func shimPath() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return exe
}

func main() {
	// A shim of an exec task's or lease run's process tree runs here.
	proctree.ShimMain()
	os.Exit(Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
