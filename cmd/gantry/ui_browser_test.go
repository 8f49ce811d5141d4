package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/dashboard"
	"github.com/gantry-dev/gantry/internal/audit"
	poll "github.com/gantry-dev/gantry/internal/check"
)

var updateScreenshots = flag.Bool("update-screenshots", false, "write the dashboard's screenshots into docs/screenshots")

// chromium returns the path of Debian's chromium. Without it the browser
// tests skip, saying so loudly; under CI (CI set) they fail.
func chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	const why = "chromium is missing: the dashboard's browser tests cannot run (apt-get install chromium; .ci/run installs it)"
	if os.Getenv("CI") != "" {
		t.Fatal(why)
	}
	t.Skip("SKIPPED: " + why)
	return ""
}

// consoleLog gathers what the pages write to the console and throw.
type consoleLog struct {
	mu   sync.Mutex
	errs []string
}

func (l *consoleLog) problems() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errs...)
}

// startBrowser starts headless chromium with a fresh profile, for the
// test, and gathers its console errors and uncaught exceptions.
func startBrowser(t testing.TB, path string) (context.Context, *consoleLog) {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir()), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1440, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// Start the browser now, so that the console is followed from the
	// first page on.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	log := &consoleLog{}
	msgs := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				log.mu.Lock()
				log.errs = append(log.errs, fmt.Sprintf("%s: %s (%s)", m.Type, m.Text, m.URL))
				log.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ctx, log
}

// tab is a browser tab on the dashboard at base.
type tab struct {
	t    testing.TB
	ctx  context.Context
	base string
}

func (p tab) open(path string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.Navigate(p.base+path)); err != nil {
		p.t.Fatalf("open %s: %v", path, err)
	}
}

// eval evaluates expr in the page.
func eval[T any](p tab, expr string) (T, error) {
	return chromedp.Run(p.ctx, chromedp.Evaluate[T](expr))
}

// wait polls expr (a boolean JavaScript expression) in the page until it
// is true; the page may navigate meanwhile.
func (p tab) wait(what, expr string) {
	p.t.Helper()
	poll.For(p.t, 30*time.Second, 100*time.Millisecond, func() error {
		ok, err := eval[bool](p, "!!("+expr+")")
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if !ok {
			return fmt.Errorf("%s: not yet", what)
		}
		return nil
	})
}

// click clicks the element sel, once it is visible, within 30 s.
func (p tab) click(sel string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible)); err != nil {
		p.t.Fatalf("click %s: %v", sel, err)
	}
}

