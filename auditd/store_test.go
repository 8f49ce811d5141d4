package auditd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/leaktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

// t0 is late in a UTC day, so test events spread over several days.
var t0 = time.Date(2026, 11, 29, 22, 0, 0, 0, time.UTC)

// testEvents returns n events, one every 7 minutes from t0, cycling through
// tasks task-0..task-10, resources, routes, jobs, types and levels.
func testEvents(n int) []wire.Event {
	types := []wire.EventType{wire.EventTaskCreated, wire.EventTaskStarted, wire.EventTaskFinished}
	levels := []wire.Level{wire.LevelInfo, wire.LevelWarn}
	out := make([]wire.Event, n)
	for i := range out {
		out[i] = wire.Event{
			ID:         fmt.Sprintf("ev-%05d", i),
			Time:       t0.Add(time.Duration(i) * 7 * time.Minute),
			Type:       types[i%len(types)],
			Level:      levels[i%len(levels)],
			Component:  "test",
			Host:       "pc-1",
			TaskID:     fmt.Sprintf("task-%d", i%11),
			ResourceID: fmt.Sprintf("cam%d", i%4),
			RouteID:    fmt.Sprintf("route-%d", i%5),
			JobID:      fmt.Sprintf("job-%d", i%6),
			Payload:    json.RawMessage(`{"n":` + fmt.Sprint(i) + `}`),
		}
	}
	return out
}

