package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/auditd"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/rpc"
)

// auditEvents returns n events from t, alternating between cam1 and cam2
// and between TASK_STARTED and TASK_FINISHED.
func auditEvents(n int, t time.Time) []wire.Event {
	out := make([]wire.Event, n)
	for i := range out {
		out[i] = wire.Event{
			ID: fmt.Sprintf("ev-%04d", i), Time: t.Add(time.Duration(i) * time.Millisecond),
			Type: wire.EventTaskStarted, Level: wire.LevelInfo, Component: "test", Host: "pc-1",
			TaskID: fmt.Sprintf("task-%d", i%3), ResourceID: fmt.Sprintf("cam%d", 1+i%2),
			Message: fmt.Sprintf("event %d", i),
		}
		if i%4 == 3 {
			out[i].Type, out[i].Level = wire.EventTaskFinished, wire.LevelWarn
		}
	}
	return out
}

func publishEvents(t *testing.T, js jetstream.JetStream, evs []wire.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, ev := range evs {
		data, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, ev.Type.Subject(), data); err != nil {
			t.Fatal(err)
		}
	}
}

// queryJSON runs `gantry audit query --json` and decodes the page.
func queryJSON(t *testing.T, url string, args ...string) (wire.AuditPage, int, string) {
	t.Helper()
	code, stdout, stderr := runInProcess(t, append([]string{"audit", "query", "--server", url, "--json"}, args...)...)
	var page wire.AuditPage
	if code == exitOK {
		if err := json.Unmarshal([]byte(stdout), &page); err != nil {
			t.Fatalf("audit query --json printed %q: %v", stdout, err)
		}
	}
	return page, code, stderr
}

func waitQuery(t *testing.T, url string, n int, args ...string) wire.AuditPage {
	t.Helper()
	var page wire.AuditPage
	poll.For(t, 20*time.Second, 50*time.Millisecond, func() error {
		var code int
		var stderr string
		if page, code, stderr = queryJSON(t, url, args...); code != exitOK || len(page.Events) != n {
			return fmt.Errorf("audit query %v: exit %d, %d events, stderr %q; want %d events", args, code, len(page.Events), stderr, n)
		}
		return nil
	})
	return page
}

func TestAuditQueryAndBackupThroughRun(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "", "--audit-retention", "90d")
	nc, js := brokertest.Connect(t, ready.NATS)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stats wire.AuditStats
	if err := rpc.Request(ctx, nc, wire.SubjectAuditStats, nil, &stats); err != nil {
		t.Fatalf("audit stats: %v", err)
	}
	if want := (90 * 24 * time.Hour).String(); stats.Retention != want {
		t.Errorf("retention = %s, want %s from --audit-retention 90d", stats.Retention, want)
	}
	// A day before now, so they stay clear of the events gantry emits itself.
	evs := auditEvents(20, time.Now().Add(-24*time.Hour))
	publishEvents(t, js, evs)
	since := evs[0].Time.Format(time.RFC3339Nano)
	until := evs[19].Time.Add(time.Millisecond).Format(time.RFC3339Nano)
	window := []string{"--since", since, "--until", until}
	page := waitQuery(t, ready.NATS, 20, append(window, "--limit", "1000")...)
	for i, ev := range page.Events {
		if ev.ID != evs[i].ID {
			t.Fatalf("event %d = %s, want %s (oldest first)", i, ev.ID, evs[i].ID)
		}
	}

	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"--resource", "cam1"}, 10},
		{[]string{"--task", "task-2"}, 6},
		{[]string{"--type", "task_finished"}, 5},
		{[]string{"--level", "WARN", "--resource", "cam2"}, 5},
		// A type declared outside the contract's list is a valid filter.
		{[]string{"--type", "resource_move_refused"}, 0},
	} {
		page, code, stderr := queryJSON(t, ready.NATS, append(window, tc.args...)...)
		if code != exitOK || len(page.Events) != tc.want {
			t.Errorf("audit query %v = exit %d, %d events (%s); want %d", tc.args, code, len(page.Events), stderr, tc.want)
		}
	}

	// Pages: --limit 3 leaves a cursor; --all follows it.
	page, _, _ = queryJSON(t, ready.NATS, append(window, "--limit", "3")...)
	if len(page.Events) != 3 || page.Cursor == "" {
		t.Fatalf("--limit 3 = %d events, cursor %q; want 3 and a cursor", len(page.Events), page.Cursor)
	}
	next, _, _ := queryJSON(t, ready.NATS, append(window, "--limit", "3", "--cursor", page.Cursor)...)
	if len(next.Events) != 3 || next.Events[0].ID != evs[3].ID {
		t.Errorf("second page starts with %v, want %s", ids(next.Events), evs[3].ID)
	}
	all, _, _ := queryJSON(t, ready.NATS, append(window, "--limit", "3", "--all")...)
	if got := ids(all.Events); len(got) != 20 || all.Cursor != "" {
		t.Errorf("--all = %d events, cursor %q; want 20 and none", len(got), all.Cursor)
	}

	// The table.
	code, stdout, stderr := runInProcess(t, append([]string{"audit", "query", "--server", ready.NATS, "--task", "task-1", "--limit", "2"}, window...)...)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != exitOK || len(lines) != 3 || !strings.HasPrefix(lines[0], "TIME") || !strings.Contains(lines[1], "task-1") {
		t.Errorf("table = exit %d:\n%s\nwant a header and two task-1 rows", code, stdout)
	}
	if !strings.Contains(stderr, "--cursor") {
		t.Errorf("stderr = %q, want the next page's cursor", stderr)
	}

	// Bad input exits 2.
	for _, args := range [][]string{
		{"--type", "not a type"}, {"--level", "loud"}, {"--limit", "0"}, {"--since", "yesterday-ish"},
		{"--cursor", "%%%"}, {"--since", "2026-11-30", "--until", "2026-11-29"},
	} {
		if _, code, stderr := queryJSON(t, ready.NATS, args...); code != exitUsage {
			t.Errorf("audit query %v = exit %d (%s), want %d", args, code, stderr, exitUsage)
		}
	}

	// Backup: the copy answers the same queries.
	dir := filepath.Join(t.TempDir(), "bk")
	code, stdout, stderr = runInProcess(t, "audit", "backup", dir, "--server", ready.NATS)
	if code != exitOK || !strings.Contains(stdout, "backed up") {
		t.Fatalf("audit backup = exit %d, %q, %q", code, stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, wire.AuditBackupManifest)); err != nil {
		t.Errorf("backup manifest: %v", err)
	}
	st, err := auditd.OpenStore(dir, auditd.StoreOptions{})
	if err != nil {
		t.Fatalf("open backup: %v", err)
	}
	defer st.Close()
	s, u := evs[0].Time, evs[19].Time.Add(time.Millisecond)
	got, err := st.Query(wire.AuditQuery{ResourceID: "cam1", Since: &s, Until: &u})
	if err != nil || len(got.Events) != 10 {
		t.Errorf("backup query = %d events, %v; want 10", len(got.Events), err)
	}
	if code, _, stderr := runInProcess(t, "audit", "backup", dir, "--server", ready.NATS); code != exitUsage {
		t.Errorf("backup into a non-empty dir = exit %d (%s), want %d", code, stderr, exitUsage)
	}
}