// shot takes a screenshot of the whole page; with -update-screenshots it
// is written as docs/screenshots/<name>.png.
func (p tab) shot(name string) {
	p.t.Helper()
	png, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	if len(png) == 0 {
		p.t.Fatalf("screenshot %s is empty", name)
	}
	if !*updateScreenshots {
		return
	}
	dir := filepath.Join("..", "..", "docs", "screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// dashboardSystem starts 'gantry run' with a config of routes (one healthy,
// one whose proxy refuses), resources and jobs, and returns its ready line
// (its dashboard at HTTP, its broker at NATS) and a client.
func dashboardSystem(t testing.TB) (ready logLine, c *client.Client) {
	t.Helper()
	probe := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(probe.Close)
	closed := freePort(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gantry.yaml")
	yaml := fmt.Sprintf(`routes:
  - {id: office, proxy: direct, probe_url: "%[1]s", interval: 2s}
  - {id: eu-proxy, proxy: "http://%[2]s", probe_url: "%[1]s", interval: 2s}
resources:
  - {id: cam1, route: office}
  - {id: printer}
  - {id: plc-line-2}
jobs:
  - {name: heartbeat, type: noop, every: 1m, description: "liveness check"}
  - {name: nightly-report, type: exec, cron: "0 2 * * *", queue: reports, payload: {cmd: [sh, -c, "echo report"]}}
  - {name: archive, type: noop, every: 1h}
`, probe.URL, closed)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	_, ready = startGantry(t, "run", "--config", cfg, "--data", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0",
		"--http-listen", "127.0.0.1:0", "--queue", "default", "--queue", "reports")
	return ready, connectClient(t, ready.NATS)
}

func submit(t testing.TB, c *client.Client, task client.Task) string {
	t.Helper()
	sub, err := c.Submit(t.Context(), task)
	if err != nil {
		t.Fatalf("submit %s: %v", task.Type, err)
	}
	return sub.ID
}

func waitState(t *testing.T, c *client.Client, id string, want ...client.TaskState) client.TaskRecord {
	t.Helper()
	var rec client.TaskRecord
	poll.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		var err error
		if rec, err = c.Task(t.Context(), id); err != nil {
			return err
		}
		for _, w := range want {
			if rec.State == w {
				return nil
			}
		}
		return fmt.Errorf("task %s is %s, want %v", id, rec.State, want)
	})
	return rec
}

// TestDashboardInBrowser drives the dashboard of 'gantry run' in headless
// chromium: every page loads without a console error; a submitted task
// appears and reaches SUCCEEDED without a reload, and its events reach
// the live tail; a NEEDS_REVIEW task is retried from its page; a held
// resource shows its holder. It takes the screenshots of docs/. Its
// subtests go on with the same system and browser: the task list's
// filters, a task's audit events, every action clicked through its
// confirm dialog, the audit page's filters and paging, and 'gantry ui'.
func TestDashboardInBrowser(t *testing.T) {
	t.Parallel()
	chrome := chromium(t)
	sys, c := dashboardSystem(t)
	base := sys.HTTP
	ctx := t.Context()

	// Real data: tasks that succeeded, failed, were cancelled, wait for a
	// held resource, run; a resource disabled, a job paused, runs of a job.
	for i := range 6 {
		submit(t, c, client.Task{Type: "noop", Payload: client.NoopPayload{Sleep: fmt.Sprintf("%dms", 50*i)}})
	}
	var reports []string
	for _, name := range []string{"sales", "stock", "returns"} {
		reports = append(reports, submit(t, c, client.Task{Type: "exec", Queue: "reports", Payload: client.ExecPayload{
			Cmd: []string{"sh", "-c", "echo building the " + name + " report; echo 42 rows written"}}}))
	}
	failing := submit(t, c, client.Task{Type: "exec", Key: "line-2-export", Payload: client.ExecPayload{
		Cmd:           []string{"sh", "-c", "echo connecting to plc-line-2; echo 'plc-line-2: connection refused' >&2; exit 3"},
		Env:           map[string]string{"PLC_PASSWORD": "hunter2"},
		FailExitCodes: []int{3}}})
	later := submit(t, c, client.Task{Type: "noop", NotBefore: time.Now().Add(time.Hour)})
	if _, err := c.AcquireLease(ctx, "printer", "alice@desk-7", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	queued := submit(t, c, client.Task{Type: "noop", Resource: "printer"})
	running := submit(t, c, client.Task{Type: "exec", Timeout: 5 * time.Minute, Payload: client.ExecPayload{
		Cmd: []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo \"scanning batch $i\"; sleep 0.3; done"}}})
	if _, err := c.DisableResource(ctx, "plc-line-2", "maintenance until Friday"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PauseJob(ctx, "archive"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		poll.For(t, 20*time.Second, 100*time.Millisecond, func() error {
			_, err := c.TriggerJob(ctx, "heartbeat")
			return err
		})
	}
	waitState(t, c, failing, client.TaskNeedsReview)
	waitState(t, c, running, client.TaskRunning)
	waitState(t, c, queued, client.TaskWaiting, client.TaskRetryWait)
	if _, err := c.CancelTask(ctx, later); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.CancelTask(context.Background(), running) })

	bctx, console := startBrowser(t, chrome)
	p := tab{t: t, ctx: bctx, base: base}

	// Overview (its first paint is measured by
	// BenchmarkDashboardFirstPaint).
	p.open("/")
	p.wait("overview cards", `document.querySelector("#cards .card")`)
	p.wait("the queues", `document.querySelector("#queues").textContent.includes("reports")`)
	p.wait("a worker", `document.querySelector("#workers").textContent.includes("default")`)
	// The workers' counts come with their next heartbeat: the page
	// refreshes itself until they show.
	p.wait("the running task and the tasks done", `document.querySelector(".c-running .n").textContent !== "0" && document.querySelector(".c-done .n").textContent !== "0"`)
	p.shot("overview")

	// Audit: the live tail shows a task's events as they happen.
	p.open("/audit?limit=20")
	p.wait("the live tail connected", `document.getElementById("tail-status").textContent === "live"`)
	tailed := submit(t, c, client.Task{Type: "noop", Payload: client.NoopPayload{Sleep: "200ms"}})
	for _, typ := range []wire.EventType{wire.EventTaskCreated, wire.EventTaskStarted, wire.EventTaskFinished} {
		p.wait(string(typ)+" of the task in the live tail", fmt.Sprintf(
			`[...document.querySelectorAll("#tail tbody tr")].some(tr => tr.textContent.includes(%q) && tr.querySelector("a[href='/tasks/%s']"))`, typ, tailed))
	}
	p.shot("audit")

	// Tasks: a task submitted now appears and reaches SUCCEEDED without a
	// reload.
	p.open("/tasks")
	if _, err := eval[bool](p, "window.gantryMark = true"); err != nil {
		t.Fatal(err)
	}
	fresh := submit(t, c, client.Task{Type: "noop", Payload: client.NoopPayload{Sleep: "1500ms"}})
	row := fmt.Sprintf(`document.querySelector('tr[data-task="%s"]')`, fresh)
	p.wait("the new task's row", row)
	p.wait("the new task SUCCEEDED", row+` && `+row+`.querySelector(".badge").textContent === "SUCCEEDED"`)
	if mark, err := eval[bool](p, "window.gantryMark === true"); err != nil || !mark {
		t.Errorf("the tasks page reloaded while the task ran (mark %v, %v), want the row updated in place", mark, err)
	}
	p.shot("tasks")

	// A running task's page follows its output live.
	p.open("/tasks/" + running)
	p.wait("live output lines", `document.querySelectorAll("#output span").length >= 3`)
	p.shot("task-running")

	// Retry of a NEEDS_REVIEW task from its page, through the confirm
	// dialog: it runs again.
	p.open("/tasks/" + failing)
	p.wait("the payload, redacted", `document.body.textContent.includes("[REDACTED]") && !document.body.textContent.includes("hunter2")`)
	p.shot("task")
	p.confirm(`button[data-action="retry"]`, "ok", "runs again")
	poll.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		rec, err := c.Task(ctx, failing)
		if err != nil {
			return err
		}
		if rec.Run != 2 || rec.State != client.TaskNeedsReview || rec.Attempts < 1 {
			return fmt.Errorf("task %s: run %d, %s, %d attempts; want run 2 run again to NEEDS_REVIEW", failing, rec.Run, rec.State, rec.Attempts)
		}
		return nil
	})
	actionRecorded(t, c, client.AuditQuery{TaskID: failing}, dashboard.ActionTaskRetry, "done")

	// Resources: the held resource shows its holder, its line and the
	// lease's countdown.
	p.open("/resources")
	p.wait("printer's holder", `document.querySelector('tr[data-resource="printer"] .holder').textContent.includes("alice@desk-7")`)
	p.wait("printer's line", `document.querySelector('tr[data-resource="printer"] .count')`)
	p.shot("resources")
	p.open("/resources/printer")
	p.wait("printer's lease history", `document.querySelector("#lease-history").textContent.includes("RESOURCE_LEASED")`)
	p.shot("resource")

	// Routes: scores and the stages of the last probes.
	p.open("/routes")
	p.wait("the probes of both routes", `document.querySelectorAll(".stages").length === 2`)
	p.wait("eu-proxy failing", `document.querySelector('tr[data-route="eu-proxy"] .sg-failed')`)
	p.shot("routes")

	// Jobs: next fires, and the runs of a job, planned against actual.
	p.open("/jobs")
	p.wait("the jobs", `document.querySelectorAll("tr[data-job]").length === 3`)
	p.shot("jobs")
	p.open("/jobs/heartbeat")
	p.wait("heartbeat's runs", `document.querySelectorAll("#job-runs tbody tr .badge").length >= 2`)
	p.shot("job")

	t.Run("task list filters", func(t *testing.T) {
		p := tab{t: t, ctx: bctx, base: base}
		rows := `[...document.querySelectorAll("tr[data-task]")].map(tr => tr.dataset.task).sort()`
		for _, tc := range []struct {
			fields map[string]string
			want   []string
		}{
			{map[string]string{"state": "NEEDS_REVIEW"}, []string{failing}},
			{map[string]string{"q": "LINE-2-EXPORT"}, []string{failing}},          // its key, in another case
			{map[string]string{"q": "plc-line-2: connection"}, []string{failing}}, // its last error
			{map[string]string{"state": "CANCELLED", "type": "noop"}, []string{later}},
			{map[string]string{"queue": "default", "type": "noop", "q": queued}, []string{queued}}, // its id
		} {
			p.open("/tasks")
			p.filter(tc.fields)
			p.waitList(fmt.Sprintf("the rows filtered by %v", tc.fields), rows, slices.Sorted(slices.Values(tc.want)))
		}
		// A queue and a type: the report tasks, and only tasks of that
		// queue and type (a job of the config may add its own).
		p.open("/tasks")
		p.filter(map[string]string{"queue": "reports", "type": "exec"})
		p.waitList("the report tasks among the rows", `[...document.querySelectorAll("tr[data-task]")].map(tr => tr.dataset.task).filter(id => `+jsList(reports)+`.includes(id)).sort()`,
			slices.Sorted(slices.Values(reports)))
		p.waitList("the queue and type of each row", `[...new Set([...document.querySelectorAll("tr[data-task]")].map(tr => tr.cells[2].textContent + " " + tr.cells[1].textContent))]`,
			[]string{"reports exec"})
	})

	t.Run("task page audit events", func(t *testing.T) {
		p := tab{t: t, ctx: bctx, base: base}
		// The retried task's page lists its events from the audit store,
		// oldest first, the retry's DASHBOARD_ACTION among them.
		p.open("/tasks/" + failing)
		p.waitStored("the task's audit events", c, client.AuditQuery{TaskID: failing}, "#task-events table.events", false,
			wire.EventTaskCreated, wire.EventRetryScheduled, wire.EventDashboardAction)
	})

	t.Run("actions", func(t *testing.T) {
		p := tab{t: t, ctx: bctx, base: base}

		// Cancel: the running task ends CANCELLED.
		p.open("/tasks/" + running)
		p.confirm(`button[data-action="cancel"]`, "ok", "cancelled (it was RUNNING)")
		waitState(t, c, running, client.TaskCancelled)
		actionRecorded(t, c, client.AuditQuery{TaskID: running}, dashboard.ActionTaskCancel, "done")

		// Purge: answering Cancel in the dialog does nothing; Confirm
		// removes the record, and the page returns to the task list.
		p.open("/tasks/" + later)
		if _, err := eval[bool](p, "window.gantryMark = true"); err != nil {
			t.Fatal(err)
		}
		p.click(`button[data-action="purge"]`)
		p.wait("the confirm dialog", `document.getElementById("confirm").open`)
		p.click(`#confirm button[value="no"]`)
		p.wait("the dialog closed", `!document.getElementById("confirm").open`)
		if still, err := eval[bool](p, `window.gantryMark === true && location.pathname === "/tasks/`+later+`"`); err != nil || !still {
			t.Errorf("the page after Cancel in the purge dialog: same page %v (%v), want the task's page, not left", still, err)
		}
		if _, err := c.Task(ctx, later); err != nil {
			t.Errorf("task %s after Cancel in the purge dialog: %v, want its record kept", later, err)
		}
		p.confirm(`button[data-action="purge"]`, "ok", "is purged")
		p.wait("the task list", `location.pathname === "/tasks"`)
		if _, err := c.Task(ctx, later); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("task %s after Purge = %v, want ErrNotFound", later, err)
		}
		actionRecorded(t, c, client.AuditQuery{TaskID: later}, dashboard.ActionTaskPurge, "done")

		// Disable from the list, Enable from the resource's page.
		p.open("/resources")
		p.confirm(`tr[data-resource="cam1"] button[data-action="disable"]`, "ok", "resource cam1 is DISABLED")
		waitResourceState(t, c, "cam1", wire.ResourceDisabled)
		actionRecorded(t, c, client.AuditQuery{ResourceID: "cam1"}, dashboard.ActionResourceDisable, "done")
		p.open("/resources/cam1")
		p.confirm(`button[data-action="enable"]`, "ok", "resource cam1 is AVAILABLE")
		waitResourceState(t, c, "cam1", wire.ResourceAvailable)
		actionRecorded(t, c, client.AuditQuery{ResourceID: "cam1"}, dashboard.ActionResourceEnable, "done")

		// Probe now: healthd probes the route at once and answers with
		// the result: office answers, eu-proxy's proxy refuses.
		p.open("/routes")
		p.confirm(`tr[data-route="office"] button[data-action="probe"]`, "ok", "route office answered in")
		actionRecorded(t, c, client.AuditQuery{RouteID: "office"}, dashboard.ActionRouteProbe, "done")
		p.confirm(`tr[data-route="eu-proxy"] button[data-action="probe"]`, "error", "route eu-proxy failed its probe at the tcp stage")
		actionRecorded(t, c, client.AuditQuery{RouteID: "eu-proxy"}, dashboard.ActionRouteProbe, "failed")

		// Trigger fires a paused job; Pause and Resume change its status.
		p.open("/jobs")
		p.confirm(`tr[data-job="archive"] button[data-action="trigger"]`, "ok", "job archive fired task")
		poll.For(t, 30*time.Second, 100*time.Millisecond, func() error {
			runs, err := c.JobRuns(ctx, "archive", 0)
			if err != nil {
				return err
			}
			if len(runs) != 1 || runs[0].Trigger != wire.TriggerManual {
				return fmt.Errorf("runs of archive = %+v, want one manual", runs)
			}
			return nil
		})
		actionRecorded(t, c, client.AuditQuery{JobID: "archive"}, dashboard.ActionJobTrigger, "done")
		p.confirm(`tr[data-job="heartbeat"] button[data-action="pause"]`, "ok", "job heartbeat is paused")
		waitJobStatus(t, c, "heartbeat", client.JobPaused)
		actionRecorded(t, c, client.AuditQuery{JobID: "heartbeat"}, dashboard.ActionJobPause, "done")
		p.confirm(`tr[data-job="archive"] button[data-action="resume"]`, "ok", "job archive fires on schedule again")
		waitJobStatus(t, c, "archive", client.JobActive)
		actionRecorded(t, c, client.AuditQuery{JobID: "archive"}, dashboard.ActionJobResume, "done")
	})

	t.Run("audit filters and paging", func(t *testing.T) {
		p := tab{t: t, ctx: bctx, base: base}
		// A type and a level: the failed probe's DASHBOARD_ACTION.
		p.open("/audit")
		p.filter(map[string]string{"type": string(wire.EventDashboardAction), "level": "warn"})
		p.waitStored("the warnings among the dashboard's actions", c, client.AuditQuery{Type: wire.EventDashboardAction, Level: wire.LevelWarn}, "table.events:not(.live)", true,
			wire.EventDashboardAction)

		// The live tail follows the filters: with job=heartbeat, a task
		// that ends meanwhile is not shown, the job's next fire is.
		p.open("/audit")
		p.filter(map[string]string{"job": "heartbeat"})
		p.wait("the live tail connected", `document.getElementById("tail-status").textContent === "live"`)
		other := submit(t, c, client.Task{Type: "noop"})
		waitState(t, c, other, client.TaskSucceeded)
		if _, err := c.TriggerJob(ctx, "heartbeat"); err != nil {
			t.Fatal(err)
		}
		p.wait("heartbeat's fire in the live tail", `document.querySelectorAll("#tail tbody tr").length > 0`)
		p.waitList("the live tail's events not of heartbeat", `[...document.querySelectorAll("#tail tbody tr")].filter(tr => !tr.querySelector('.about a[href="/jobs/heartbeat"]')).map(tr => tr.textContent)`,
			[]string{})

		// Older pages back through the store, three events at a time:
		// the pages together are the task's events, newest first, each
		// once.
		stored := "table.events:not(.live)"
		p.open("/audit")
		p.filter(map[string]string{"task": failing, "limit": "3"})
		if got, want := p.pageBack(stored, 3), storedRows(t, c, client.AuditQuery{TaskID: failing}, true); !slices.Equal(got, want) {
			t.Errorf("the task's events paged back through = %q, want %q", got, want)
		}

		// So do events stamped with one time (a burst on a clock of
		// coarse resolution), a page ending among them.
		js, err := jetstream.New(c.Conn())
		if err != nil {
			t.Fatal(err)
		}
		em := audit.NewEmitter(js, "test", nil)
		at := time.Now().Truncate(time.Millisecond)
		for i := range 3 {
			if err := em.Emit(ctx, wire.Event{Time: at, Type: wire.EventTaskCreated, TaskID: "one-instant", Message: fmt.Sprintf("event %d of 3 at one instant", i+1)}); err != nil {
				t.Fatal(err)
			}
		}
		want := waitStoredRows(t, c, client.AuditQuery{TaskID: "one-instant"}, 3)
		p.open("/audit")
		p.filter(map[string]string{"task": "one-instant", "limit": "2"})
		if got := p.pageBack(stored, 2); !slices.Equal(got, want) {
			t.Errorf("events at one instant paged back through = %q, want %q", got, want)
		}

		// A resource's lease history pages back the same way, a hundred
		// events a page: plc-line-2's (disabled, no task ran on it), with
		// 120 waits at one instant.
		before := len(storedRows(t, c, client.AuditQuery{ResourceID: "plc-line-2"}, true))
		at = time.Now().Truncate(time.Millisecond)
		for i := range 120 {
			if err := em.Emit(ctx, wire.Event{Time: at, Type: wire.EventResourceWaiting, ResourceID: "plc-line-2", Message: fmt.Sprintf("wait %d", i+1)}); err != nil {
				t.Fatal(err)
			}
		}
		want = waitStoredRows(t, c, client.AuditQuery{ResourceID: "plc-line-2"}, before+120)
		p.open("/resources/plc-line-2")
		if got := p.pageBack("#lease-history table.events", 100); !slices.Equal(got, want) {
			t.Errorf("plc-line-2's lease history paged back through = %d events %q, want %d %q", len(got), got, len(want), want)
		}
	})

	t.Run("gantry ui", func(t *testing.T) {
		// 'gantry ui' on loopback, a process of its own, shows the system
		// of 'gantry run' through its broker, and acts on it.
		_, ui := startGantry(t, "ui", "--server", sys.NATS, "--http-listen", "127.0.0.1:0")
		u := tab{t: t, ctx: bctx, base: ui.HTTP}
		u.open("/")
		u.wait("the queues", `document.querySelector("#queues").textContent.includes("reports")`)
		u.wait("the worker", `document.querySelector("#workers").textContent.includes("default")`)
		u.open("/resources")
		u.wait("printer's holder", `document.querySelector('tr[data-resource="printer"] .holder').textContent.includes("alice@desk-7")`)
		u.open("/tasks")
		u.wait("the failed task's row", fmt.Sprintf(`document.querySelector('tr[data-task="%s"] .badge').textContent === "NEEDS_REVIEW"`, failing))
		u.open("/tasks/" + failing)
		u.wait("its payload, redacted", `document.body.textContent.includes("[REDACTED]") && !document.body.textContent.includes("hunter2")`)
		u.open("/audit")
		u.wait("the live tail connected", `document.getElementById("tail-status").textContent === "live"`)
		tailed := submit(t, c, client.Task{Type: "noop"})
		u.wait("the task's end in the live tail", fmt.Sprintf(
			`[...document.querySelectorAll("#tail tbody tr")].some(tr => tr.textContent.includes("TASK_FINISHED") && tr.querySelector("a[href='/tasks/%s']"))`, tailed))
		// The stages of a probe come as healthd publishes them: office's
		// with its next probe, eu-proxy's (in cooldown, not probed until
		// it ends) when probed from the page.
		u.open("/routes")
		u.wait("office's probe", `document.querySelector('tr[data-route="office"] .stages')`)
		u.wait("eu-proxy in cooldown", `document.querySelector('tr[data-route="eu-proxy"] .badge').textContent === "COOLDOWN"`)
		u.confirm(`tr[data-route="eu-proxy"] button[data-action="probe"]`, "error", "route eu-proxy failed its probe at the tcp stage")
		u.wait("eu-proxy's probe", `document.querySelector('tr[data-route="eu-proxy"] .sg-failed')`)
		u.open("/jobs/nightly-report")
		u.confirm(`button[data-action="trigger"]`, "ok", "job nightly-report fired task")
		poll.For(t, 30*time.Second, 100*time.Millisecond, func() error {
			runs, err := c.JobRuns(ctx, "nightly-report", 0)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(runs, func(r client.JobRun) bool { return r.Trigger == wire.TriggerManual }) {
				return fmt.Errorf("runs of nightly-report = %+v, want a manual one", runs)
			}
			return nil
		})
		actionRecorded(t, c, client.AuditQuery{JobID: "nightly-report"}, dashboard.ActionJobTrigger, "done")
	})

	if errs := console.problems(); len(errs) > 0 {
		t.Errorf("console errors and exceptions = %q, want none", errs)
	}
}

