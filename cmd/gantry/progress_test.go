package main

import (
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
)

// TestProgress: on a terminal the line follows the task's states; off one
// it prints nothing.
func TestProgress(t *testing.T) {
	t.Parallel()
	var tty syncBuffer
	p := startProgress(&tty, true, "t1", time.Hour)
	p.update(client.TaskRecord{TaskInfo: wire.TaskInfo{State: client.TaskRunning, Attempts: 1}})
	at := time.Now().Add(4 * time.Minute)
	p.update(client.TaskRecord{TaskInfo: wire.TaskInfo{State: client.TaskRetryWait, Attempts: 1}, RetryAt: &at})
	p.end()
	out := tty.String()
	for _, want := range []string{"\r", "task t1 WAITING", "task t1 RUNNING, attempt 1", "RETRY_WAIT, attempt 1, retry in 4m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("terminal output = %q, want %q", out, want)
		}
	}
	var piped syncBuffer
	q := startProgress(&piped, false, "t1", time.Millisecond)
	q.update(client.TaskRecord{TaskInfo: wire.TaskInfo{State: client.TaskRunning}})
	q.end()
	if piped.String() != "" {
		t.Errorf("piped output = %q, want nothing", piped.String())
	}
}
