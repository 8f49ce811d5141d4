package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
)

// A prioritized queue, end to end: tasks submitted while its one slot is
// busy start highest priority first, and one cancelled while it waits
// never runs.
func TestPrioritizedQueue(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "broker", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS
	startGantry(t, "worker", "--server", url, "--data", t.TempDir(), "--queue", "urgent=1", "--prioritize", "urgent")
	dir := t.TempDir()
	release, order := filepath.Join(dir, "release"), filepath.Join(dir, "order")
	submit := func(id, priority, script string) {
		t.Helper()
		payload, _ := json.Marshal(map[string][]string{"cmd": {"sh", "-c", script}})
		args := []string{"submit", "exec", "--queue", "urgent", "--id", id, "--server", url, "--payload", string(payload)}
		if priority != "" {
			args = append(args, "--priority", priority)
		}
		if code, _, stderr := runInProcess(t, args...); code != exitOK {
			t.Fatalf("submit %s = exit %d (%s)", id, code, stderr)
		}
	}
	submit("block", "", "while [ ! -f "+release+" ]; do sleep 0.05; done")
	waitTaskState(t, url, "block", wire.TaskRunning)
	record := "echo $GANTRY_TASK_ID >> " + order
	_, js := brokertest.Connect(t, url)
	held := func(n int) {
		t.Helper()
		poll.For(t, 10*time.Second, 20*time.Millisecond, func() error {
			cons, err := js.Consumer(context.Background(), wire.StreamTasks, "gantry-sorter-urgent")
			if err != nil {
				return err
			}
			if info := cons.CachedInfo(); info.NumAckPending != n || info.NumPending != 0 {
				return fmt.Errorf("the sorter holds %d tasks (%d pending), want %d", info.NumAckPending, info.NumPending, n)
			}
			return nil
		})
	}
	// moved goes ahead to gantry.ready at once; the other three wait in
	// the sorter.
	submit("moved", "", record)
	held(0)
	submit("low", "", record)
	submit("doomed", "", record)
	submit("high", "9", record)
	held(3)

	// doomed is held: the sorter answers and drops it. moved is on
	// gantry.ready: nobody answers, its worker finds it cancelled when its
	// turn comes, even after a retention shorter than its wait.
	for _, id := range []string{"doomed", "moved"} {
		if code, _, stderr := runInProcess(t, "task", "cancel", id, "--task-retention", "1s", "--server", url); code != exitOK {
			t.Fatalf("task cancel %s = exit %d (%s)", id, code, stderr)
		}
	}
	// The 1 s retention must run out while they wait: a span of time to
	// pass, not a wait for something.
	time.Sleep(2 * time.Second)
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"block", "high", "low"} {
		waitTaskState(t, url, id, wire.TaskSucceeded)
	}
	for _, id := range []string{"doomed", "moved"} {
		waitTaskState(t, url, id, wire.TaskCancelled)
	}
	got, err := os.ReadFile(order)
	if err != nil {
		t.Fatal(err)
	}
	if want := "high\nlow\n"; string(got) != want {
		t.Errorf("run order = %q, want %q", got, want)
	}
}

// 'gantry run' takes the worker flags and refuses bad ones before it
// starts anything.
func TestRunWorkerFlags(t *testing.T) {
	t.Parallel()
	code, _, stderr := runInProcess(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "",
		"--queue", "urgent", "--prioritize", "nope")
	if code != exitUsage || !strings.Contains(stderr, "--prioritize") {
		t.Errorf("run --prioritize nope = exit %d (%s), want %d naming --prioritize", code, stderr, exitUsage)
	}
}