func ids(evs []wire.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// syncBuffer is a bytes.Buffer safe to read while the CLI writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestAuditTail(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	evs := auditEvents(12, time.Now())
	start := time.Now().Add(-time.Second)
	publishEvents(t, env.JS, evs[:6])

	t.Run("since and filters", func(t *testing.T) {
		code, stdout, stderr := runInProcess(t, "audit", "tail", "--server", env.URL, "--json",
			"--since", start.Format(time.RFC3339Nano), "--resource", "cam2", "--count", "3")
		if code != exitOK {
			t.Fatalf("tail = exit %d, %s", code, stderr)
		}
		var got []string
		sc := bufio.NewScanner(strings.NewReader(stdout))
		for sc.Scan() {
			var ev wire.Event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("tail line %q: %v", sc.Text(), err)
			}
			got = append(got, ev.ID)
		}
		if want := []string{"ev-0001", "ev-0003", "ev-0005"}; !slices.Equal(got, want) {
			t.Errorf("tail --resource cam2 = %v, want %v", got, want)
		}
	})

	t.Run("live", func(t *testing.T) {
		var out, errb syncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan int, 1)
		go func() {
			done <- Run(ctx, []string{"audit", "tail", "--server", env.URL, "--type", "TASK_FINISHED"}, strings.NewReader(""), &out, &errb)
		}()
		// Tail starts at new events: publish until one shows up.
		deadline := time.After(20 * time.Second)
		for i := 0; !strings.Contains(out.String(), "TASK_FINISHED"); i++ {
			ev := evs[6+i%6]
			ev.ID = fmt.Sprintf("live-%d", i)
			publishEvents(t, env.JS, []wire.Event{ev})
			select {
			case <-deadline:
				t.Fatalf("no live event within 20s; stdout %q stderr %q", out.String(), errb.String())
			case <-time.After(50 * time.Millisecond):
			}
		}
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("tail after cancel = exit %d (%s), want 0", code, errb.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("tail did not stop within 10s of cancel")
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		for _, line := range lines[1:] {
			if !strings.Contains(line, "TASK_FINISHED") || strings.Contains(line, "ev-00") {
				t.Errorf("tail --type TASK_FINISHED printed %q", line)
			}
		}
		checkAligned(t, lines)
	})
}

