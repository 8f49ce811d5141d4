package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/metricstest"
	"github.com/gantry-dev/gantry/internal/proxytest"
)

// scrape reads /metrics of base (the ready line's http), returning the
// text and its families.
func scrape(t *testing.T, base string) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	if !strings.HasPrefix(base, "http://") {
		t.Fatalf("ready line's http = %q, want http://host:port", base)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %d, %v", resp.StatusCode, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return string(body), families
}

// value returns the value of the series of name whose labels include
// labels (a histogram's sample count), and whether there is one.
func value(families map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	return metricstest.Value(families[name], labels...)
}

// submitWait submits a task and waits for its end, returning its state.
func submitWait(t *testing.T, url string, args ...string) string {
	t.Helper()
	_, state := submitWaitID(t, url, args...)
	return state
}

// submitWaitID is submitWait, also returning the task's id.
func submitWaitID(t *testing.T, url string, args ...string) (id, state string) {
	t.Helper()
	code, stdout, stderr := runInProcess(t, append(append([]string{"submit"}, args...), "--wait", "--json", "--server", url)...)
	var rec struct {
		ID    string `json:"id"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(stdout), &rec); err != nil {
		t.Fatalf("submit %v = exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
	}
	return rec.ID, rec.State
}

// bulk runs a bulk task command (task purge, task retry --all) with
// --json and decodes its result.
func bulk(t *testing.T, url string, args ...string) (client.BulkResult, int, string) {
	t.Helper()
	code, stdout, stderr := runInProcess(t, append(slices.Clip(args), "--json", "--server", url)...)
	var res client.BulkResult
	if code == exitOK {
		if err := json.Unmarshal([]byte(stdout), &res); err != nil {
			t.Fatalf("gantry %v --json printed %q: %v", args, stdout, err)
		}
	}
	return res, code, stderr
}

// promtool finds promtool, failing under CI when it is missing and
// skipping loudly otherwise.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatal("promtool is missing: install Debian's prometheus package (.ci/run does)")
	}
	t.Skip("SKIPPED: promtool is not installed (apt-get install prometheus); CI runs this check")
	return ""
}

func TestMetricsAfterRealTraffic(t *testing.T) {
	t.Parallel()
	site := okSite(t)
	proxy := proxytest.Start(t, proxytest.HTTPConnect)
	var hookCalls atomic.Int64
	failingHook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hookCalls.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(failingHook.Close)
	dir := t.TempDir()
	cfg := writeConfig(t, fmt.Sprintf(`routes:
  - {id: good, proxy: %q, probe_url: %q, interval: 1h}
  - {id: bad, proxy: "socks5://%s", probe_url: %q, interval: 1h}
resources:
  - {id: cam1}
jobs:
  - {name: tick, type: noop, queue: jobs, every: 1s}
  - {name: held, type: noop, queue: jobs, every: 1s, overlap: forbid}
alerts:
  check_interval: 100ms
  rules:
    - {name: review, kind: needs_review, window: 1h}
  webhooks:
    - {name: down, url: %q, retry_base: 50ms, max_attempts: 3}
`, proxy.URL(), site.URL, proxytest.ClosedAddr(t), site.URL, failingHook.URL))
	_, ready := startGantry(t, "run", "--config", cfg, "--data", dir, "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
		"--backoff-base", "100ms", "--backoff-max", "200ms", "--delay", "100ms")
	url := ready.NATS

	// A task that goes to NEEDS_REVIEW (and whose alert's webhook fails),
	// then successes, a retry that succeeds, and a task under a lease.
	if got := submitWait(t, url, "exec", "--payload", `{"cmd":["sh","-c","exit 3"],"fail_exit_codes":[3]}`); got != "NEEDS_REVIEW" {
		t.Fatalf("exec exit 3 ended %s, want NEEDS_REVIEW", got)
	}
	for range 3 {
		if got := submitWait(t, url, "noop"); got != "SUCCEEDED" {
			t.Fatalf("noop ended %s, want SUCCEEDED", got)
		}
	}
	marker := filepath.Join(dir, "marker")
	flaky := fmt.Sprintf(`{"cmd":["sh","-c","test -f %s || { touch %s; exit 1; }"]}`, marker, marker)
	if got := submitWait(t, url, "exec", "--payload", flaky); got != "SUCCEEDED" {
		t.Fatalf("flaky exec ended %s, want SUCCEEDED after a retry", got)
	}
	if got := submitWait(t, url, "exec", "--resource", "cam1", "--payload", `{"cmd":["true"]}`); got != "SUCCEEDED" {
		t.Fatalf("exec on cam1 ended %s, want SUCCEEDED", got)
	}
	// An operator holds cam1's lease until the metrics have shown it.
	if code, _, stderr := runInProcess(t, "lease", "acquire", "cam1", "--owner", "ops", "--ttl", "5m", "--server", url); code != exitOK {
		t.Fatalf("lease acquire cam1 = exit %d, %s", code, stderr)
	}
	// The bad route's probes fail until it cools down.
	poll.For(t, 20*time.Second, 10*time.Millisecond, func() error {
		for _, r := range routeLs(t, url) {
			if r["id"] == "bad" && r["state"] == "COOLDOWN" {
				return nil
			}
		}
		runInProcess(t, "route", "probe", "bad", "--apply", "--server", url)
		return fmt.Errorf("route bad is not in COOLDOWN yet")
	})
	// The failing webhook is being retried, and tasks ran all the same.
	poll.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := hookCalls.Load(); n < 2 {
			return fmt.Errorf("webhook calls = %d, want retries", n)
		}
		return nil
	})

	var text string
	poll.For(t, 30*time.Second, 200*time.Millisecond, func() error {
		var fams map[string]*dto.MetricFamily
		text, fams = scrape(t, ready.HTTP)
		for _, c := range []struct {
			name   string
			labels []string
			ok     func(float64) bool
			want   string
		}{
			{"gantry_tasks_finished_total", []string{"type", "noop", "state", "SUCCEEDED", "queue", "default"}, eq(3), "3"},
			{"gantry_tasks_finished_total", []string{"type", "exec", "state", "SUCCEEDED"}, eq(2), "2"},
			{"gantry_tasks_finished_total", []string{"type", "exec", "state", "NEEDS_REVIEW"}, eq(1), "1"},
			{"gantry_task_retries_total", []string{"type", "exec", "class", "retry"}, eq(1), "1"},
			{"gantry_task_errors_total", []string{"type", "exec", "kind", "failed"}, eq(1), "1"},
			{"gantry_task_errors_total", []string{"type", "exec", "kind", "permanent"}, eq(1), "1"},
			{"gantry_task_wait_seconds", []string{"type", "noop", "queue", "default"}, eq(3), "3 observations"},
			{"gantry_task_run_seconds", []string{"type", "exec"}, eq(4), "4 observations"},
			{"gantry_task_recovery_seconds", []string{"type", "exec"}, eq(1), "1 observation"},
			{"gantry_tasks", []string{"queue", "default", "state", "NEEDS_REVIEW"}, eq(1), "1"},
			{"gantry_tasks_needs_review", []string{"queue", "default", "type", "exec"}, eq(1), "1"},
			{"gantry_tasks", []string{"queue", "jobs", "state", "WAITING"}, atLeast(1), "at least 1 (the job's tasks, no worker)"},
			{"gantry_consumer_pending", []string{"queue", "default"}, eq(0), "0"},
			{"gantry_leases_held", nil, eq(1), "1 (the operator's)"},
			{"gantry_resource_state", []string{"resource", "cam1", "state", "LEASED"}, eq(1), "1"},
			{"gantry_resource_state", []string{"resource", "cam1", "state", "AVAILABLE"}, eq(0), "0"},
			{"gantry_resource_utilisation_ratio", []string{"resource", "cam1"}, atLeast(0), "a ratio"},
			{"gantry_route_state", []string{"route", "bad", "state", "COOLDOWN"}, eq(1), "1"},
			{"gantry_route_state", []string{"route", "good", "state", "AVAILABLE"}, eq(1), "1"},
			{"gantry_route_score", []string{"route", "good"}, atLeast(50), "at least 50"},
			{"gantry_cooldowns", []string{"kind", "route"}, eq(1), "1"},
			{"gantry_workers", nil, eq(1), "1"},
			{"gantry_scheduler_leader", nil, eq(1), "1"},
			{"gantry_scheduler_fires_total", []string{"job", "tick"}, atLeast(1), "at least 1"},
			{"gantry_scheduler_fires_total", []string{"job", "held"}, eq(1), "1 (its run never ends)"},
			{"gantry_scheduler_skips_total", []string{"job", "held", "reason", "overlap"}, atLeast(1), "at least 1"},
			{"gantry_scheduler_fire_lag_seconds", nil, atLeast(1), "observations"},
			{"gantry_auditd_events_stored_total", nil, atLeast(10), "at least 10"},
			{"gantry_auditd_pending_events", nil, atLeast(0), "a gauge"},
			{"gantry_auditd_lag_seconds", nil, atLeast(0), "a gauge"},
			{"gantry_alertd_deliveries_total", []string{"sink", "down", "outcome", "retried"}, atLeast(1), "at least 1"},
			{"gantry_stats_problems", nil, eq(0), "0"},
			{"go_goroutines", nil, atLeast(1), "the Go collector"},
			{"process_cpu_seconds_total", nil, atLeast(0), "the process collector"},
		} {
			got, ok := value(fams, c.name, c.labels...)
			if !ok || !c.ok(got) {
				return fmt.Errorf("%s%v = %v (present %v), want %s", c.name, c.labels, got, ok, c.want)
			}
		}
		return nil
	})

	// The same picture through 'gantry stats --json', once the worker's
	// presence (written every 5 s) holds the traffic.
	poll.For(t, 15*time.Second, 200*time.Millisecond, func() error {
		code, stdout, stderr := runInProcess(t, "stats", "--json", "--server", url)
		var st client.Stats
		if err := json.Unmarshal([]byte(stdout), &st); err != nil || code != exitOK {
			t.Fatalf("stats --json = exit %d, %q, stderr %q", code, stdout, stderr)
		}
		var def client.QueueStats
		for _, q := range st.Queues {
			if q.Queue == "default" {
				def = q
			}
		}
		if def.NeedsReview != 1 || def.Succeeded != 5 || def.Failed != 1 || def.Retries != 1 || def.RunP99 == nil || def.WaitP50 == nil ||
			def.ThroughputPerMin <= 0 || len(st.Workers) != 1 || !st.Scheduler.Leading || len(st.Resources) != 1 || st.Resources[0].Utilisation == nil {
			return fmt.Errorf("stats = %+v, default queue %+v; want 1 needing review, 5 succeeded, 1 failed, 1 retry, percentiles, a worker, a leader, cam1's utilisation", st, def)
		}
		return nil
	})

	if code, _, stderr := runInProcess(t, "lease", "release", "cam1", "--owner", "ops", "--server", url); code != exitOK {
		t.Fatalf("lease release cam1 = exit %d, %s", code, stderr)
	}

	// A task whose first attempt asks to be tried later (a delay exit
	// code): a retry of class delay, and an error of kind delayed.
	delayed := filepath.Join(dir, "delayed")
	payload := fmt.Sprintf(`{"cmd":["sh","-c","test -f %s || { touch %s; exit 75; }"],"delay_exit_codes":[75]}`, delayed, delayed)
	if got := submitWait(t, url, "exec", "--payload", payload); got != "SUCCEEDED" {
		t.Fatalf("delayed exec ended %s, want SUCCEEDED after a delay", got)
	}
	poll.For(t, 10*time.Second, 100*time.Millisecond, func() error {
		_, fams := scrape(t, ready.HTTP)
		for _, c := range []struct {
			name   string
			labels []string
			want   float64
		}{
			{"gantry_task_retries_total", []string{"type", "exec", "class", "delay"}, 1},
			{"gantry_task_retries_total", []string{"type", "exec", "class", "retry"}, 1},
			{"gantry_task_errors_total", []string{"type", "exec", "kind", "delayed"}, 1},
			{"gantry_tasks_finished_total", []string{"type", "exec", "state", "SUCCEEDED"}, 3},
		} {
			if got, ok := value(fams, c.name, c.labels...); !ok || got != c.want {
				return fmt.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
			}
		}
		return nil
	})

	// Bulk review, counted on a dry run, then done, each audited. A
	// second exec task needs review. --older-than 3s selects the three
	// noop tasks once they are that old, and not a fresh one.
	if got := submitWait(t, url, "exec", "--payload", `{"cmd":["sh","-c","exit 3"],"fail_exit_codes":[3]}`); got != "NEEDS_REVIEW" {
		t.Fatalf("second exec exit 3 ended %s, want NEEDS_REVIEW", got)
	}
	purgeOld := []string{"task", "purge", "--state", "SUCCEEDED", "--type", "noop", "--queue", "default", "--older-than", "3s"}
	poll.For(t, 15*time.Second, 100*time.Millisecond, func() error {
		if res, code, stderr := bulk(t, url, append(purgeOld, "--dry-run")...); code != exitOK || res.Matched != 3 {
			return fmt.Errorf("purge --older-than 3s --dry-run = exit %d, %+v (stderr %q); want the 3 noop tasks once they are 3s old", code, res, stderr)
		}
		return nil
	})
	fresh, state := submitWaitID(t, url, "noop")
	if state != "SUCCEEDED" {
		t.Fatalf("fresh noop ended %s, want SUCCEEDED", state)
	}
	var retried []string
	for _, tc := range []struct {
		args []string
		want client.BulkResult
	}{
		{[]string{"task", "purge", "--state", "SUCCEEDED", "--type", "noop", "--queue", "default", "--dry-run"}, client.BulkResult{Matched: 4, DryRun: true}},
		{append(purgeOld, "--dry-run"), client.BulkResult{Matched: 3, DryRun: true}},
		{purgeOld, client.BulkResult{Matched: 3, Done: 3}},
		{[]string{"task", "retry", "--all", "--type", "exec", "--dry-run"}, client.BulkResult{Matched: 2, DryRun: true}},
		{[]string{"task", "retry", "--all", "--type", "exec"}, client.BulkResult{Matched: 2, Done: 2}},
	} {
		res, code, stderr := bulk(t, url, tc.args...)
		if code != exitOK || res.Matched != tc.want.Matched || res.Done != tc.want.Done || res.DryRun != tc.want.DryRun || len(res.IDs) != res.Matched {
			t.Errorf("gantry %v = exit %d, %+v (stderr %q); want %+v", tc.args, code, res, stderr, tc.want)
		}
		if slices.Contains(tc.args, "--older-than") && slices.Contains(res.IDs, fresh) {
			t.Errorf("gantry %v selected %s, which ended under 3s ago", tc.args, fresh)
		}
		if tc.args[1] == "retry" && !tc.want.DryRun {
			retried = res.IDs
		}
	}
	code, stdout, _ := runInProcess(t, "task", "ls", "--state", "SUCCEEDED", "--type", "noop", "--json", "--server", url)
	var left []client.TaskRecord
	if err := json.Unmarshal([]byte(stdout), &left); err != nil || code != exitOK || len(left) != 1 || left[0].ID != fresh {
		t.Errorf("task ls after purge = exit %d, %q; want the fresh noop %s alone", code, stdout, fresh)
	}
	waitQuery(t, url, 3, "--type", "TASK_PURGED")
	// One RETRY_SCHEDULED by the operator per task retried, in the audit
	// stream once the command has returned.
	_, js := brokertest.Connect(t, url)
	byOperator := map[string]int{}
	for _, m := range streamMsgs(t, js, wire.StreamAudit, wire.EventRetryScheduled.Subject()) {
		var ev wire.Event
		var p struct{ Class string }
		if err := json.Unmarshal(m.Data, &ev); err != nil || json.Unmarshal(ev.Payload, &p) != nil {
			t.Fatalf("RETRY_SCHEDULED event %s", m.Data)
		}
		if p.Class == "operator" {
			byOperator[ev.TaskID]++
		}
	}
	if len(byOperator) != len(retried) {
		t.Errorf("operator RETRY_SCHEDULED events by task = %v, want one for each of %v", byOperator, retried)
	}
	for _, id := range retried {
		if byOperator[id] != 1 {
			t.Errorf("operator RETRY_SCHEDULED events for %s = %d, want 1", id, byOperator[id])
		}
	}

	t.Run("promtool", func(t *testing.T) {
		tool := promtool(t)
		cmd := exec.Command(tool, "check", "metrics")
		cmd.Stdin = strings.NewReader(text)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	})
}

func eq(want float64) func(float64) bool      { return func(v float64) bool { return v == want } }
func atLeast(want float64) func(float64) bool { return func(v float64) bool { return v >= want } }

// workerLs runs 'gantry worker ls --json'.
func workerLs(t *testing.T, url string) []client.WorkerInfo {
	t.Helper()
	code, stdout, stderr := runInProcess(t, "worker", "ls", "--json", "--server", url)
	var out []client.WorkerInfo
	if err := json.Unmarshal([]byte(stdout), &out); err != nil || code != exitOK {
		t.Fatalf("worker ls --json = exit %d, %q, stderr %q", code, stdout, stderr)
	}
	return out
}

// queueLs runs 'gantry queue ls --json' and returns queue's line.
func queueLs(t *testing.T, url, queue string) client.QueueStats {
	t.Helper()
	code, stdout, stderr := runInProcess(t, "queue", "ls", "--json", "--server", url)
	var out []client.QueueStats
	if err := json.Unmarshal([]byte(stdout), &out); err != nil || code != exitOK {
		t.Fatalf("queue ls --json = exit %d, %q, stderr %q", code, stdout, stderr)
	}
	for _, q := range out {
		if q.Queue == queue {
			return q
		}
	}
	return client.QueueStats{Queue: queue}
}

func TestSplitWorkersPresenceAndQueuePause(t *testing.T) {
	t.Parallel()
	_, b := startGantry(t, "broker", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := b.NATS
	worker := func(name string) *exec.Cmd {
		cmd, _ := startGantry(t, "worker", "--server", url, "--worker-name", name, "--presence-interval", "1s",
			"--concurrency", "1", "--data", t.TempDir())
		return cmd
	}
	w1, w2 := worker("w1"), worker("w2")

	// Two live workers; a killed one lapses within its TTL (3 s).
	poll.For(t, 10*time.Second, 100*time.Millisecond, func() error {
		list := workerLs(t, url)
		if len(list) != 2 || list[0].Name != "w1" || list[1].Name != "w2" {
			return fmt.Errorf("worker ls = %+v, want w1 and w2", list)
		}
		for _, w := range list {
			if w.Host == "" || w.PID == 0 || len(w.Queues) != 1 || w.Queues[0] != "default" || w.Version == "" || w.TTL != "3s" {
				return fmt.Errorf("worker %+v: want host, pid, queue default, a version and TTL 3s", w)
			}
		}
		return nil
	})
	code, stdout, _ := runInProcess(t, "worker", "ls", "--server", url)
	if code != exitOK || !strings.Contains(stdout, "w1") || !strings.Contains(stdout, "HEARTBEAT") {
		t.Errorf("worker ls = exit %d, %q; want a table with w1", code, stdout)
	}
	if err := w2.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = w2.Wait()
	killed := time.Now()
	poll.For(t, 10*time.Second, 100*time.Millisecond, func() error {
		if list := workerLs(t, url); len(list) != 1 || list[0].Name != "w1" {
			return fmt.Errorf("worker ls = %+v, want w1 alone", list)
		}
		return nil
	})
	if gone := time.Since(killed); gone > 5*time.Second {
		t.Errorf("killed worker listed for %v, want within its 3s TTL (and a poll)", gone)
	}

	// A paused queue holds its tasks, across a worker's restart.
	if code, _, stderr := runInProcess(t, "queue", "pause", "default", "--reason", "maintenance", "--server", url); code != exitOK {
		t.Fatalf("queue pause = exit %d, %s", code, stderr)
	}
	out := filepath.Join(t.TempDir(), "order")
	var ids []string
	for i := range 5 {
		code, stdout, stderr := runInProcess(t, "submit", "exec", "--server", url,
			"--payload", fmt.Sprintf(`{"cmd":["sh","-c","echo %d >> %s"]}`, i, out))
		if code != exitOK {
			t.Fatalf("submit = exit %d, %s", code, stderr)
		}
		ids = append(ids, strings.TrimSpace(stdout))
	}
	if err := w1.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = w1.Wait()
	worker("w3")
	poll.For(t, 10*time.Second, 100*time.Millisecond, func() error {
		if list := workerLs(t, url); len(list) != 1 || list[0].Name != "w3" {
			return fmt.Errorf("worker ls = %+v, want w3 alone", list)
		}
		q := queueLs(t, url, "default")
		if !q.Paused || q.PauseReason != "maintenance" || q.Waiting != 5 || q.Running != 0 || len(q.Consumers) != 1 || !q.Consumers[0].Paused {
			return fmt.Errorf("queue default = %+v, want paused (maintenance), 5 waiting, a paused consumer", q)
		}
		return nil
	})
	// w3 has written its presence twice since it started: it consumes,
	// and runs nothing.
	first := workerLs(t, url)[0].Heartbeat
	poll.For(t, 10*time.Second, 100*time.Millisecond, func() error {
		if w := workerLs(t, url)[0]; !w.Heartbeat.After(first) {
			return fmt.Errorf("w3 heartbeat %v, want one after %v", w.Heartbeat, first)
		}
		return nil
	})
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a task of the paused queue ran: %v", err)
	}

	if code, _, stderr := runInProcess(t, "queue", "resume", "default", "--server", url); code != exitOK {
		t.Fatalf("queue resume = exit %d, %s", code, stderr)
	}
	poll.For(t, 15*time.Second, 100*time.Millisecond, func() error {
		data, _ := os.ReadFile(out)
		if got := strings.Fields(string(data)); strings.Join(got, " ") != "0 1 2 3 4" {
			return fmt.Errorf("tasks ran %v, want 0 1 2 3 4", got)
		}
		return nil
	})
	for _, id := range ids {
		code, stdout, _ := runInProcess(t, "task", "get", id, "--json", "--server", url)
		if code != exitOK || !strings.Contains(stdout, `"SUCCEEDED"`) {
			t.Errorf("task %s = exit %d, %s; want SUCCEEDED", id, code, stdout)
		}
	}
	// The pause and the resume are audit events on gantry.audit.>, in
	// that order.
	_, js := brokertest.Connect(t, url)
	var queueEvents []wire.Event
	for _, typ := range []wire.EventType{wire.EventQueuePaused, wire.EventQueueResumed} {
		for _, m := range streamMsgs(t, js, wire.StreamAudit, typ.Subject()) {
			var ev wire.Event
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatalf("%s event %s: %v", typ, m.Data, err)
			}
			queueEvents = append(queueEvents, ev)
		}
	}
	if len(queueEvents) != 2 || queueEvents[0].Type != wire.EventQueuePaused || queueEvents[1].Type != wire.EventQueueResumed ||
		!queueEvents[0].Time.Before(queueEvents[1].Time) {
		t.Fatalf("queue events = %+v, want QUEUE_PAUSED then QUEUE_RESUMED", queueEvents)
	}
	for i, wantReason := range []string{"maintenance", ""} {
		var p struct{ Queue, Reason, By string }
		if err := json.Unmarshal(queueEvents[i].Payload, &p); err != nil || p.Queue != "default" || p.Reason != wantReason || p.By == "" {
			t.Errorf("%s payload %s; want queue default, reason %q, who", queueEvents[i].Type, queueEvents[i].Payload, wantReason)
		}
	}

	// 'worker ls' shows the task w3 runs, until it ends.
	stop := filepath.Join(t.TempDir(), "stop")
	code, stdout, stderr := runInProcess(t, "submit", "exec", "--server", url,
		"--payload", fmt.Sprintf(`{"cmd":["sh","-c","while [ ! -f %s ]; do sleep 0.05; done"]}`, stop))
	if code != exitOK {
		t.Fatalf("submit = exit %d, %s", code, stderr)
	}
	running := strings.TrimSpace(stdout)
	poll.For(t, 10*time.Second, 100*time.Millisecond, func() error {
		w := workerLs(t, url)[0]
		if w.Running != 1 || len(w.Tasks) != 1 || w.Tasks[0].ID != running || w.Tasks[0].Type != "exec" || w.Tasks[0].Queue != "default" ||
			w.Tasks[0].StartedAt.IsZero() {
			return fmt.Errorf("w3 = running %d, tasks %+v; want exec task %s of queue default, started", w.Running, w.Tasks, running)
		}
		if col := workerColumn(t, url, "w3", "RUNNING"); col != "1" {
			return fmt.Errorf("worker ls: w3's RUNNING = %q, want 1", col)
		}
		return nil
	})
	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 10*time.Second, 100*time.Millisecond, func() error {
		if w := workerLs(t, url)[0]; w.Running != 0 || len(w.Tasks) != 0 {
			return fmt.Errorf("w3 = running %d, tasks %+v; want none once the task ended", w.Running, w.Tasks)
		}
		if col := workerColumn(t, url, "w3", "RUNNING"); col != "0" {
			return fmt.Errorf("worker ls: w3's RUNNING = %q, want 0", col)
		}
		return nil
	})
}

// workerColumn returns the cell of worker's row under column in the table
// 'gantry worker ls' prints.
func workerColumn(t *testing.T, url, worker, column string) string {
	t.Helper()
	code, stdout, stderr := runInProcess(t, "worker", "ls", "--server", url)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != exitOK || len(lines) < 2 {
		t.Fatalf("worker ls = exit %d, %q, stderr %q", code, stdout, stderr)
	}
	col := slices.Index(strings.Fields(lines[0]), column)
	if col < 0 {
		t.Fatalf("worker ls header %q has no %s", lines[0], column)
	}
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > col && f[0] == worker {
			return f[col]
		}
	}
	t.Fatalf("worker ls = %q, no row for %s", stdout, worker)
	return ""
}
