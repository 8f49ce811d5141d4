//go:build unix

package workers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/proctree/proctreetest"
	"github.com/gantry-dev/gantry/lease"
)

// treeScript starts two background sleeps, writes the pids of the shell and
// of both sleeps to $PIDS, and waits.
const treeScript = `echo $$ >> "$PIDS"; sleep 300 & echo $! >> "$PIDS"; (sleep 300 & echo $! >> "$PIDS"; wait) & wait`

func execTask(id string, payload wire.ExecPayload, extra string) string {
	p, _ := jsonString(payload)
	return fmt.Sprintf(`{"id":%q,"payload":%s%s}`, id, p, extra)
}

func TestExecTimeoutKillsTree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{Policy: fastPolicy, KillGrace: 200 * time.Millisecond}, nil)
	pidFile := filepath.Join(t.TempDir(), "pids")
	b.publish(t, wire.TaskSubject("", "exec"), execTask("tree-1", wire.ExecPayload{
		Cmd: []string{"sh", "-c", treeScript}, Env: map[string]string{"PIDS": pidFile},
	}, `,"timeout":"1s","max_attempts":1`))
	pids := proctreetest.ReadPids(t, pidFile, 3)
	rec := b.waitState(t, "tree-1", wire.TaskNeedsReview, 15*time.Second)
	if !strings.Contains(rec.LastError, "timed out") {
		t.Errorf("last error = %q, want timed out", rec.LastError)
	}
	proctreetest.WaitDead(t, "the whole tree is killed", pids...)
}

func TestExecCancelKillsTree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{KillGrace: 200 * time.Millisecond}, nil)
	pidFile := filepath.Join(t.TempDir(), "pids")
	b.publish(t, wire.TaskSubject("", "exec"), execTask("tree-2", wire.ExecPayload{
		Cmd: []string{"sh", "-c", treeScript}, Env: map[string]string{"PIDS": pidFile},
	}, ""))
	pids := proctreetest.ReadPids(t, pidFile, 3)
	if err := b.env.NC.Publish(wire.SubjectTaskCancel, cancelRequest(t, "tree-2")); err != nil {
		t.Fatal(err)
	}
	b.waitState(t, "tree-2", wire.TaskCancelled, 15*time.Second)
	proctreetest.WaitDead(t, "the whole tree is killed", pids...)
}

func TestExecExitCodes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{Policy: fastPolicy, MaxDelays: 2}, nil)
	subj := wire.TaskSubject("", "exec")
	b.publish(t, subj, execTask("fail-1", wire.ExecPayload{
		Cmd:           []string{"sh", "-c", `echo "id=$GANTRY_TASK_ID attempt=$GANTRY_ATTEMPT"; echo oops >&2; exit 3`},
		FailExitCodes: []int{3},
	}, ""))
	rec := b.waitState(t, "fail-1", wire.TaskNeedsReview, 10*time.Second)
	if rec.Attempts != 1 || !strings.Contains(rec.Output, "id=fail-1 attempt=1") || !strings.Contains(rec.LastError, "exit code 3: oops") {
		t.Errorf("record = attempts %d, output %q, last error %q; want 1, the env echoed, exit code 3: oops", rec.Attempts, rec.Output, rec.LastError)
	}
	b.publish(t, subj, execTask("delay-1", wire.ExecPayload{Cmd: []string{"sh", "-c", "exit 75"}, DelayExitCodes: []int{75}}, ""))
	rec = b.waitState(t, "delay-1", wire.TaskNeedsReview, 10*time.Second)
	if rec.Attempts != 1 || rec.Delays != 2 || !strings.Contains(rec.LastError, "delayed 2 times") {
		t.Errorf("record = attempts %d, delays %d, last error %q; want 1, 2, delayed 2 times", rec.Attempts, rec.Delays, rec.LastError)
	}
	b.publish(t, subj, execTask("ok-1", wire.ExecPayload{Cmd: []string{"sh", "-c", `read x; echo "got $x"`}, Stdin: "hello\n"}, ""))
	rec = b.waitState(t, "ok-1", wire.TaskSucceeded, 10*time.Second)
	if rec.Output != "got hello\n" {
		t.Errorf("output = %q, want %q", rec.Output, "got hello\n")
	}
	b.publish(t, subj, execTask("signal-1", wire.ExecPayload{Cmd: []string{"sh", "-c", "kill -KILL $$"}, FailExitCodes: []int{137}}, ""))
	rec = b.waitState(t, "signal-1", wire.TaskNeedsReview, 10*time.Second)
	if rec.Attempts != 1 || !strings.Contains(rec.LastError, "exit code 137") {
		t.Errorf("record = attempts %d, last error %q; want 1, exit code 137 (128+SIGKILL)", rec.Attempts, rec.LastError)
	}
	b.publish(t, subj, execTask("missing-1", wire.ExecPayload{Cmd: []string{"/no/such/program"}}, ""))
	b.waitState(t, "missing-1", wire.TaskNeedsReview, 10*time.Second)
}

