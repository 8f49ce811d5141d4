package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/proctree/proctreetest"
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
	proctreetest.WaitFile(t, started)
	pid := readPID(t, pidFile)
	// Not c.Wait: it also waits for the output pipe, which the command
	// holds if it survives.
	if err := c.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	proctreetest.WaitDead(t, "lease run's command outlived lease run killed with SIGKILL", pid)
}

// TestLeaseRunKillsEscapees: what CMD started is killed when CMD ends,
// setsid and double-forked processes included.
func TestLeaseRunKillsEscapees(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	pidFile := filepath.Join(t.TempDir(), "pids")
	// Each escapee writes its pid to the file named by $0; CMD exits once
	// all three have.
	c, out := startLeaseRun(t, env.URL, "cam1", "--", "sh", "-c", `sh -c 'echo $$ >> "$0"; exec sleep 300' "$1" &
setsid sh -c 'echo $$ >> "$0"; exec sleep 300' "$1" &
(setsid sh -c 'echo $$ >> "$0"; exec sleep 300' "$1" &)
while [ "$(cat "$1" 2>/dev/null | wc -l)" -lt 3 ]; do sleep 0.01; done`, "sh", pidFile)
	if code := exitOf(t, c); code != 0 {
		t.Fatalf("lease run = exit %d (%s), want 0", code, out)
	}
	pids := parsePids(t, pidFile)
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if len(pids) != 3 {
		t.Fatalf("pids = %v, want 3", pids)
	}
	poll.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, pid := range pids {
			if proctreetest.Alive(pid) {
				return fmt.Errorf("process %d that CMD started is alive after lease run exited, want it killed", pid)
			}
		}
		return nil
	})
}

// parsePids reads the pids in path, one a line.
func parsePids(t *testing.T, path string) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		pids = append(pids, pid)
	}
	return pids
}
