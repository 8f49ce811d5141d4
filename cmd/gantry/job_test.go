package main

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
)

// jobCLI runs `gantry ARGS --server url`.
func jobCLI(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	return runInProcess(t, append(args, "--server", url)...)
}

// streamMsgs reads the messages of a stream on subject (all when empty)
// without consuming them.
func streamMsgs(t *testing.T, js jetstream.JetStream, stream, subject string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if subject == "" || m.Subject == subject {
			out = append(out, m)
		}
	}
	return out
}

func TestJobCommandsWithSchedulerProcess(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	url := env.URL
	startGantry(t, "scheduler", "--server", url, "--leader-ttl", "1s")

	// Bad input: exit 2 with the reason, and an audit event.
	code, _, stderr := jobCLI(t, url, "job", "add", "bad", "--type", "noop", "--cron", "61 * * * *")
	if code != exitUsage || !strings.Contains(stderr, "cron") {
		t.Errorf("job add with a bad cron = exit %d, stderr %q, want 2 naming the cron", code, stderr)
	}
	if code, _, stderr := jobCLI(t, url, "job", "add", "two", "--type", "noop", "--every", "1m", "--at", "2030-01-01 00:00"); code != exitUsage || !strings.Contains(stderr, "exactly one") {
		t.Errorf("job add with two triggers = exit %d, stderr %q, want 2", code, stderr)
	}
	poll.That(t, 20*time.Second, "CONFIG_REJECTED for the bad job", func() bool {
		return len(streamMsgs(t, env.JS, wire.StreamAudit, wire.EventConfigRejected.Subject())) >= 2
	})

	if code, out, stderr := jobCLI(t, url, "job", "add", "tick", "--type", "noop", "--every", "1s", "--overlap", "forbid",
		"--payload", `{"sleep":"10ms"}`, "--description", "every second"); code != exitOK || !strings.Contains(out, "job tick saved") {
		t.Fatalf("job add = exit %d, out %q, stderr %q", code, out, stderr)
	}
	if code, _, stderr := jobCLI(t, url, "job", "add", "manual", "--type", "noop", "--every", "1h", "--paused"); code != exitOK {
		t.Fatalf("job add manual = exit %d, stderr %q", code, stderr)
	}
	code, out, _ := jobCLI(t, url, "job", "ls", "--json")
	var jobs []map[string]any
	if err := json.Unmarshal([]byte(out), &jobs); err != nil || code != exitOK || len(jobs) != 2 {
		t.Fatalf("job ls --json = exit %d, %q (%v), want 2 jobs", code, out, err)
	}
	if jobs[1]["name"] != "tick" || jobs[1]["next_fire"] == nil || jobs[1]["overlap"] != "forbid" || jobs[0]["paused"] != true {
		t.Errorf("job ls --json = %v, want tick with a next fire and overlap forbid, manual paused", jobs)
	}

	// The scheduler fires tick once; with overlap forbid and no worker to
	// finish it, later planned times are skipped.
	poll.That(t, 20*time.Second, "a tick task", func() bool {
		return len(streamMsgs(t, env.JS, wire.StreamTasks, "gantry.tasks.default.noop")) >= 1
	})
	poll.That(t, 20*time.Second, "an overlap skip", func() bool {
		return len(streamMsgs(t, env.JS, wire.StreamAudit, wire.EventJobSkipped.Subject())) >= 1
	})
	var runs []wire.JobRun
	poll.That(t, 20*time.Second, "the run in the history", func() bool {
		code, out, _ := jobCLI(t, url, "job", "runs", "tick", "--json")
		return code == exitOK && json.Unmarshal([]byte(out), &runs) == nil && len(runs) == 1
	})
	if runs[0].State != wire.TaskWaiting || runs[0].Trigger != wire.TriggerSchedule || runs[0].Machine == "" {
		t.Errorf("run = %+v, want a WAITING scheduled run with its machine", runs[0])
	}
	if code, out, _ := jobCLI(t, url, "job", "runs", "tick"); code != exitOK || !strings.Contains(out, runs[0].TaskID) {
		t.Errorf("job runs = exit %d, %q, want a table with %s", code, out, runs[0].TaskID)
	}
	if code, _, stderr := jobCLI(t, url, "job", "trigger", "tick"); code != exitConflict || !strings.Contains(stderr, "forbids overlap") {
		t.Errorf("job trigger of a running forbid job = exit %d, stderr %q, want 3", code, stderr)
	}
	code, out, stderr = jobCLI(t, url, "job", "trigger", "manual")
	if code != exitOK || !strings.HasPrefix(strings.TrimSpace(out), "manual-manual-") {
		t.Errorf("job trigger manual = exit %d, out %q, stderr %q, want the task id", code, out, stderr)
	}

	if code, out, _ := jobCLI(t, url, "job", "pause", "tick"); code != exitOK || !strings.Contains(out, "paused") {
		t.Errorf("job pause = exit %d, %q", code, out)
	}
	code, out, _ = jobCLI(t, url, "job", "get", "tick", "--json")
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != exitOK || got["paused"] != true || got["source"] != "cli" {
		t.Errorf("job get --json = exit %d, %q, want paused, source cli", code, out)
	}
	if code, out, _ := jobCLI(t, url, "job", "get", "tick"); code != exitOK || !strings.Contains(out, "every 1s") {
		t.Errorf("job get = exit %d, %q, want a table with the trigger", code, out)
	}
	for _, args := range [][]string{{"job", "get", "nope"}, {"job", "rm", "nope"}, {"job", "pause", "nope"}, {"job", "runs", "nope"}, {"job", "trigger", "nope"}} {
		if code, _, stderr := jobCLI(t, url, args...); code != exitNotFound {
			t.Errorf("%v = exit %d (%s), want 4", args, code, stderr)
		}
	}
	if code, _, _ := jobCLI(t, url, "job", "rm", "tick"); code != exitOK {
		t.Errorf("job rm = exit %d, want 0", code)
	}
	if code, _, _ := jobCLI(t, url, "job", "get", "tick"); code != exitNotFound {
		t.Errorf("job get after rm = exit %d, want 4", code)
	}
}