func openTestStore(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := OpenStore(dir, StoreOptions{Logger: brokertest.Logger(t)})
	if err != nil {
		t.Fatalf("OpenStore: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func write(t testing.TB, s *Store, evs []wire.Event) {
	t.Helper()
	if _, err := s.Write(slices.Clone(evs)); err != nil {
		t.Fatalf("Write: %v", err)
	}
}

// queryAll follows the cursor to the end and returns every event.
func queryAll(t testing.TB, s *Store, q wire.AuditQuery) []wire.Event {
	t.Helper()
	var all []wire.Event
	for range 10000 {
		page, err := s.Query(q)
		if err != nil {
			t.Fatalf("Query(%+v): %v", q, err)
		}
		all = append(all, page.Events...)
		if page.Cursor == "" {
			return all
		}
		if len(page.Events) != cmpLimit(q.Limit) {
			t.Fatalf("page with a cursor has %d events, want a full page of %d", len(page.Events), cmpLimit(q.Limit))
		}
		q.Cursor = page.Cursor
	}
	t.Fatal("cursor never ended")
	return nil
}

func cmpLimit(l int) int {
	if l == 0 {
		return DefaultLimit
	}
	return l
}

func ids(evs []wire.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// want filters evs with keep, in time order.
func want(evs []wire.Event, keep func(*wire.Event) bool) []string {
	var out []string
	for i := range evs {
		if keep(&evs[i]) {
			out = append(out, evs[i].ID)
		}
	}
	return out
}

func TestQueryOrderAndPagination(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	evs := testEvents(600) // 70 hours: four UTC days
	// Written in reverse, in several batches: the order comes from the keys.
	rev := slices.Clone(evs)
	slices.Reverse(rev)
	for c := range slices.Chunk(rev, 97) {
		write(t, s, c)
	}
	all := want(evs, func(*wire.Event) bool { return true })
	for _, limit := range []int{1, 7, 100, 600, 1000} {
		got := ids(queryAll(t, s, wire.AuditQuery{Limit: limit}))
		if !slices.Equal(got, all) {
			t.Errorf("limit %d: got %d events (first %v), want %d in time order", limit, len(got), got[:min(3, len(got))], len(all))
		}
	}
	page, err := s.Query(wire.AuditQuery{Limit: 600})
	if err != nil {
		t.Fatal(err)
	}
	if page.Cursor != "" {
		t.Errorf("Cursor = %q after the last event, want none", page.Cursor)
	}
	page, err = s.Query(wire.AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != DefaultLimit || page.Cursor == "" {
		t.Errorf("default page = %d events, cursor %q; want %d and a cursor", len(page.Events), page.Cursor, DefaultLimit)
	}
	got := page.Events[5]
	got.Payload = nil
	wantEv := evs[5]
	wantEv.Payload = nil
	if !got.Time.Equal(wantEv.Time) || got.ID != wantEv.ID || got.TaskID != wantEv.TaskID || got.Host != wantEv.Host {
		t.Errorf("event 5 = %+v, want %+v", got, wantEv)
	}
	if string(page.Events[5].Payload) != `{"n":5}` {
		t.Errorf("event 5 payload = %s, want {\"n\":5}", page.Events[5].Payload)
	}
}

func TestQueryFilters(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	evs := testEvents(500)
	write(t, s, evs)
	since := t0.Add(10 * time.Hour)
	until := t0.Add(40 * time.Hour)
	cases := []struct {
		name string
		q    wire.AuditQuery
		keep func(*wire.Event) bool
	}{
		{"task", wire.AuditQuery{TaskID: "task-1"}, func(e *wire.Event) bool { return e.TaskID == "task-1" }},
		{"task-10 is not task-1", wire.AuditQuery{TaskID: "task-10"}, func(e *wire.Event) bool { return e.TaskID == "task-10" }},
		{"resource", wire.AuditQuery{ResourceID: "cam2"}, func(e *wire.Event) bool { return e.ResourceID == "cam2" }},
		{"route", wire.AuditQuery{RouteID: "route-3"}, func(e *wire.Event) bool { return e.RouteID == "route-3" }},
		{"job", wire.AuditQuery{JobID: "job-5"}, func(e *wire.Event) bool { return e.JobID == "job-5" }},
		{"type", wire.AuditQuery{Type: wire.EventTaskFinished}, func(e *wire.Event) bool { return e.Type == wire.EventTaskFinished }},
		{"level", wire.AuditQuery{Level: wire.LevelWarn}, func(e *wire.Event) bool { return e.Level == wire.LevelWarn }},
		{"since", wire.AuditQuery{Since: &since}, func(e *wire.Event) bool { return !e.Time.Before(since) }},
		{"until", wire.AuditQuery{Until: &until}, func(e *wire.Event) bool { return e.Time.Before(until) }},
		{"time range", wire.AuditQuery{Since: &since, Until: &until}, func(e *wire.Event) bool {
			return !e.Time.Before(since) && e.Time.Before(until)
		}},
		{"task and type in a range", wire.AuditQuery{TaskID: "task-4", Type: wire.EventTaskStarted, Since: &since, Until: &until}, func(e *wire.Event) bool {
			return e.TaskID == "task-4" && e.Type == wire.EventTaskStarted && !e.Time.Before(since) && e.Time.Before(until)
		}},
		{"resource and level", wire.AuditQuery{ResourceID: "cam1", Level: wire.LevelWarn}, func(e *wire.Event) bool {
			return e.ResourceID == "cam1" && e.Level == wire.LevelWarn
		}},
		{"no match", wire.AuditQuery{TaskID: "task-99"}, func(*wire.Event) bool { return false }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, limit := range []int{3, 0} {
				q := c.q
				q.Limit = limit
				got := ids(queryAll(t, s, q))
				w := want(evs, c.keep)
				if !slices.Equal(got, w) {
					t.Errorf("limit %d: got %d events %v, want %d %v", limit, len(got), got[:min(5, len(got))], len(w), w[:min(5, len(w))])
				}
			}
		})
	}
}

func TestQueryRejectsBadQueries(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	early := t0.Add(-time.Hour)
	for name, q := range map[string]wire.AuditQuery{
		"limit too big":      {Limit: MaxLimit + 1},
		"negative limit":     {Limit: -1},
		"bad cursor":         {Cursor: "!!"},
		"short cursor":       {Cursor: "AAAA"},
		"until before since": {Since: &t0, Until: &early},
	} {
		if _, err := s.Query(q); !errors.Is(err, ErrBadQuery) {
			t.Errorf("%s: Query = %v, want ErrBadQuery", name, err)
		}
	}
}

func TestWriteIsIdempotent(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	evs := testEvents(50)
	write(t, s, evs[:30])
	// A redelivered batch overlapping the first, with a duplicate inside,
	// then everything again.
	write(t, s, append(slices.Clone(evs[20:]), evs[45]))
	write(t, s, evs)
	if got := ids(queryAll(t, s, wire.AuditQuery{Limit: MaxLimit})); !slices.Equal(got, ids(evs)) {
		t.Errorf("stored %d events, want the 50 once each", len(got))
	}
	for _, q := range []wire.AuditQuery{{TaskID: "task-3"}, {ResourceID: "cam1"}, {Type: wire.EventTaskStarted}} {
		got := ids(queryAll(t, s, q))
		if len(got) != len(slices.Compact(slices.Clone(got))) || len(got) == 0 {
			t.Errorf("query %+v after redelivery = %v, want each event once", q, got)
		}
	}
}

func TestWriteRejectsInvalidEvents(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	for name, ev := range map[string]wire.Event{
		"no id":       {Type: wire.EventTaskCreated, Time: t0},
		"no type":     {ID: "x", Time: t0},
		"no time":     {ID: "x", Type: wire.EventTaskCreated},
		"year 1":      {ID: "x", Type: wire.EventTaskCreated, Time: time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC)},
		"nul in task": {ID: "x", Type: wire.EventTaskCreated, Time: t0, TaskID: "a\x00b"},
	} {
		if _, err := s.Write([]wire.Event{ev}); !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("%s: Write = %v, want ErrInvalidEvent", name, err)
		}
	}
}

func TestEventsSurviveReopen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	evs := testEvents(200)
	s, err := OpenStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	write(t, s, evs)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s = openTestStore(t, dir)
	if got := ids(queryAll(t, s, wire.AuditQuery{Limit: 33})); !slices.Equal(got, ids(evs)) {
		t.Errorf("after reopen got %d events, want %d", len(got), len(evs))
	}
}