// checkAligned checks that every column of a table starts where its
// header does, in every row.
func checkAligned(t *testing.T, lines []string) {
	t.Helper()
	header := []rune(lines[0])
	for _, line := range lines[1:] {
		row := []rune(line)
		for i := 1; i < len(header) && i < len(row); i++ {
			if header[i] != ' ' && header[i-1] == ' ' && (row[i-1] != ' ' || row[i] == ' ') {
				t.Errorf("column %q starts at %d in the header but not in row %q", strings.Fields(string(header[i:]))[0], i, line)
				break
			}
		}
	}
}

func TestAuditdStandalone(t *testing.T) {
	t.Parallel()
	_, broker := startGantry(t, "broker", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	data := t.TempDir()
	cmd, _ := startGantry(t, "auditd", "--server", broker.NATS, "--data", data, "--audit-retention", "90d")
	_, js := brokertest.Connect(t, broker.NATS)
	evs := auditEvents(8, time.Now())
	publishEvents(t, js, evs)
	waitQuery(t, broker.NATS, 8, "--since", evs[0].Time.Format(time.RFC3339Nano))
	code, stdout, _ := runInProcess(t, "audit", "query", "--server", broker.NATS, "--json", "--task", "task-0")
	if code != exitOK || strings.Count(stdout, `"task_id": "task-0"`) != 3 {
		t.Errorf("query --task task-0 = exit %d:\n%s\nwant 3 events", code, stdout)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("auditd after SIGINT = %v, want exit 0", err)
	}
	if _, err := os.Stat(filepath.Join(data, "audit")); err != nil {
		t.Errorf("audit store dir: %v", err)
	}
}

func TestAuditFlagErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"auditd", "--audit-retention", "forever"},
		{"auditd", "--audit-retention", "-3d"},
		{"run", "--audit-retention", "1x"},
		{"audit", "tail", "--count", "-1"},
		{"audit", "tail", "--type", "task.finished"},
		{"audit", "backup"},
	} {
		if code, _, stderr := runInProcess(t, args...); code != exitUsage {
			t.Errorf("gantry %v = exit %d (%s), want %d", args, code, stderr, exitUsage)
		}
	}
}

func TestRetentionValue(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"30d": 30 * 24 * time.Hour, "36h": 36 * time.Hour, "0": 0, "90m": 90 * time.Minute} {
		var r retentionValue
		if err := r.Set(in); err != nil || time.Duration(r) != want {
			t.Errorf("Set(%q) = %s, %v; want %s", in, time.Duration(r), err, want)
		}
	}
	r := retentionValue(auditd.DefaultRetention)
	if got := r.String(); got != "30d" {
		t.Errorf("default retention prints %q, want 30d", got)
	}
}

func TestAuditNoService(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	code, _, stderr := runInProcess(t, "audit", "query", "--server", env.URL)
	if code != exitFailure || !strings.Contains(stderr, "auditd") {
		t.Errorf("query with no auditd = exit %d, %q; want 1 naming auditd", code, stderr)
	}
}

func TestAuditEventsSurviveAKill(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	args := []string{"run", "--data", data, "--nats-listen", "127.0.0.1:0", "--http-listen", ""}
	cmd, ready := startGantry(t, args...)
	nc, js := brokertest.Connect(t, ready.NATS)
	evs := auditEvents(30, time.Now().Add(-48*time.Hour))
	publishEvents(t, js, evs)
	window := []string{"--since", evs[0].Time.Format(time.RFC3339Nano), "--until", evs[29].Time.Add(time.Millisecond).Format(time.RFC3339Nano)}
	waitQuery(t, ready.NATS, 30, window...)
	nc.Close()
	// No drain, no flush: the process dies.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	_, ready = startGantry(t, args...)
	page := waitQuery(t, ready.NATS, 30, window...)
	if got := ids(page.Events); !slices.Equal(got, ids(evs)) {
		t.Errorf("after kill and restart got %v, want %v", got, ids(evs))
	}
}

// TestAuditQueryFillsItsLimit: auditd answers a page of large events in
// parts under the broker's message limit; `audit query --limit N` puts N
// events together.
func TestAuditQueryFillsItsLimit(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	_, js := brokertest.Connect(t, ready.NATS)
	evs := auditEvents(3, time.Now().Add(-24*time.Hour))
	for i := range evs {
		evs[i].TaskID = "bulky"
		evs[i].Payload = json.RawMessage(`{"blob":"` + strings.Repeat("b", 500<<10) + `"}`)
	}
	publishEvents(t, js, evs)
	page := waitQuery(t, ready.NATS, 3, "--task", "bulky", "--limit", "3")
	if page.Cursor != "" || page.Events[2].ID != evs[2].ID {
		t.Errorf("--limit 3 = %v, cursor %q; want the 3 events, no cursor", ids(page.Events), page.Cursor)
	}
}
