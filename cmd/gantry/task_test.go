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

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/tasks"
)

// taskJSON runs 'gantry task get ID --json' and decodes the record.
func taskJSON(t *testing.T, url, id string) wire.TaskRecord {
	t.Helper()
	code, out, stderr := runInProcess(t, "task", "get", id, "--json", "--server", url)
	if code != exitOK {
		t.Fatalf("task get %s = exit %d (%s), want 0", id, code, stderr)
	}
	var rec wire.TaskRecord
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("task get %s --json: %v in %q", id, err, out)
	}
	return rec
}

// waitTaskState polls 'gantry task get' until the task is in state.
func waitTaskState(t *testing.T, url, id string, state wire.TaskState) wire.TaskRecord {
	t.Helper()
	var rec wire.TaskRecord
	poll.For(t, 20*time.Second, 50*time.Millisecond, func() error {
		if rec = taskJSON(t, url, id); rec.State != state {
			return fmt.Errorf("task %s state = %s (%s), want %s", id, rec.State, rec.LastError, state)
		}
		return nil
	})
	return rec
}

func TestSubmitAndTaskCommands(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS

	code, out, stderr := runInProcess(t, "submit", "noop", "--payload", `{"sleep":"10ms"}`, "--wait", "--server", url)
	if code != exitOK || !strings.Contains(out, "SUCCEEDED after 1 attempt(s)") {
		t.Fatalf("submit noop --wait = exit %d, %q (%s); want 0 and SUCCEEDED", code, out, stderr)
	}
	id := strings.Fields(out)[0]
	rec := taskJSON(t, url, id)
	if rec.ID != id || rec.Type != "noop" || rec.Queue != "default" || rec.State != wire.TaskSucceeded || rec.Attempts != 1 || rec.CreatedAt.IsZero() {
		t.Errorf("task get = %+v, want id %s, noop, default, SUCCEEDED, 1 attempt, created_at", rec.TaskInfo, id)
	}

	// A permanent failure: NEEDS_REVIEW after one attempt, and submit
	// --wait exits 1.
	code, out, _ = runInProcess(t, "submit", "exec", "--id", "perm-1", "--wait", "--server", url,
		"--payload", `{"cmd":["sh","-c","echo broken >&2; exit 3"],"fail_exit_codes":[3]}`)
	if code != exitFailure || !strings.Contains(out, "NEEDS_REVIEW") {
		t.Fatalf("submit failing exec --wait = exit %d, %q; want 1 and NEEDS_REVIEW", code, out)
	}
	rec = taskJSON(t, url, "perm-1")
	if rec.Attempts != 1 || !strings.Contains(rec.LastError, "broken") {
		t.Errorf("perm-1 = attempts %d, last error %q; want 1 and broken", rec.Attempts, rec.LastError)
	}
	code, out, _ = runInProcess(t, "task", "ls", "--state", "NEEDS_REVIEW", "--json", "--server", url)
	var list []wire.TaskRecord
	if err := json.Unmarshal([]byte(out), &list); code != exitOK || err != nil || len(list) != 1 || list[0].ID != "perm-1" {
		t.Errorf("task ls --state NEEDS_REVIEW = exit %d, %d tasks (%v); want perm-1 only", code, len(list), err)
	}

	// retry requeues it: it runs (and fails) again.
	if code, _, stderr := runInProcess(t, "task", "retry", "perm-1", "--server", url); code != exitOK {
		t.Fatalf("task retry = exit %d (%s), want 0", code, stderr)
	}
	poll.For(t, 20*time.Second, 50*time.Millisecond, func() error {
		if rec = taskJSON(t, url, "perm-1"); rec.State != wire.TaskNeedsReview || strings.HasPrefix(rec.LastError, "retried") {
			return fmt.Errorf("perm-1 after retry = %s (%s), want NEEDS_REVIEW again", rec.State, rec.LastError)
		}
		return nil
	})

	// Usage and lookup errors.
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"task", "retry", id}, exitUsage},
		{[]string{"task", "cancel", id}, exitUsage},
		{[]string{"task", "get", "nope"}, exitNotFound},
		{[]string{"task", "ls", "--state", "DONE"}, exitUsage},
		{[]string{"submit", "noop", "--payload", "{not json"}, exitUsage},
		{[]string{"submit", "no.op"}, exitUsage},
		{[]string{"submit", "noop", "--timeout", "soon"}, exitUsage},
		{[]string{"submit", "noop", "--id", "perm-1"}, exitUsage},
	} {
		if code, _, stderr := runInProcess(t, append(tc.args, "--server", url)...); code != tc.code {
			t.Errorf("%v = exit %d (%s), want %d", tc.args, code, stderr, tc.code)
		}
	}

	// key: the second submit names the first task and publishes nothing.
	_, out1, _ := runInProcess(t, "submit", "noop", "--key", "nightly-2026-11-30", "--server", url)
	_, out2, stderr := runInProcess(t, "submit", "noop", "--key", "nightly-2026-11-30", "--server", url)
	if strings.TrimSpace(out1) == "" || out1 != out2 || !strings.Contains(stderr, "not submitted again") {
		t.Errorf("submit --key twice = %q, %q (%s); want the same id, not submitted again", out1, out2, stderr)
	}

	// cancel: a running task stops, a waiting one is removed.
	runInProcess(t, "submit", "noop", "--id", "long-1", "--payload", `{"sleep":"1m"}`, "--server", url)
	waitTaskState(t, url, "long-1", wire.TaskRunning)
	if code, _, stderr := runInProcess(t, "task", "cancel", "long-1", "--server", url); code != exitOK {
		t.Fatalf("task cancel = exit %d (%s), want 0", code, stderr)
	}
	waitTaskState(t, url, "long-1", wire.TaskCancelled)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	runInProcess(t, "submit", "noop", "--id", "later-1", "--not-before", future, "--server", url)
	waitTaskState(t, url, "later-1", wire.TaskWaiting)
	// A --wait that runs out exits 5: the task may still finish.
	if code, out, stderr := runInProcess(t, "submit", "noop", "--id", "later-2", "--not-before", future, "--wait", "--wait-timeout", "300ms", "--server", url); code != exitWaitTimeout || strings.TrimSpace(out) != "later-2" {
		t.Errorf("submit --wait-timeout on a later task = exit %d, %q (%s); want 5 and the id", code, out, stderr)
	}
	if code, _, stderr := runInProcess(t, "task", "cancel", "later-1", "--server", url); code != exitOK {
		t.Fatalf("task cancel later-1 = exit %d (%s), want 0", code, stderr)
	}
	if rec := taskJSON(t, url, "later-1"); rec.State != wire.TaskCancelled {
		t.Errorf("later-1 = %s, want CANCELLED", rec.State)
	}
}