func TestDeleteBeforeRemovesOnlyOldEvents(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	evs := testEvents(700) // t0 .. t0+81h: five UTC days
	write(t, s, evs)
	// The cutoff falls inside a day, so both the range delete of whole days
	// and the per-event deletes of the cutoff's day are exercised.
	cutoff := t0.Add(50*time.Hour + 3*time.Minute)
	for _, kind := range []byte{kindTask, kindResource, kindRoute, kindJob, kindType, kindLevel} {
		if countKeysBefore(t, s, kind, cutoff) == 0 {
			t.Fatalf("no index keys of kind %c before the cutoff to begin with", kind)
		}
	}
	n, err := s.DeleteBefore(context.Background(), cutoff)
	if err != nil {
		t.Fatalf("DeleteBefore: %v", err)
	}
	kept := want(evs, func(e *wire.Event) bool { return !e.Time.Before(cutoff) })
	if n != len(evs)-len(kept) {
		t.Errorf("DeleteBefore removed %d, want %d", n, len(evs)-len(kept))
	}
	if got := ids(queryAll(t, s, wire.AuditQuery{Limit: 1000})); !slices.Equal(got, kept) {
		t.Errorf("after retention got %d events, want the %d from the cutoff on", len(got), len(kept))
	}
	// No index still points at a deleted event.
	for _, q := range []wire.AuditQuery{{TaskID: "task-2"}, {ResourceID: "cam3"}, {RouteID: "route-1"}, {JobID: "job-0"}, {Type: wire.EventTaskCreated}, {Level: wire.LevelInfo}} {
		for _, e := range queryAll(t, s, q) {
			if e.Time.Before(cutoff) {
				t.Errorf("query %+v returned deleted event %s at %s", q, e.ID, e.Time)
			}
		}
	}
	for _, kind := range []byte{kindTask, kindResource, kindRoute, kindJob, kindType, kindLevel} {
		if n := countKeysBefore(t, s, kind, cutoff); n != 0 {
			t.Errorf("%d index keys of kind %c before the cutoff remain, want 0", n, kind)
		}
	}
	if n, err := s.DeleteBefore(context.Background(), cutoff); err != nil || n != 0 {
		t.Errorf("second DeleteBefore = %d, %v; want 0, nil", n, err)
	}
}

