package dashboard

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
)

// taskStates are the task states, in life order.
var taskStates = []client.TaskState{client.TaskWaiting, client.TaskRunning, client.TaskRetryWait, client.TaskSucceeded, client.TaskNeedsReview, client.TaskCancelled}

// maxListed bounds the tasks the task list shows.
const maxListed = 200

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	st, err := d.statsNow(r.Context())
	if err != nil {
		d.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	var tot client.QueueStats
	for _, q := range st.Queues {
		tot.Waiting += q.Waiting
		tot.Running += q.Running
		tot.RetryWait += q.RetryWait
		tot.NeedsReview += q.NeedsReview
		tot.Done += q.Done
	}
	held := 0
	for _, res := range st.Resources {
		if res.LeaseOwner != "" {
			held++
		}
	}
	d.render(w, r, http.StatusOK, "overview", "Overview", map[string]any{
		"Stats": st, "Total": tot, "Spark": d.through.series(time.Now()), "Held": held,
	})
}

// taskQuery is the task list's filter, as its form sends it.
type taskQuery struct {
	State, Queue, Type, Resource, Job, Text string
}

func (q taskQuery) matches(rec client.TaskRecord) bool {
	if q.Resource != "" && rec.Resource != q.Resource || q.Job != "" && rec.Job != q.Job {
		return false
	}
	if q.Text == "" {
		return true
	}
	text := strings.ToLower(q.Text)
	for _, f := range []string{rec.ID, rec.Type, rec.Queue, rec.LastError, rec.Resource, rec.Job, rec.Key, rec.Worker} {
		if strings.Contains(strings.ToLower(f), text) {
			return true
		}
	}
	return false
}

// with returns the URL of the task list filtered by q with state instead.
func (q taskQuery) With(state string) string {
	v := url.Values{}
	for k, x := range map[string]string{"state": state, "queue": q.Queue, "type": q.Type, "resource": q.Resource, "job": q.Job, "q": q.Text} {
		if x != "" {
			v.Set(k, x)
		}
	}
	if len(v) == 0 {
		return "/tasks"
	}
	return "/tasks?" + v.Encode()
}

// stateCount is one state's chip on the task list.
type stateCount struct {
	State client.TaskState
	N     int
}

func (d *Dashboard) taskList(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	q := taskQuery{State: strings.ToUpper(v.Get("state")), Queue: v.Get("queue"), Type: v.Get("type"),
		Resource: v.Get("resource"), Job: v.Get("job"), Text: strings.TrimSpace(v.Get("q"))}
	if q.State != "" && !slices.Contains(taskStates, client.TaskState(q.State)) {
		d.fail(w, r, http.StatusBadRequest, fmt.Errorf("state %q: want one of WAITING, RUNNING, RETRY_WAIT, SUCCEEDED, NEEDS_REVIEW, CANCELLED", q.State))
		return
	}
	all, err := d.c.Tasks(r.Context(), client.TaskFilter{Queue: q.Queue, Type: q.Type})
	if err != nil {
		d.fail(w, r, errStatus(err), err)
		return
	}
	counts := map[client.TaskState]int{}
	var list []client.TaskRecord
	for _, rec := range all {
		if !q.matches(rec) {
			continue
		}
		counts[rec.State]++
		if q.State == "" || rec.State == client.TaskState(q.State) {
			list = append(list, rec)
		}
	}
	slices.SortStableFunc(list, func(a, b client.TaskRecord) int { return b.CreatedAt.Compare(a.CreatedAt) })
	matched := len(list)
	list = list[:min(len(list), maxListed)]
	chips := make([]stateCount, 0, len(taskStates))
	for _, s := range taskStates {
		chips = append(chips, stateCount{s, counts[s]})
	}
	d.render(w, r, http.StatusOK, "tasks", "Tasks", map[string]any{
		"Query": q, "Tasks": list, "Matched": matched, "Total": len(all), "States": chips,
	})
}

