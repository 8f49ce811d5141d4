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

func TestTaskLogsCommand(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS
	dir := t.TempDir()
	gate, started := filepath.Join(dir, "gate"), filepath.Join(dir, "started")
	script := `echo one; echo oops >&2; echo "password=hunter2"; touch ` + started + `; while [ ! -e ` + gate + ` ]; do sleep 0.02; done; echo two`
	payload, _ := json.Marshal(map[string]any{"cmd": []string{"sh", "-c", script}})
	if code, _, stderr := runInProcess(t, "submit", "exec", "--id", "logs-1", "--payload", string(payload), "--server", url); code != exitOK {
		t.Fatalf("submit = exit %d (%s)", code, stderr)
	}
	poll.That(t, 20*time.Second, "the task to start", func() bool {
		_, err := os.Stat(started)
		return err == nil
	})

	// While it runs: its lines so far, stderr's on stderr, redacted.
	var last string
	poll.That(t, 20*time.Second, "task logs of the running task", func() bool {
		code, out, stderr := runInProcess(t, "task", "logs", "logs-1", "--server", url)
		last = fmt.Sprintf("exit %d, %q, stderr %q", code, out, stderr)
		return code == exitOK && out == "one\npassword=[REDACTED]\n" && stderr == "oops\n"
	})
	t.Logf("task logs of the running task = %s", last)

	// -f --json: one object a line, until the task ends.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"task", "logs", "logs-1", "-f", "--json", "--server", url}, strings.NewReader(""), &out, &errb)
	}()
	poll.That(t, 20*time.Second, "task logs -f to print the lines so far", func() bool {
		return strings.Count(out.String(), "\n") >= 3
	})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("task logs -f = exit %d (%s)", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("task logs -f did not end with the task")
	}
	var lines []wire.OutputLine
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var ol wire.OutputLine
		if err := json.Unmarshal([]byte(l), &ol); err != nil {
			t.Fatalf("task logs -f --json line %q: %v", l, err)
		}
		lines = append(lines, ol)
	}
	if len(lines) != 4 || lines[3].Line != "two" || lines[3].Stream != wire.OutputStdout || lines[3].Attempt != 1 {
		t.Errorf("task logs -f --json = %+v, want 4 lines ending with two", lines)
	}

	// Ended: the kept tail, redacted too.
	code, tail, stderr := runInProcess(t, "task", "logs", "logs-1", "--server", url)
	if code != exitOK || !strings.Contains(tail, "one\npassword=[REDACTED]\ntwo") || strings.Contains(tail, "hunter2") {
		t.Errorf("task logs of an ended task = exit %d, %q (%s); want the redacted tail", code, tail, stderr)
	}
	if code, _, _ := runInProcess(t, "task", "logs", "nope", "--server", url); code != exitNotFound {
		t.Errorf("task logs nope = exit %d, want 4", code)
	}
}

func TestRejectedAndJobTasksFindable(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS
	nc, _ := brokertest.Connect(t, url)

	// A rejected task keeps the id its publisher gave it.
	if err := nc.Publish(wire.TaskSubject("", "exec"), []byte(`{"id":"py-bad-r1","timeout":5}`)); err != nil {
		t.Fatal(err)
	}
	rec := waitRecord(t, url, "py-bad-r1", wire.TaskNeedsReview)
	if !strings.Contains(rec.LastError, "timeout") {
		t.Errorf("py-bad-r1 last error = %q, want the timeout named", rec.LastError)
	}
	page := waitQuery(t, url, 3, "--task", "py-bad-r1")
	if page.Events[0].Type != wire.EventTaskRejected {
		t.Errorf("audit query --task py-bad-r1 = %v, want TASK_REJECTED first", page.Events)
	}

	// A job's task: every event of it is found by the job.
	if code, _, stderr := runInProcess(t, "job", "add", "nightly", "--type", "noop", "--every", "1h", "--paused", "--server", url); code != exitOK {
		t.Fatalf("job add = exit %d (%s)", code, stderr)
	}
	var id string
	poll.That(t, 20*time.Second, "job trigger nightly", func() bool {
		code, out, _ := runInProcess(t, "job", "trigger", "nightly", "--server", url)
		id = strings.TrimSpace(out)
		return code == exitOK
	})
	if rec := waitRecord(t, url, id, wire.TaskSucceeded); rec.Job != "nightly" {
		t.Errorf("task %s job = %q, want nightly", id, rec.Job)
	}
	poll.That(t, 20*time.Second, "audit query --job nightly to find the task's events", func() bool {
		page, _, _ := queryJSON(t, url, "--job", "nightly")
		seen := map[wire.EventType]bool{}
		for _, ev := range page.Events {
			seen[ev.Type] = ev.TaskID == id
		}
		return seen[wire.EventJobFired] && seen[wire.EventTaskCreated] && seen[wire.EventTaskStarted] && seen[wire.EventTaskFinished]
	})
}

// waitRecord polls 'gantry task get' until task id exists and is in state.
func waitRecord(t *testing.T, url, id string, state wire.TaskState) wire.TaskRecord {
	t.Helper()
	var rec wire.TaskRecord
	poll.That(t, 20*time.Second, "task "+id+" to be "+string(state), func() bool {
		code, out, _ := runInProcess(t, "task", "get", id, "--json", "--server", url)
		return code == exitOK && json.Unmarshal([]byte(out), &rec) == nil && rec.State == state
	})
	return rec
}
