package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	poll "github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/proctree"
	"github.com/gantry-dev/gantry/internal/proctree/proctreetest"
)

// TestKilledWorkerLeavesNoChild: a worker killed with SIGKILL takes its exec
// task's process with it (the parent death signal), and the task runs again
// elsewhere later.
func TestKilledWorkerLeavesNoChild(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "broker", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS
	w, _ := startGantry(t, "worker", "--server", url, "--data", t.TempDir())
	pidFile := filepath.Join(t.TempDir(), "pid")
	code, _, stderr := runInProcess(t, "submit", "exec", "--id", "orphan-1", "--server", url,
		"--payload", `{"cmd":["sh","-c","echo $$ > `+pidFile+`; exec sleep 300"]}`)
	if code != exitOK {
		t.Fatalf("submit = exit %d (%s)", code, stderr)
	}
	pid := proctreetest.ReadPids(t, pidFile, 1)[0]
	if err := w.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
	proctreetest.WaitDead(t, "the exec child outlived its killed worker", pid)
}

// escapeScript starts a background child, a setsid child and a
// double-forked setsid grandchild, each writing its pid to $PIDS, and
// writes its checkpoint file's name to $CPFILE; then it sleeps.
const escapeScript = `sh -c 'echo $$ >> "$PIDS"; exec sleep 300' &
setsid sh -c 'echo $$ >> "$PIDS"; exec sleep 300' &
(setsid sh -c 'echo $$ >> "$PIDS"; exec sleep 300' &)
echo "$GANTRY_CHECKPOINT_FILE" > "$CPFILE"
sleep 300`

// TestWorkerSIGTERMLeavesNoProcess: a worker stopped with SIGTERM
// interrupts its exec tasks and leaves none of their processes, setsid and
// double-forked ones included, under a cgroup (where the machine allows
// it) and under a subreaper. Its checkpoint files are under --data, and it
// removes those a killed worker left when it starts.
func TestWorkerSIGTERMLeavesNoProcess(t *testing.T) {
	t.Parallel()
	for _, c := range []proctree.Containment{proctree.Cgroup, proctree.Subreaper} {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			if _, err := proctree.New(proctree.Config{Containment: c, Shim: os.Args[0]}); err != nil {
				t.Skipf("%s containment is not allowed on this machine: %v", c, err)
			}
			_, ready := startGantry(t, "broker", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
			data, dir := t.TempDir(), t.TempDir()
			leftover := filepath.Join(data, "checkpoints", "999999999-x")
			if err := os.MkdirAll(leftover, 0o700); err != nil {
				t.Fatal(err)
			}
			w, _ := startGantry(t, "worker", "--server", ready.NATS, "--data", data, "--exec-containment", string(c), "--kill-grace", "500ms")
			if _, err := os.Stat(leftover); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("stat a killed worker's checkpoint dir = %v, want it removed at start", err)
			}
			pidFile, cpFile := filepath.Join(dir, "pids"), filepath.Join(dir, "cpfile")
			payload, _ := json.Marshal(wire.ExecPayload{Cmd: []string{"sh", "-c", escapeScript},
				Env: map[string]string{"PIDS": pidFile, "CPFILE": cpFile}})
			if code, _, stderr := runInProcess(t, "submit", "exec", "--server", ready.NATS, "--payload", string(payload)); code != exitOK {
				t.Fatalf("submit = exit %d (%s)", code, stderr)
			}
			var pids []int
			poll.For(t, 10*time.Second, 20*time.Millisecond, func() error {
				data, _ := os.ReadFile(pidFile)
				pids = pids[:0]
				for _, f := range strings.Fields(string(data)) {
					if pid, err := strconv.Atoi(f); err == nil {
						pids = append(pids, pid)
					}
				}
				if len(pids) < 3 {
					return fmt.Errorf("the task wrote %d pids, want 3", len(pids))
				}
				return nil
			})
			t.Cleanup(func() {
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			poll.For(t, 10*time.Second, 20*time.Millisecond, func() error {
				got, err := os.ReadFile(cpFile)
				if err != nil {
					return err
				}
				if !strings.HasPrefix(string(got), filepath.Join(data, "checkpoints")+string(filepath.Separator)) {
					t.Errorf("GANTRY_CHECKPOINT_FILE = %q, want a file under %s", got, filepath.Join(data, "checkpoints"))
				}
				return nil
			})
			if err := w.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := exitOf(t, w); code != exitOK {
				t.Errorf("worker after SIGTERM = exit %d, want 0", code)
			}
			poll.For(t, 10*time.Second, 20*time.Millisecond, func() error {
				for _, pid := range pids {
					if proctreetest.Alive(pid) {
						return fmt.Errorf("process %d of the task is alive after its worker stopped, want the whole tree gone", pid)
					}
				}
				return nil
			})
			if entries, err := os.ReadDir(filepath.Join(data, "checkpoints")); err != nil || len(entries) != 0 {
				t.Errorf("checkpoint dir after the worker stopped = %v (%v), want empty", entries, err)
			}
		})
	}
}