func (d *Dashboard) taskPage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx := r.Context()
	rec, err := d.c.Task(ctx, id)
	if err != nil {
		d.fail(w, r, errStatus(err), err)
		return
	}
	payload, payloadNote := "", ""
	if raw, err := d.c.TaskPayload(ctx, id); err == nil {
		payload = pretty(wire.RedactJSON(raw))
		if payload == "" {
			payloadNote = "no payload"
		}
	} else if errors.Is(err, client.ErrNotFound) {
		payloadNote = "not kept: a task's message, and so its payload, is kept while it waits or runs, and when it needs review"
	} else {
		payloadNote = err.Error()
	}
	events, more, evErr := d.newest(ctx, client.AuditQuery{TaskID: id}, 200, time.Time{}, "")
	slices.Reverse(events)
	d.render(w, r, http.StatusOK, "task", "Task "+id, map[string]any{
		"Task": rec, "Payload": payload, "PayloadNote": payloadNote, "Result": pretty(rec.Result),
		"Output": strings.TrimRight(rec.Output, "\n"), "Events": events, "MoreEvents": more, "EventsError": errText(evErr),
	})
}

func (d *Dashboard) resourceList(w http.ResponseWriter, r *http.Request) {
	list, err := d.c.Resources(r.Context())
	if err != nil {
		d.fail(w, r, errStatus(err), err)
		return
	}
	d.render(w, r, http.StatusOK, "resources", "Resources", map[string]any{"Resources": list})
}

// leaseEvents are the event types of a resource's lease history.
var leaseEvents = []wire.EventType{wire.EventResourceLeased, wire.EventResourceReleased, wire.EventLeaseExpired,
	wire.EventLeaseConflict, wire.EventLeaseRevoked, wire.EventResourceStateChanged, wire.EventResourceWaiting, wire.EventResourceMoveRefused}

func (d *Dashboard) resourcePage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	res, err := d.c.Resource(r.Context(), id)
	if err != nil {
		d.fail(w, r, errStatus(err), err)
		return
	}
	v := r.URL.Query()
	events, more, evErr := d.newest(r.Context(), client.AuditQuery{ResourceID: id}, 100, parseTime(v.Get("until"), time.Now()), v.Get("before"))
	older := olderPage("/resources/"+url.PathEscape(id), url.Values{}, events, more)
	events = slices.DeleteFunc(events, func(ev client.Event) bool { return !slices.Contains(leaseEvents, ev.Type) })
	d.render(w, r, http.StatusOK, "resource", "Resource "+id, map[string]any{
		"Resource": res, "Events": events, "Older": older, "EventsError": errText(evErr),
	})
}

// routeRow is a route with its last probe.
type routeRow struct {
	client.Route
	Probe  *wire.HealthResult
	Stages []stage
}

// stage is one stage of a probe as the routes page shows it: "ok",
// "failed", "skipped" (not run after a failure) or "unchecked" (no
// expected exit configured).
type stage struct {
	Name, Status string
}

// stagesOf shows the three stages of probe result h.
func stagesOf(h *wire.HealthResult) []stage {
	if h == nil {
		return nil
	}
	names := []wire.ProbeStage{wire.StageTCP, wire.StageRequest, wire.StageExit}
	out := make([]stage, 0, len(names))
	failed := false
	for _, n := range names {
		s := stage{Name: string(n), Status: "ok"}
		switch {
		case failed:
			s.Status = "skipped"
		case !h.OK && h.Stage == n:
			s.Status, failed = "failed", true
		case n == wire.StageExit && h.ExitIP == "" && h.Region == "":
			s.Status = "unchecked"
		}
		out = append(out, s)
	}
	return out
}