// waitTaskGone polls 'gantry task get' until it exits 4.
func waitTaskGone(t *testing.T, url, id string) {
	t.Helper()
	poll.For(t, 20*time.Second, 100*time.Millisecond, func() error {
		code, out, stderr := runInProcess(t, "task", "get", id, "--server", url)
		if code != exitOK && code != exitNotFound {
			t.Fatalf("task get %s = exit %d (%s%s), want 0 or 4", id, code, out, stderr)
		}
		if code != exitNotFound {
			return fmt.Errorf("task get %s = exit %d, want 4", id, code)
		}
		return nil
	})
}

// TestTaskRetention runs 'gantry run' with a 1 s task retention: a
// SUCCEEDED and a CANCELLED record disappear ('task get' exits 4), while a
// NEEDS_REVIEW record, and one retried from NEEDS_REVIEW, stay.
func TestTaskRetention(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "gantry.yaml")
	if err := os.WriteFile(path, []byte("workers: {task_retention: 1s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, ready := startGantry(t, "run", "--config", path, "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS
	submit := func(args ...string) {
		t.Helper()
		if code, out, stderr := runInProcess(t, append([]string{"submit", "--server", url}, args...)...); code != exitOK && code != exitFailure {
			t.Fatalf("submit %v = exit %d, %q (%s)", args, code, out, stderr)
		}
	}
	fail := `{"cmd":["sh","-c","exit 3"],"fail_exit_codes":[3]}`
	submit("noop", "--id", "done", "--wait")
	submit("exec", "--id", "review", "--payload", fail, "--wait")
	submit("exec", "--id", "retried", "--payload", fail, "--wait")
	submit("noop", "--id", "later", "--not-before", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	waitTaskState(t, url, "later", wire.TaskWaiting)
	if code, _, stderr := runInProcess(t, "task", "cancel", "later", "--task-retention", "1s", "--server", url); code != exitOK {
		t.Fatalf("task cancel later = exit %d (%s), want 0", code, stderr)
	}
	if code, _, stderr := runInProcess(t, "task", "retry", "retried", "--server", url); code != exitOK {
		t.Fatalf("task retry = exit %d (%s), want 0", code, stderr)
	}
	_, js := brokertest.Connect(t, url)
	if ttl := recordTTL(t, js, "retried"); ttl != "" {
		t.Errorf("Nats-TTL of the retried record = %q, want none", ttl)
	}
	// Written after the others: once its record is gone, theirs are past
	// the retention too.
	submit("noop", "--id", "last", "--wait")
	for _, id := range []string{"done", "later", "last"} {
		waitTaskGone(t, url, id)
	}
	for _, id := range []string{"review", "retried"} {
		if code, _, stderr := runInProcess(t, "task", "get", id, "--server", url); code != exitOK {
			t.Errorf("task get %s = exit %d (%s), want 0: a NEEDS_REVIEW or retried record does not expire", id, code, stderr)
		}
	}
	if code, _, stderr := runInProcess(t, "task", "cancel", "review", "--task-retention", "1500ms", "--server", url); code != exitUsage {
		t.Errorf("task cancel --task-retention 1500ms = exit %d (%s), want 2", code, stderr)
	}
}

// recordTTL returns the Nats-TTL header of task id's stored record.
func recordTTL(t *testing.T, js jetstream.JetStream, id string) string {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, "KV_"+wire.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, "$KV."+wire.BucketTasks+"."+id)
	if err != nil {
		t.Fatalf("raw record of %s: %v", id, err)
	}
	return m.Header.Get(jetstream.MsgTTLHeader)
}

func TestWorkerCommand(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "broker", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS
	w, _ := startGantry(t, "worker", "--server", url, "--data", t.TempDir(), "--queue", "batch=2", "--ack-wait", "2s")
	code, out, stderr := runInProcess(t, "submit", "exec", "--queue", "batch", "--wait", "--server", url,
		"--payload", `{"cmd":["sh","-c","echo task=$GANTRY_TASK_ID"]}`)
	if code != exitOK {
		t.Fatalf("submit to worker = exit %d, %q (%s); want 0", code, out, stderr)
	}
	rec := taskJSON(t, url, strings.Fields(out)[0])
	if !strings.Contains(rec.Output, "task="+rec.ID) {
		t.Errorf("output = %q, want task=%s", rec.Output, rec.ID)
	}

	// The worker runs a keeper: a lease that lapses is recorded even though
	// no 'gantry run' is there.
	if code, _, stderr := runInProcess(t, "lease", "acquire", "press-1", "--owner", "op", "--ttl", "1s", "--server", url); code != exitOK {
		t.Fatalf("lease acquire = exit %d (%s), want 0", code, stderr)
	}
	_, js := brokertest.Connect(t, url)
	waitForEvent(t, js, wire.EventLeaseExpired.Subject(), 15*time.Second)

	if err := w.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("worker after SIGTERM = %v, want exit 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("worker did not stop within 10s of SIGTERM")
	}
}

// defaultWorkerFlags are the worker flags at their defaults.
func defaultWorkerFlags() *workerFlags {
	f := &workerFlags{}
	f.register(&cobra.Command{})
	return f
}

func TestWorkerFlags(t *testing.T) {
	t.Parallel()
	f := defaultWorkerFlags()
	f.queues = []string{"default", "batch=3"}
	f.typeLimits = []string{"scan=2"}
	f.typePolicy = []string{"scan:max_attempts=2,backoff_base=3s,timeout=1m", "mail:delay=10s,no_handler_delay=2s"}
	cfg, err := f.config(brokertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Queues) != 2 || cfg.Queues[1].Name != "batch" || cfg.Queues[1].Concurrency != 3 || cfg.Queues[0].Concurrency != 64 {
		t.Fatalf("queues = %+v, want default (64) and batch (3)", cfg.Queues)
	}
	scan := cfg.Queues[0].Types["scan"]
	if scan.Concurrency != 2 || scan.Policy.MaxAttempts != 2 || scan.Policy.BackoffBase != 3*time.Second || scan.Policy.Timeout != time.Minute {
		t.Errorf("scan = %+v, want concurrency 2, 2 attempts, base 3s, timeout 1m", scan)
	}
	if mail := cfg.Queues[1].Types["mail"]; mail.Concurrency != 0 || mail.Policy.Delay != 10*time.Second || mail.Policy.NoHandlerDelay != 2*time.Second {
		t.Errorf("mail = %+v, want delay 10s, no handler delay 2s", mail)
	}
	if cfg.Policy.NoHandlerDelay != 5*time.Second || cfg.HeartbeatWindow != 5*time.Second || cfg.MaxDelays != 1000 {
		t.Errorf("no handler delay %v, heartbeat window %v, max delays %d; want 5s, 5s, 1000 by default", cfg.Policy.NoHandlerDelay, cfg.HeartbeatWindow, cfg.MaxDelays)
	}
	f.prioritize, f.window = []string{"batch"}, 50
	if cfg, err = f.config(brokertest.Logger(t)); err != nil || cfg.Queues[0].Prioritized || !cfg.Queues[1].Prioritized || cfg.Queues[1].PriorityWindow != 50 {
		t.Errorf("--prioritize batch --priority-window 50 = %+v, %v; want batch prioritized, window 50", cfg.Queues, err)
	}
	if cfg.TaskRetention != tasks.DefaultRetention {
		t.Errorf("TaskRetention = %v, want %v by default", cfg.TaskRetention, tasks.DefaultRetention)
	}
	for in, want := range map[string]time.Duration{"0": tasks.KeepForever, "30d": 30 * 24 * time.Hour, "2s": 2 * time.Second} {
		f := defaultWorkerFlags()
		if err := f.retention.Set(in); err != nil {
			t.Fatal(err)
		}
		if cfg, err := f.config(brokertest.Logger(t)); err != nil || cfg.TaskRetention != want {
			t.Errorf("--task-retention %s: TaskRetention = %v, %v; want %v", in, cfg.TaskRetention, err, want)
		}
	}
	// gantry run: the config file's task_retention, unless the flag is set.
	two := config.Retention(48 * time.Hour)
	file := &config.File{}
	file.Workers.TaskRetention = &two
	for changed, want := range map[bool]time.Duration{false: 48 * time.Hour, true: 3 * time.Second} {
		f := defaultWorkerFlags()
		f.retention = retentionValue(3 * time.Second)
		f.fromConfig(file, func(string) bool { return changed })
		if time.Duration(f.retention) != want {
			t.Errorf("fromConfig, flag set %v: retention %v, want %v", changed, time.Duration(f.retention), want)
		}
	}
	for _, bad := range []func(*workerFlags){
		func(f *workerFlags) { f.queues = []string{"a.b"} },
		func(f *workerFlags) { f.queues = []string{"a=0"} },
		func(f *workerFlags) { f.typeLimits = []string{"x"} },
		func(f *workerFlags) { f.typePolicy = []string{"x:retries=3"} },
		func(f *workerFlags) { f.typePolicy = []string{"x:timeout=soon"} },
		func(f *workerFlags) { f.typePolicy = []string{"max_attempts=3"} },
		func(f *workerFlags) { f.ackWait = time.Millisecond },
		func(f *workerFlags) { f.prioritize = []string{"nope"} },
		func(f *workerFlags) { f.window = 0 },
		func(f *workerFlags) { f.noHandler = 0 },
		func(f *workerFlags) { f.hbWindow = 0 },
		func(f *workerFlags) { f.maxDelays = 0 },
		func(f *workerFlags) { f.retention = retentionValue(1500 * time.Millisecond) },
	} {
		f := defaultWorkerFlags()
		bad(f)
		if _, err := f.config(brokertest.Logger(t)); exitCode(err) != exitUsage {
			t.Errorf("config(%+v) = %v, want a usage error", f, err)
		}
	}
}

// waitForEvent waits until the audit stream holds an event on subject.
func waitForEvent(t *testing.T, js jetstream.JetStream, subject string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	s, err := js.Stream(ctx, wire.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	poll.For(t, within, 50*time.Millisecond, func() error {
		if _, err := s.GetLastMsgForSubject(ctx, subject); err != nil {
			return fmt.Errorf("no event on %s: %w", subject, err)
		}
		return nil
	})
}

// TestCancelJustStartedFinishesOnce cancels tasks an instant after they
// start, while their record may still say WAITING: whichever of the worker
// and the CLI ends the task, TASK_FINISHED is recorded once per task.
func TestCancelJustStartedFinishesOnce(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS
	nc, js := brokertest.Connect(t, url)
	started, err := nc.SubscribeSync(wire.EventTaskStarted.Subject())
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"quick-1", "quick-2", "quick-3"}
	for _, id := range ids {
		if code, _, stderr := runInProcess(t, "submit", "noop", "--id", id, "--payload", `{"sleep":"1m"}`, "--server", url); code != exitOK {
			t.Fatalf("submit %s = exit %d (%s)", id, code, stderr)
		}
		if _, err := started.NextMsg(10 * time.Second); err != nil {
			t.Fatalf("no TASK_STARTED for %s: %v", id, err)
		}
		if code, _, stderr := runInProcess(t, "task", "cancel", id, "--server", url); code != exitOK {
			t.Fatalf("task cancel %s = exit %d (%s), want 0", id, code, stderr)
		}
		waitTaskState(t, url, id, wire.TaskCancelled)
	}
	// Let a second, wrong TASK_FINISHED arrive if one is coming: a span
	// to observe for something that must not happen, not a wait.
	time.Sleep(500 * time.Millisecond)
	finished := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, wire.StreamAudit, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.EventTaskFinished.Subject()}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			break
		}
		var ev wire.Event
		if err := json.Unmarshal(msg.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		finished[ev.TaskID]++
	}
	for _, id := range ids {
		if finished[id] != 1 {
			t.Errorf("TASK_FINISHED events for %s = %d, want 1", id, finished[id])
		}
	}
}