func TestJobTriggerWithoutScheduler(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	code, _, stderr := jobCLI(t, env.URL, "job", "trigger", "x")
	if code != exitFailure || !strings.Contains(stderr, "no scheduler leads") {
		t.Errorf("job trigger without a scheduler = exit %d, stderr %q, want 1 saying no scheduler leads", code, stderr)
	}
	if code, out, stderr := jobCLI(t, env.URL, "job", "ls", "--json"); code != exitOK || strings.TrimSpace(out) != "[]" {
		t.Errorf("job ls --json on no jobs = exit %d, %q, %q, want []", code, out, stderr)
	}
	if code, _, stderr := jobCLI(t, env.URL, "job", "add", "late", "--type", "noop", "--at", "2020-01-01 00:00"); code != exitUsage || !strings.Contains(stderr, "in the past") {
		t.Errorf("job add --at in the past = exit %d, %q, want 2", code, stderr)
	}
	if code, out, _ := jobCLI(t, env.URL, "job", "add", "soon", "--type", "noop", "--at", time.Now().Add(time.Hour).Format(time.RFC3339)); code != exitOK || !strings.Contains(out, "next fire") {
		t.Errorf("job add --at in an hour = exit %d, %q, want 0", code, out)
	}
}

func TestRunAppliesConfigJobs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := writeConfig(t, `
jobs:
  - {name: beat, type: noop, every: 1s, payload: {sleep: 1ms}, misfire: skip}
  - {name: nightly, type: exec, cron: "0 3 * * *", timezone: Europe/Berlin, window: "02:00-05:00", payload: {cmd: [echo, hi]}}
`)
	_, ready := startGantry(t, "run", "--data", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http-listen", "", "--config", cfg)
	code, out, stderr := jobCLI(t, ready.NATS, "job", "ls", "--json")
	var jobs []map[string]any
	if err := json.Unmarshal([]byte(out), &jobs); err != nil || code != exitOK || len(jobs) != 2 {
		t.Fatalf("job ls --json = exit %d, %q, %q", code, out, stderr)
	}
	if jobs[0]["name"] != "beat" || jobs[0]["source"] != "config" || jobs[0]["every"] != "1s" || jobs[1]["timezone"] != "Europe/Berlin" {
		t.Errorf("jobs = %v, want beat and nightly from the config", jobs)
	}
	// Workers in the same process may take the task at once, so look for
	// the fire in the run history, not in the work-queue stream.
	poll.That(t, 20*time.Second, "a run of beat", func() bool {
		code, out, _ := jobCLI(t, ready.NATS, "job", "runs", "beat", "--json")
		var runs []wire.JobRun
		return code == exitOK && json.Unmarshal([]byte(out), &runs) == nil && len(runs) > 0 && runs[0].Job == "beat"
	})
}

func TestRunRefusesBadConfigJob(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, "jobs:\n  - {name: bad, type: noop, cron: \"61 * * * *\"}\n")
	code, _, stderr := runInProcess(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "", "--config", cfg)
	if code != exitUsage || !strings.Contains(stderr, "cron") {
		t.Errorf("run with a bad job = exit %d, stderr %q, want 2 naming the cron", code, stderr)
	}
}

func TestSchedulerRefusesBadConfigJob(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	cfg := writeConfig(t, "jobs:\n  - {name: bad, type: noop, every: 1m, overlap: sometimes}\n")
	code, _, stderr := jobCLI(t, env.URL, "scheduler", "--config", cfg)
	if code != exitUsage || !strings.Contains(stderr, "overlap") {
		t.Errorf("scheduler with a bad job = exit %d, stderr %q, want 2 naming overlap", code, stderr)
	}
	if got := streamMsgs(t, env.JS, wire.StreamAudit, wire.EventConfigRejected.Subject()); len(got) != 1 {
		t.Errorf("CONFIG_REJECTED events = %d, want 1", len(got))
	}
}

// A bad definition is bad input (exit 2) whether or not a broker answers.
func TestJobAddRefusesBadDefinitionOffline(t *testing.T) {
	t.Parallel()
	code, _, stderr := runInProcess(t, "job", "add", "bad", "--type", "noop", "--cron", "TZ=UTC", "--server", "nats://127.0.0.1:1")
	if code != exitUsage || !strings.Contains(stderr, "timezone") {
		t.Errorf("job add with cron TZ=UTC and no broker = exit %d, stderr %q; want 2 pointing to --timezone", code, stderr)
	}
}