func (d *Dashboard) routeList(w http.ResponseWriter, r *http.Request) {
	list, err := d.c.Routes(r.Context())
	if err != nil {
		d.fail(w, r, errStatus(err), err)
		return
	}
	rows := make([]routeRow, 0, len(list))
	for _, rt := range list {
		row := routeRow{Route: rt}
		row.Proxy = wire.RedactProxy(rt.Proxy)
		if h, ok := d.probes.get(rt.ID); ok {
			row.Probe = &h
			row.Stages = stagesOf(&h)
		}
		rows = append(rows, row)
	}
	d.render(w, r, http.StatusOK, "routes", "Routes", map[string]any{"Routes": rows})
}

func (d *Dashboard) jobList(w http.ResponseWriter, r *http.Request) {
	list, _, err := d.c.Jobs(r.Context())
	if err != nil {
		d.fail(w, r, errStatus(err), err)
		return
	}
	st, _ := d.statsNow(r.Context())
	d.render(w, r, http.StatusOK, "jobs", "Jobs", map[string]any{"Jobs": list, "Scheduler": st.Scheduler})
}

// runRow is a job's run with how late it fired.
type runRow struct {
	client.JobRun
	Lag time.Duration
}

func (d *Dashboard) jobPage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ctx := r.Context()
	job, err := d.c.Job(ctx, name)
	if err != nil {
		d.fail(w, r, errStatus(err), err)
		return
	}
	fires, firesErr := d.c.NextFires(ctx, name, 5)
	runs, err := d.c.JobRuns(ctx, name, 50)
	if err != nil {
		d.fail(w, r, errStatus(err), err)
		return
	}
	rows := make([]runRow, 0, len(runs))
	for _, run := range slices.Backward(runs) {
		rows = append(rows, runRow{JobRun: run, Lag: run.Fired.Sub(run.Planned)})
	}
	d.render(w, r, http.StatusOK, "job", "Job "+name, map[string]any{
		"Job": job, "Fires": fires, "FiresError": errText(firesErr), "Runs": rows, "Payload": pretty(wire.RedactJSON(job.Payload)),
	})
}

// auditForm is the audit page's filter, as its form sends it.
type auditForm struct {
	Task, Resource, Route, Job, Type, Level, Since, Until string
	Limit                                                 int
}

// auditFilter reads the audit filters of a query string.
func auditFilter(v url.Values) (client.AuditQuery, auditForm, error) {
	f := auditForm{Task: v.Get("task"), Resource: v.Get("resource"), Route: v.Get("route"), Job: v.Get("job"),
		Type: strings.ToUpper(v.Get("type")), Level: strings.ToLower(v.Get("level")), Since: v.Get("since"), Until: v.Get("until")}
	q := client.AuditQuery{TaskID: f.Task, ResourceID: f.Resource, RouteID: f.Route, JobID: f.Job,
		Type: wire.EventType(f.Type), Level: wire.Level(f.Level)}
	if f.Level != "" && !slices.Contains([]wire.Level{wire.LevelDebug, wire.LevelInfo, wire.LevelWarn, wire.LevelError}, q.Level) {
		return q, f, fmt.Errorf("level %q: want debug, info, warn or error", f.Level)
	}
	f.Limit = 100
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			return q, f, fmt.Errorf("limit %q: want 1 to 1000", s)
		}
		f.Limit = n
	}
	if f.Since != "" {
		t, err := parseWhen(f.Since, time.Now())
		if err != nil {
			return q, f, fmt.Errorf("since: %w", err)
		}
		q.Since = &t
	}
	return q, f, nil
}

func (d *Dashboard) auditPage(w http.ResponseWriter, r *http.Request) {
	q, form, err := auditFilter(r.URL.Query())
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	now := time.Now()
	until := now
	if form.Until != "" {
		if until, err = parseWhen(form.Until, now); err != nil {
			d.fail(w, r, http.StatusBadRequest, fmt.Errorf("until: %w", err))
			return
		}
	}
	events, more, evErr := d.newest(r.Context(), q, form.Limit, until, r.URL.Query().Get("before"))
	older := olderPage("/audit", r.URL.Query(), events, more)
	live := r.URL.Query()
	live.Del("until")
	live.Del("before")
	live.Del("limit")
	live.Set("from", now.Format(time.RFC3339Nano))
	types := make([]string, 0, len(wire.EventTypes()))
	for _, t := range wire.EventTypes() {
		types = append(types, string(t))
	}
	slices.Sort(types)
	d.render(w, r, http.StatusOK, "audit", "Audit", map[string]any{
		"Form": form, "Events": events, "Older": older, "Live": "/audit/live?" + live.Encode(), "Paged": form.Until != "",
		"Types": types, "EventsError": errText(evErr),
	})
}