// countKeysBefore counts index keys of kind whose event time is before t.
func countKeysBefore(t *testing.T, s *Store, kind byte, before time.Time) int {
	t.Helper()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{spaceIndex, kind}, UpperBound: []byte{spaceIndex, kind + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		if timeOfBytes(suffixOf(it.Key(), kind)[:8]).Before(before) {
			n++
		}
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestCheckpointAnswersTheSameQueries(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	evs := testEvents(300)
	write(t, s, evs)
	backup := filepath.Join(t.TempDir(), "backup")
	if err := s.Checkpoint(backup); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	// Writes after the checkpoint are not in it.
	late := testEvents(301)[300:]
	write(t, s, late)
	// A fetched backup carries its manifest next to Pebble's files.
	if err := os.WriteFile(filepath.Join(backup, wire.AuditBackupManifest), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := openTestStore(t, backup)
	for _, q := range []wire.AuditQuery{{}, {TaskID: "task-7", Limit: 5}, {Type: wire.EventTaskFinished}, {Level: wire.LevelWarn, Since: &evs[100].Time}} {
		got := ids(queryAll(t, b, q))
		w := ids(queryAll(t, s, q))
		if q.TaskID == "" && q.Type == "" && q.Level == "" {
			w = w[:len(w)-1] // the late event
		}
		if !slices.Equal(got, w) {
			t.Errorf("backup answers %+v with %d events, want %d", q, len(got), len(w))
		}
	}
}

func TestWriteErrorLosesNothing(t *testing.T) {
	t.Parallel()
	toggle := &errorfs.Toggle{Injector: errorfs.ErrInjected.If(errorfs.Writes)}
	dir := t.TempDir()
	s, err := OpenStore(dir, StoreOptions{FS: errorfs.Wrap(vfs.Default, toggle), Logger: brokertest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	evs := testEvents(90)
	write(t, s, evs[:30])

	toggle.On()
	if _, err := s.Write(slices.Clone(evs[30:60])); err == nil {
		t.Fatal("Write with the disk failing = nil, want an error")
	}
	if _, err := s.Query(wire.AuditQuery{}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Query on a failed store = %v, want ErrUnavailable", err)
	}
	if _, err := s.Write(slices.Clone(evs[30:60])); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Write on a failed store = %v, want ErrUnavailable", err)
	}
	if err := s.Recover(); err == nil {
		t.Error("Recover with the disk still failing = nil, want an error")
	}

	toggle.Off()
	if err := s.Recover(); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	// The failed batch is written again, as the sink does, with the rest.
	write(t, s, evs[30:])
	if got := ids(queryAll(t, s, wire.AuditQuery{Limit: 1000})); !slices.Equal(got, ids(evs)) {
		t.Errorf("after recovery got %d events, want all %d", len(got), len(evs))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openTestStore(t, dir)
	if got := queryAll(t, s2, wire.AuditQuery{Limit: 1000}); len(got) != len(evs) {
		t.Errorf("after reopen got %d events, want %d", len(got), len(evs))
	}
}

func TestWriteRedactsPayloads(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	ev := testEvents(1)[0]
	ev.Payload = json.RawMessage(`{"cmd":["x"],"env":{"DB_Password":"hunter2","HOME":"/h"},"steps":[{"Api_Key":"k","name":"a"}],"Authorization":"Bearer z"}`)
	write(t, s, []wire.Event{ev})
	page, err := s.Query(wire.AuditQuery{})
	if err != nil || len(page.Events) != 1 {
		t.Fatalf("Query = %d events, %v; want 1", len(page.Events), err)
	}
	var got map[string]any
	if err := json.Unmarshal(page.Events[0].Payload, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"cmd":           []any{"x"},
		"env":           map[string]any{"DB_Password": wire.Redacted, "HOME": "/h"},
		"steps":         []any{map[string]any{"Api_Key": wire.Redacted, "name": "a"}},
		"Authorization": wire.Redacted,
	}
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if string(gb) != string(wb) {
		t.Errorf("stored payload = %s, want %s", gb, wb)
	}
}

func TestQueryScanBudget(t *testing.T) {
	t.Parallel()
	s, err := OpenStore(t.TempDir(), StoreOptions{ScanBudget: 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	evs := testEvents(200)
	write(t, s, evs)
	// task-5 and TASK_FINISHED: the task index holds 18 keys, 6 match.
	q := wire.AuditQuery{TaskID: "task-5", Type: wire.EventTaskFinished, Limit: 4}
	w := want(evs, func(e *wire.Event) bool { return e.TaskID == "task-5" && e.Type == wire.EventTaskFinished })
	var got []string
	pages := 0
	for {
		page, err := s.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		got = append(got, ids(page.Events)...)
		if page.Cursor == "" {
			break
		}
		q.Cursor = page.Cursor
	}
	if !slices.Equal(got, w) {
		t.Errorf("paged with a scan budget of 10: got %v, want %v", got, w)
	}
	if pages < 2 {
		t.Errorf("%d pages, want the budget to cut at least one short", pages)
	}
	// Without a filter match in budget, an empty page still moves on.
	q = wire.AuditQuery{ResourceID: "cam1", Level: wire.LevelError}
	page, err := s.Query(q)
	if err != nil || len(page.Events) != 0 || page.Cursor == "" {
		t.Errorf("no match within budget = %d events, cursor %q, %v; want none and a cursor", len(page.Events), page.Cursor, err)
	}
}

// TestQueryPageBytes: a page stops before its byte budget, whatever its
// limit; an event over the budget on its own comes alone, its payload
// replaced by a note, and stays whole in the store.
func TestQueryPageBytes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := OpenStore(dir, StoreOptions{PageBytes: 2000})
	if err != nil {
		t.Fatal(err)
	}
	evs := testEvents(10)
	for i := range evs {
		evs[i].Payload = json.RawMessage(`{"pad":"` + strings.Repeat("p", 500) + `"}`)
	}
	evs[4].Payload = json.RawMessage(`{"pad":"` + strings.Repeat("q", 5000) + `"}`)
	write(t, s, evs)
	q := wire.AuditQuery{Limit: 100}
	var got []string
	for pages := 1; ; pages++ {
		page, err := s.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		size := 0
		for _, ev := range page.Events {
			data, _ := json.Marshal(ev)
			size += len(data) + 1
			if ev.ID == evs[4].ID && (len(page.Events) != 1 || !strings.Contains(string(ev.Payload), "OMITTED")) {
				t.Errorf("page %d holds the large event with %d others, payload %.40s; want it alone, its payload omitted", pages, len(page.Events)-1, ev.Payload)
			}
		}
		if size > 2000 {
			t.Errorf("page %d = %d bytes of events, want at most 2000", pages, size)
		}
		got = append(got, ids(page.Events)...)
		if page.Cursor == "" {
			break
		}
		q.Cursor = page.Cursor
	}
	if !slices.Equal(got, ids(evs)) {
		t.Errorf("paged by size: got %v, want %v", got, ids(evs))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if whole := queryAll(t, openTestStore(t, dir), wire.AuditQuery{TaskID: evs[4].TaskID}); !slices.ContainsFunc(whole, func(ev wire.Event) bool {
		return ev.ID == evs[4].ID && len(ev.Payload) > 5000
	}) {
		t.Errorf("the large event is no longer whole in the store")
	}
}

// TestQueryDoesNotWaitForAReopen: while the store is being reopened (a
// Recover holds it), a query answers ErrUnavailable at once rather than
// waiting, and its requester timing out.
func TestQueryDoesNotWaitForAReopen(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.Query(wire.AuditQuery{}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Query during a reopen = %v, want ErrUnavailable", err)
	}
}