// confirm clicks the action button sel, answers Confirm in the dialog
// that asks first, and waits for the page the action returns to, with a
// flash of kind ("ok" or "error") that says text.
func (p tab) confirm(sel, kind, text string) {
	p.t.Helper()
	p.click(sel)
	p.wait("the confirm dialog", `document.getElementById("confirm").open`)
	p.click("#confirm-yes")
	p.wait("the flash "+text, fmt.Sprintf(`[...document.querySelectorAll(".flash.%s")].some(f => f.textContent.includes(%q))`, kind, text))
}

// filter fills the filter form of the page as a person does, typing into
// its inputs and choosing in its selects, submits it and waits for the
// filtered page.
func (p tab) filter(fields map[string]string) {
	p.t.Helper()
	var loaded []string
	for name, v := range fields {
		sel := chromedp.CSS(fmt.Sprintf(`form.filters [name=%q]`, name))
		tag, err := eval[string](p, fmt.Sprintf(`document.querySelector('form.filters [name=%q]').tagName`, name))
		if err != nil {
			p.t.Fatalf("filter %s: %v", name, err)
		}
		if tag == "SELECT" {
			err = chromedp.Do(p.ctx, chromedp.SetValue(sel, v))
		} else if err = chromedp.Do(p.ctx, chromedp.Clear(sel)); err == nil {
			err = chromedp.Do(p.ctx, chromedp.SendKeys(sel, v))
		}
		if err != nil {
			p.t.Fatalf("filter %s: %v", name, err)
		}
		loaded = append(loaded, fmt.Sprintf(`new URLSearchParams(location.search).get(%q) === %q`, name, v))
	}
	p.click(`form.filters button[type="submit"]`)
	p.wait("the filtered page", strings.Join(loaded, " && ")+` && document.readyState === "complete"`)
}