// windows are the spans newest searches back through, one after another:
// the newest events are usually recent, and a search of the whole store
// is the last resort.
var windows = []time.Duration{time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour, 0}

// maxScan bounds the events newest reads for one answer.
const maxScan = 50000

// olderPage is the URL of the page of events older than those of a page
// (newest first) at path with the query v: it starts before the last
// event, by time and id (the order of the store, which keeps the events of
// one time in the order of their ids). "" when there are none older.
func olderPage(path string, v url.Values, events []client.Event, more bool) string {
	if !more || len(events) == 0 {
		return ""
	}
	last := events[len(events)-1]
	v.Set("until", last.Time.Format(time.RFC3339Nano))
	v.Set("before", last.ID)
	return path + "?" + v.Encode()
}

// newest returns the newest n events q selects from before until, newest
// first, and whether older ones may be left. With before, an event id,
// the events at until whose id sorts before it are taken too: an older
// page starts there (olderPage).
func (d *Dashboard) newest(ctx context.Context, q client.AuditQuery, n int, until time.Time, before string) ([]client.Event, bool, error) {
	if until.IsZero() {
		until = time.Now()
	}
	var out []client.Event
	scanned := 0
	hi := until
	if before != "" {
		// Until is exclusive: up to the nanosecond after, then drop the
		// events at until from before on.
		hi = until.Add(time.Nanosecond)
	}
	for _, span := range windows {
		q.Until, q.Since, q.Cursor = &hi, nil, ""
		lo := time.Time{}
		if span > 0 {
			lo = until.Add(-span)
			q.Since = &lo
		}
		q.Limit = min(max(n, 100), 10000)
		var window []client.Event
		for {
			page, err := d.c.QueryAudit(ctx, q)
			if err != nil {
				return out, false, err
			}
			for _, ev := range page.Events {
				if before == "" || !ev.Time.Equal(until) || ev.ID < before {
					window = append(window, ev)
				}
			}
			if len(window) > n {
				window = window[len(window)-n:]
			}
			scanned += len(page.Events)
			if page.Cursor == "" {
				break
			}
			if scanned >= maxScan {
				return append(out, reversed(window)...), true, nil
			}
			q.Cursor = page.Cursor
		}
		out = append(out, reversed(window)...)
		if len(out) >= n {
			return out[:n], true, nil
		}
		if span == 0 {
			break
		}
		hi = lo
	}
	return out, false, nil
}

func reversed(evs []client.Event) []client.Event {
	out := slices.Clone(evs)
	slices.Reverse(out)
	return out
}

// parseWhen reads a time as the audit filters take it: RFC 3339, a
// local date and time (2026-11-30T03:12 as a browser's datetime-local
// input sends it, or 2026-11-30 03:12), or a duration ago (90m, 2d).
func parseWhen(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02T15:04", "2006-01-02T15:04:05", "2006-01-02 15:04", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return t, nil
		}
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 {
			return now.Add(-time.Duration(n) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q: want RFC 3339, a local date and time (2026-11-30 03:12) or a duration ago (90m, 2d)", s)
}

// parseTime reads an RFC 3339 time, or returns def.
func parseTime(s string, def time.Time) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t
	}
	return def
}

// pretty indents a JSON document for display; "" for none.
func pretty(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return string(raw)
	}
	return string(b)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return cmp.Or(err.Error(), "error")
}
