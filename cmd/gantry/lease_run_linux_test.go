package main

import (
	"path/filepath"
	"testing"

	"github.com/gantry-dev/gantry/internal/brokertest"
)

// TestKilledLeaseRunTakesCommand: lease run killed with SIGKILL takes its
// command along (the parent-death signal).
func TestKilledLeaseRunTakesCommand(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	dir := t.TempDir()
	pidFile, started := filepath.Join(dir, "pid"), filepath.Join(dir, "started")
	c, _ := startLeaseRun(t, env.URL, "cam1", "--",
		"sh", "-c", `echo $$ > "$1"; touch "$2"; exec sleep 300`, "sh", pidFile, started)
	waitFile(t, started)
	pid := readPID(t, pidFile)
	// Not c.Wait: it also waits for the output pipe, which the command
	// holds if it survives.
	if err := c.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitDead(t, pid, "lease run's command outlived lease run killed with SIGKILL")
}