// waitList polls expr, a JavaScript array of strings, until it is want.
func (p tab) waitList(what, expr string, want []string) {
	p.t.Helper()
	poll.For(p.t, 30*time.Second, 100*time.Millisecond, func() error {
		got, err := eval[[]string](p, expr)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s = %q, want %q", what, got, want)
		}
		return nil
	})
}

// waitStored polls until the events table sel of the page shows the
// events q selects from the audit store (newest first, or oldest first),
// and they include the types of mustHave.
func (p tab) waitStored(what string, c *client.Client, q client.AuditQuery, sel string, newestFirst bool, mustHave ...wire.EventType) {
	p.t.Helper()
	poll.For(p.t, 30*time.Second, 200*time.Millisecond, func() error {
		want := storedRows(p.t, c, q, newestFirst)
		for _, typ := range mustHave {
			if !slices.ContainsFunc(want, func(r string) bool { return strings.HasPrefix(r, string(typ)+" ") }) {
				return fmt.Errorf("%s: no %s stored yet", what, typ)
			}
		}
		got, err := eval[[]string](p, eventRows(sel))
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s = %q, want %q", what, got, want)
		}
		return nil
	})
}

// pageBack reads the events of the table sel of the page open in p, at
// most limit a page, and those of each older page, following Older to the
// end.
func (p tab) pageBack(sel string, limit int) []string {
	p.t.Helper()
	var got []string
	for page := 1; ; page++ {
		rows, err := eval[[]string](p, eventRows(sel))
		if err != nil {
			p.t.Fatal(err)
		}
		if len(rows) > limit {
			p.t.Fatalf("page %d of the audit events = %d rows, want at most %d", page, len(rows), limit)
		}
		got = append(got, rows...)
		older, err := eval[string](p, `(document.querySelector('.pager a[href*="until="]') || {}).href || ""`)
		if err != nil {
			p.t.Fatal(err)
		}
		if older == "" {
			return got
		}
		p.click(`.pager a[href*="until="]`)
		p.wait("the older page", fmt.Sprintf(`location.href === %q && document.readyState === "complete" && !document.getElementById("tail")`, older))
	}
}

