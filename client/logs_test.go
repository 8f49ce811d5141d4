package client_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/workers"
)

// collect runs TaskLogs to its end and returns the lines.
func collect(t *testing.T, b *bundle, id string, o client.LogOptions) ([]client.OutputLine, error) {
	t.Helper()
	var out []client.OutputLine
	for l, err := range b.c.TaskLogs(ctx(t, 30*time.Second), id, o) {
		if err != nil {
			return out, err
		}
		out = append(out, l)
	}
	return out, nil
}

func texts(lines []client.OutputLine) string {
	var s []string
	for _, l := range lines {
		s = append(s, l.Stream+":"+l.Line)
	}
	return strings.Join(s, "|")
}

func TestTaskLogs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorkers(t, workers.Config{}, nil)
	dir := t.TempDir()
	gate, started := filepath.Join(dir, "gate"), filepath.Join(dir, "started")
	sub, err := b.c.Submit(ctx(t, 10*time.Second), client.Task{Type: "exec", ID: "logs-1", Payload: client.ExecPayload{
		Cmd: []string{"sh", "-c", `echo one; echo two; touch ` + started + `; while [ ! -e ` + gate + ` ]; do sleep 0.02; done; echo three; echo four`},
	}})
	if err != nil {
		t.Fatal(err)
	}
	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		_, err := os.Stat(started)
		return err
	})

	// Running, not followed: the lines so far, from its worker.
	check.For(t, 5*time.Second, 20*time.Millisecond, func() error {
		got, err := collect(t, b, sub.ID, client.LogOptions{})
		if err != nil || texts(got) != "stdout:one|stdout:two" {
			return errors.New("TaskLogs of a running task = " + texts(got) + ", want stdout:one|stdout:two")
		}
		return nil
	})

	// Followed: those, then the live ones, until the task ends. The lines
	// so far come once the follower listens for the live ones.
	done := make(chan []client.OutputLine, 1)
	errc := make(chan error, 1)
	attached := make(chan struct{})
	go func() {
		var got []client.OutputLine
		var ferr error
		for l, err := range b.c.TaskLogs(ctx(t, 30*time.Second), sub.ID, client.LogOptions{Follow: true}) {
			if err != nil {
				ferr = err
				break
			}
			if got = append(got, l); len(got) == 2 {
				close(attached)
			}
		}
		errc <- ferr
		done <- got
	}()
	select {
	case <-attached:
	case <-time.After(10 * time.Second):
		t.Fatal("TaskLogs -f gave no lines within 10s")
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		if err := <-errc; err != nil {
			t.Fatalf("TaskLogs -f = %v", err)
		}
		if want := "stdout:one|stdout:two|stdout:three|stdout:four"; texts(got) != want {
			t.Errorf("TaskLogs -f = %s, want %s", texts(got), want)
		}
		for i, l := range got {
			if l.TaskID != sub.ID || l.Attempt != 1 || l.Seq != uint64(i+1) {
				t.Errorf("line %d = %+v, want task %s, attempt 1, seq %d", i, l, sub.ID, i+1)
			}
		}
	case <-time.After(20 * time.Second):
		t.Fatal("TaskLogs -f did not end with the task")
	}

	// Ended: the kept tail.
	got, err := collect(t, b, sub.ID, client.LogOptions{Follow: true})
	if err != nil || texts(got) != "tail:one|tail:two|tail:three|tail:four" {
		t.Errorf("TaskLogs of an ended task = %s, %v; want the tail's four lines", texts(got), err)
	}
	if _, err := collect(t, b, "nope", client.LogOptions{}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("TaskLogs of an unknown task = %v, want ErrNotFound", err)
	}
	if rec, err := b.c.Task(ctx(t, 5*time.Second), sub.ID); err != nil || rec.State != wire.TaskSucceeded {
		t.Errorf("task = %s, %v; want SUCCEEDED", rec.State, err)
	}
}
