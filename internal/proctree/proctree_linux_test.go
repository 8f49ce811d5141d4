package proctree

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/check"
)

// TestParentDeathKillsCommand: a gantry killed with SIGKILL takes the
// command it started along (the parent-death signal).
func TestParentDeathKillsCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	parent := exec.Command(os.Args[0], "-test.run=^$")
	parent.Env = append(os.Environ(), helperEnv+"=parent", "PIDFILE="+pidFile)
	parent.Stderr = stderr
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		data, err := os.ReadFile(pidFile)
		if err != nil {
			msg, _ := os.ReadFile(stderr.Name())
			return fmt.Errorf("helper wrote no pid (stderr %q): %v", msg, err)
		}
		child, err = strconv.Atoi(string(data))
		return err
	})
	if err := parent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = parent.Wait()
	waitDead(t, child)
}

// TestWaitCutsOffEscapedOutput: a process that left the tree (setsid)
// and holds stdout keeps Wait no longer than WaitDelay.
func TestWaitCutsOffEscapedOutput(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid:", err)
	}
	cmd := shell(context.Background(), `setsid sleep 300 & echo $!`)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.WaitDelay = 200 * time.Millisecond
	if err := wait(t, start(t, cmd)); err != nil {
		t.Errorf("Wait = %v, want nil: the command's own exit is what counts", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("output = %q, want the escaped pid", out.String())
	}
	// The escaped process is out of the tree's reach: the test kills it.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Errorf("kill the escaped process %d: %v", pid, err)
	}
	waitDead(t, pid)
}
