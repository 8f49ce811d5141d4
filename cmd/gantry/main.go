// Command gantry runs the gantry task pipeline and talks to it: `gantry run`
// starts the embedded broker and every component in one process; the other
// commands are clients of a running system.
package main

import (
	"context"
	"os"
)

func main() {
	os.Exit(Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