// eventRows is a JavaScript expression: the rows of the events table sel,
// each as its type and message.
func eventRows(sel string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('%s tbody tr')].filter(tr => tr.querySelector(".etype")).map(tr =>
		tr.querySelector(".etype").textContent + " " + [...tr.querySelector(".msg").childNodes].filter(n => n.nodeType === Node.TEXT_NODE).map(n => n.textContent).join(""))`, sel)
}

// storedRows returns the events q selects from the audit store, each as
// its type and message, newest first or oldest first.
func storedRows(t testing.TB, c *client.Client, q client.AuditQuery, newestFirst bool) []string {
	t.Helper()
	var rows []string
	for {
		page, err := c.QueryAudit(t.Context(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range page.Events {
			rows = append(rows, string(ev.Type)+" "+ev.Message)
		}
		if page.Cursor == "" {
			break
		}
		q.Cursor = page.Cursor
	}
	if newestFirst {
		slices.Reverse(rows)
	}
	return rows
}

// waitStoredRows waits until the audit store holds n events that q
// selects and returns them as storedRows does, newest first.
func waitStoredRows(t *testing.T, c *client.Client, q client.AuditQuery, n int) []string {
	t.Helper()
	var rows []string
	poll.For(t, 30*time.Second, 100*time.Millisecond, func() error {
		if rows = storedRows(t, c, q, true); len(rows) != n {
			return fmt.Errorf("stored events of %+v = %d, want %d", q, len(rows), n)
		}
		return nil
	})
	return rows
}

// jsList is strs as a JavaScript array.
func jsList(strs []string) string {
	b, _ := json.Marshal(strs)
	return string(b)
}

// actionRecorded waits for the DASHBOARD_ACTION event of action among the
// events q selects, and checks that it names the user local, an operator,
// and outcome.
func actionRecorded(t *testing.T, c *client.Client, q client.AuditQuery, action, outcome string) {
	t.Helper()
	q.Type = wire.EventDashboardAction
	var got wire.DashboardAction
	var ev client.Event
	poll.For(t, 30*time.Second, 100*time.Millisecond, func() error {
		page, err := c.QueryAudit(t.Context(), q)
		if err != nil {
			return err
		}
		for _, ev = range page.Events {
			if err := json.Unmarshal(ev.Payload, &got); err != nil {
				return err
			}
			if got.Action == action {
				return nil
			}
		}
		return fmt.Errorf("no DASHBOARD_ACTION %s among the %d events of %+v", action, len(page.Events), q)
	})
	if got.User != dashboard.LocalUser || got.Role != string(dashboard.RoleOperator) || got.Outcome != outcome || ev.Component != "dashboard" {
		t.Errorf("DASHBOARD_ACTION %s = user %q, role %q, outcome %q, component %q; want %s, %s, %s, dashboard",
			action, got.User, got.Role, got.Outcome, ev.Component, dashboard.LocalUser, dashboard.RoleOperator, outcome)
	}
}

// waitResourceState waits until resource id is in state want.
func waitResourceState(t *testing.T, c *client.Client, id string, want wire.ResourceState) {
	t.Helper()
	poll.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		r, err := c.Resource(t.Context(), id)
		if err != nil {
			return err
		}
		if r.State != want {
			return fmt.Errorf("resource %s = %s, want %s", id, r.State, want)
		}
		return nil
	})
}

// waitJobStatus waits until job name's status is want.
func waitJobStatus(t *testing.T, c *client.Client, name, want string) {
	t.Helper()
	poll.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		j, err := c.Job(t.Context(), name)
		if err != nil {
			return err
		}
		if j.Status != want {
			return fmt.Errorf("job %s = %s, want %s", name, j.Status, want)
		}
		return nil
	})
}

// TestDashboardRefusesCSRFLessPost posts an action to the dashboard of
// 'gantry run' without the session's CSRF token: refused, nothing done.
func TestDashboardRefusesCSRFLessPost(t *testing.T) {
	t.Parallel()
	sys, c := dashboardSystem(t)
	base := sys.HTTP
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := hc.PostForm(base+"/resources/cam1/disable", url.Values{"confirm": {"yes"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("POST /resources/cam1/disable without a CSRF token = %d, want 403", res.StatusCode)
	}
	if r, err := c.Resource(t.Context(), "cam1"); err != nil || r.State == wire.ResourceDisabled {
		t.Errorf("cam1 after the refused POST = %v, %v; want not DISABLED", r.State, err)
	}
}

// TestUIBeyondLoopback runs 'gantry ui' on an address of this machine
// that is not loopback: with users every unauthenticated request is
// refused; without users it does not start.
func TestUIBeyondLoopback(t *testing.T) {
	t.Parallel()
	ip := nonLoopbackIP(t)
	code, _, stderr := runInProcess(t, "ui", "--server", "nats://127.0.0.1:1", "--http-listen", ip+":0")
	if code != exitUsage || !strings.Contains(stderr, "configure users") {
		t.Errorf("ui beyond loopback without users = exit %d, stderr %q; want exit 2 saying to configure users", code, stderr)
	}

	_, broker := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	cfg := filepath.Join(t.TempDir(), "ui.yaml")
	if err := os.WriteFile(cfg, []byte("auth:\n  users:\n    - {user: ops, password: \"a long secret\"}\n    - {user: vic, password: \"another secret\", role: viewer}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, ui := startGantry(t, "ui", "--server", broker.NATS, "--http-listen", ip+":0", "--config", cfg)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"/", "/tasks", "/audit/live", "/tasks/x/output"} {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", ui.HTTP+path, nil)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s%s without a user = %d, want 401", ui.HTTP, path, res.StatusCode)
		}
	}
	for _, u := range []struct{ name, password, role string }{{"ops", "a long secret", "operator"}, {"vic", "another secret", "viewer"}} {
		res, err := hc.PostForm(ui.HTTP+"/login", url.Values{"user": {u.name}, "password": {u.password}})
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		var session *http.Cookie
		for _, ck := range res.Cookies() {
			if ck.Name == "gantry_session" {
				session = ck
			}
		}
		if res.StatusCode != http.StatusSeeOther || session == nil {
			t.Fatalf("login of %s = %d with cookie %v, want 303 and a session", u.name, res.StatusCode, session)
		}
		req, _ := http.NewRequestWithContext(t.Context(), "GET", ui.HTTP+"/jobs", nil)
		req.AddCookie(session)
		res, err = hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "<small>"+u.role+"</small>") {
			t.Errorf("GET /jobs as %s = %d, want 200 naming the role %s", u.name, res.StatusCode, u.role)
		}
	}
}

// nonLoopbackIP returns an IPv4 address of this machine that is not
// loopback, or skips.
func nonLoopbackIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("this machine has no address beyond loopback: the dashboard's refusal is tested at the HTTP level (package dashboard)")
	return ""
}

// BenchmarkDashboardFirstPaint measures the first contentful paint of the
// overview as the browser's Performance API reports it
// (first-contentful-paint, from the start of the navigation), over
// loopback from a warm 'gantry run' that holds real data:
//   - new-visitor: a fresh browser context in a new tab, as someone who
//     never opened the dashboard (no cache, no connection, a new renderer);
//   - uncached: a reload with the browser's cache off, the assets fetched
//     again;
//   - cached: a reload, the assets from the cache.
//
// It reports the median and the 90th percentile over b.N loads (fcp-ms,
// fcp-p90-ms) and the median time to the page's first byte (ttfb-ms);
// ns/op is a whole load, the benchmark's polling for the paint included.
//
//	go test -run '^$' -bench DashboardFirstPaint -benchtime 30x ./cmd/gantry
func BenchmarkDashboardFirstPaint(b *testing.B) {
	chrome := chromium(b)
	sys, c := dashboardSystem(b)
	for i := range 5 {
		submit(b, c, client.Task{Type: "noop", Payload: client.NoopPayload{Sleep: fmt.Sprintf("%dms", 10*i)}})
	}
	submit(b, c, client.Task{Type: "exec", Queue: "reports", Payload: client.ExecPayload{Cmd: []string{"sh", "-c", "echo report"}}})
	bctx, _ := startBrowser(b, chrome)
	// Warm: the server has rendered the page and the browser runs.
	warm := tab{t: b, ctx: bctx, base: sys.HTTP}
	warm.open("/")
	warm.wait("the queues", `document.querySelector("#queues").textContent.includes("reports")`)
	// paint loads the overview in p and returns its first contentful
	// paint and first byte, in ms from the navigation's start.
	paint := func(p tab) (fcp, ttfb float64) {
		p.open("/")
		p.wait("the first contentful paint", `performance.getEntriesByName("first-contentful-paint").length`)
		t, err := eval[[]float64](p, `[performance.getEntriesByName("first-contentful-paint")[0].startTime, performance.getEntriesByType("navigation")[0].responseStart]`)
		if err != nil {
			b.Fatal(err)
		}
		return t[0], t[1]
	}
	for _, mode := range []string{"new-visitor", "uncached", "cached"} {
		b.Run(mode, func(b *testing.B) {
			if mode != "new-visitor" {
				if _, err := chromedp.Call(bctx, network.Enable, network.EnableParams{}); err != nil {
					b.Fatal(err)
				}
				if _, err := chromedp.Call(bctx, network.SetCacheDisabled, network.SetCacheDisabledParams{CacheDisabled: mode == "uncached"}); err != nil {
					b.Fatal(err)
				}
				warm.open("/")
			}
			var fcps, ttfbs []float64
			for b.Loop() {
				p, done := warm, func() {}
				if mode == "new-visitor" {
					p.ctx, done = chromedp.NewContext(bctx, chromedp.WithNewBrowserContext())
				}
				fcp, ttfb := paint(p)
				done()
				fcps, ttfbs = append(fcps, fcp), append(ttfbs, ttfb)
			}
			b.ReportMetric(quantile(fcps, 0.5), "fcp-ms")
			b.ReportMetric(quantile(fcps, 0.9), "fcp-p90-ms")
			b.ReportMetric(quantile(ttfbs, 0.5), "ttfb-ms")
		})
	}
}

// quantile returns the q quantile of xs (nearest rank).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return s[max(int(math.Ceil(q*float64(len(s))))-1, 0)]
}