func TestExecCheckpointFile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{Policy: fastPolicy}, nil)
	script := `if [ -s "$GANTRY_CHECKPOINT_FILE" ]; then echo "resume:"; cat "$GANTRY_CHECKPOINT_FILE"; exit 0; fi
echo '{"stage":"half","last_item":"7","counts":{"done":7}}' > "$GANTRY_CHECKPOINT_FILE"; exit 1`
	b.publish(t, wire.TaskSubject("", "exec"), execTask("cp-1", wire.ExecPayload{Cmd: []string{"sh", "-c", script}}, ""))
	rec := b.waitState(t, "cp-1", wire.TaskSucceeded, 10*time.Second)
	if rec.Attempts != 2 || !strings.Contains(rec.Output, `"stage":"half"`) || !strings.Contains(rec.Output, `"attempt":1`) {
		t.Errorf("record = attempts %d, output %q; want 2 and the checkpoint of attempt 1", rec.Attempts, rec.Output)
	}
}

func TestExecBackgroundChildDoesNotHoldTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{Policy: fastPolicy, KillGrace: time.Minute}, nil)
	pidFile := filepath.Join(t.TempDir(), "pids")
	// The background sleep holds the task's stdout: the task ends when the
	// shell does, and the sleep with it.
	b.publish(t, wire.TaskSubject("", "exec"), execTask("bg-1", wire.ExecPayload{
		Cmd: []string{"sh", "-c", `sleep 300 & echo $! >> "$PIDS"; echo done`}, Env: map[string]string{"PIDS": pidFile},
	}, `,"max_attempts":1`))
	rec := b.waitState(t, "bg-1", wire.TaskSucceeded, 15*time.Second)
	if rec.Output != "done\n" {
		t.Errorf("output = %q, want %q", rec.Output, "done\n")
	}
	proctreetest.WaitDead(t, "the whole tree is killed", proctreetest.ReadPids(t, pidFile, 1)...)
}

func TestExecCannotStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{Policy: fastPolicy}, nil)
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain.sh")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Each is a permanent failure: NEEDS_REVIEW on attempt 1, saying why.
	for _, tc := range []struct {
		id      string
		payload wire.ExecPayload
		want    string
	}{
		{"missing-path", wire.ExecPayload{Cmd: []string{"./missing.sh"}, Dir: dir}, "exec: ./missing.sh: not found"},
		{"missing-in-path", wire.ExecPayload{Cmd: []string{"gantry-no-such-program"}}, "gantry-no-such-program: not found in $PATH"},
		{"not-executable", wire.ExecPayload{Cmd: []string{plain}}, "plain.sh: not executable"},
		{"bad-dir", wire.ExecPayload{Cmd: []string{"true"}, Dir: filepath.Join(dir, "nowhere")}, "exec: dir " + filepath.Join(dir, "nowhere") + ": no such directory"},
	} {
		b.publish(t, wire.TaskSubject("", "exec"), execTask(tc.id, tc.payload, ""))
		rec := b.waitState(t, tc.id, wire.TaskNeedsReview, 10*time.Second)
		if rec.Attempts != 1 || !strings.Contains(rec.LastError, tc.want) {
			t.Errorf("%s: record = attempts %d, last error %q; want 1 and %q", tc.id, rec.Attempts, rec.LastError, tc.want)
		}
	}
}

