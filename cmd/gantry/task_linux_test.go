package main

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKilledWorkerLeavesNoChild: a worker killed with SIGKILL takes its exec
// task's process with it (the parent death signal), and the task runs again
// elsewhere later.
func TestKilledWorkerLeavesNoChild(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "broker", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS
	w, _ := startGantry(t, "worker", "--server", url)
	pidFile := filepath.Join(t.TempDir(), "pid")
	code, _, stderr := runInProcess(t, "submit", "exec", "--id", "orphan-1", "--server", url,
		"--payload", `{"cmd":["sh","-c","echo $$ > `+pidFile+`; exec sleep 300"]}`)
	if code != exitOK {
		t.Fatalf("submit = exit %d (%s)", code, stderr)
	}
	var pid int
	deadline := time.Now().Add(10 * time.Second)
	for pid == 0 && time.Now().Before(deadline) {
		data, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		time.Sleep(20 * time.Millisecond)
	}
	if pid == 0 {
		t.Fatal("exec task did not start within 10s")
	}
	if err := w.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
	deadline = time.Now().Add(10 * time.Second)
	for {
		err := syscall.Kill(pid, 0)
		stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if errors.Is(err, syscall.ESRCH) || strings.Contains(string(stat), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("exec child %d alive 10s after its worker was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