// TestExecCannotStartOnResource: an exec task on a resource whose command
// cannot start goes to NEEDS_REVIEW without taking the resource: no lease,
// no RUNNING, not a single write to the resource's record.
func TestExecCannotStartOnResource(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := resources(t, b)
	before, err := res.Add(context.Background(), lease.ResourceSpec{ID: "cam1"})
	if err != nil {
		t.Fatal(err)
	}
	b.start(t, Config{Policy: fastPolicy}, nil)
	dir := t.TempDir()
	for _, tc := range []struct {
		id      string
		payload wire.ExecPayload
		want    string
	}{
		{"res-missing", wire.ExecPayload{Cmd: []string{"./missing.sh"}, Dir: dir}, "exec: ./missing.sh: not found"},
		{"res-bad-dir", wire.ExecPayload{Cmd: []string{"true"}, Dir: filepath.Join(dir, "nowhere")}, "no such directory"},
	} {
		b.publish(t, wire.TaskSubject("", "exec"), execTask(tc.id, tc.payload, `,"resource":"cam1"`))
		rec := b.waitState(t, tc.id, wire.TaskNeedsReview, 10*time.Second)
		if rec.Attempts != 1 || !strings.Contains(rec.LastError, tc.want) {
			t.Errorf("%s: record = attempts %d, last error %q; want 1 and %q", tc.id, rec.Attempts, rec.LastError, tc.want)
		}
	}
	after := resourceState(t, res, "cam1")
	if after.State != wire.ResourceAvailable || after.Revision != before.Revision {
		t.Errorf("cam1 = %s at revision %d, want AVAILABLE at %d (never leased, never RUNNING)", after.State, after.Revision, before.Revision)
	}
	// The resource still serves a task that can run.
	b.publish(t, wire.TaskSubject("", "exec"), execTask("res-ok", wire.ExecPayload{Cmd: []string{"true"}}, `,"resource":"cam1"`))
	b.waitState(t, "res-ok", wire.TaskSucceeded, 10*time.Second)
}

func TestExecCheckpointDir(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	// A worker process killed with SIGKILL left its files (no process has
	// pid 999999999); a live one's are kept.
	gone, live := filepath.Join(dir, "999999999-x"), filepath.Join(dir, strconv.Itoa(os.Getpid())+"-other")
	for _, d := range []string{gone, live} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "checkpoint-1.json"), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Registered before the workers start, so it runs after they stop.
	t.Cleanup(func() {
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 || entries[0].Name() != filepath.Base(live) {
			t.Errorf("checkpoint dir after Run = %v, want only the live worker's %s", entries, filepath.Base(live))
		}
	})
	// A relative dir: the task, run elsewhere, still finds its file.
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(cwd, dir)
	if err != nil {
		t.Fatal(err)
	}
	b.start(t, Config{Policy: fastPolicy, CheckpointDir: rel}, nil)
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("stat the dead worker's dir = %v, want it removed at start", err)
	}
	b.publish(t, wire.TaskSubject("", "exec"), execTask("cp-dir", wire.ExecPayload{
		Cmd: []string{"sh", "-c", `test -f "$GANTRY_CHECKPOINT_FILE" && echo "$GANTRY_CHECKPOINT_FILE"`}, Dir: "/",
	}, ""))
	rec := b.waitState(t, "cp-dir", wire.TaskSucceeded, 10*time.Second)
	path := strings.TrimSpace(rec.Output)
	if rel, err := filepath.Rel(dir, path); err != nil || strings.HasPrefix(rel, "..") || !strings.HasPrefix(rel, strconv.Itoa(os.Getpid())+"-") {
		t.Errorf("GANTRY_CHECKPOINT_FILE = %q, want a file in this worker's directory under %s", path, dir)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("stat the checkpoint file after the task = %v, want it removed", err)
	}
}
