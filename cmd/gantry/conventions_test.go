package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/egress"
	"github.com/gantry-dev/gantry/internal/brokertest"
)

// TestResourceAddUnknownRoute: 'resource add --route' refuses a route
// gantry_routes does not hold (exit 2, naming the known ones), takes one it
// holds, and registers an unknown one with --force.
func TestResourceAddUnknownRoute(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	store, err := egress.NewStore(context.Background(), env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(context.Background(), wire.Route{ID: "office", State: wire.RouteAvailable, Score: 100}); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runBinary(t, "resource", "add", "cam1", "--route", "ofice", "--server", env.URL)
	if code != exitUsage || !strings.Contains(stderr, `"ofice": no such egress route (known: office)`) {
		t.Errorf("resource add --route ofice = exit %d, %q; want exit 2 naming the known routes", code, stderr)
	}
	for _, args := range [][]string{{"cam1", "--route", "office"}, {"cam2", "--route", "later", "--force"}} {
		if code, _, stderr := runBinary(t, append([]string{"resource", "add", "--server", env.URL}, args...)...); code != exitOK {
			t.Errorf("resource add %v = exit %d (%s), want 0", args, code, stderr)
		}
	}
}

// TestListPaging: 'task ls' prints the newest 100 tasks unless --limit or
// --all say otherwise, and says on stderr that there are more; the other
// lists page the same way.
func TestListPaging(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	c, err := client.New(env.NC)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range defaultPage + 1 {
		if _, err := c.Submit(ctx, client.Task{Type: "noop", ID: fmt.Sprintf("t%03d", i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.AddResource(ctx, client.ResourceSpec{ID: fmt.Sprintf("r%03d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	rows := func(out string) []string { return strings.Split(strings.TrimSpace(out), "\n")[1:] }
	code, out, stderr := runBinary(t, "task", "ls", "--server", env.URL)
	if got := rows(out); code != exitOK || len(got) != defaultPage || !strings.HasPrefix(got[0], "t001 ") || !strings.Contains(stderr, "showing the newest 100 tasks") {
		t.Errorf("task ls = exit %d, %d rows (first %q), stderr %q; want 100 rows from t001, a note on stderr", code, len(got), got[0], stderr)
	}
	if code, out, _ = runBinary(t, "task", "ls", "--all", "--server", env.URL); len(rows(out)) != defaultPage+1 {
		t.Errorf("task ls --all = exit %d, %d rows, want %d", code, len(rows(out)), defaultPage+1)
	}
	if code, out, _ = runBinary(t, "resource", "ls", "--limit", "5", "--server", env.URL); len(rows(out)) != 5 {
		t.Errorf("resource ls --limit 5 = exit %d, %d rows, want 5", code, len(rows(out)))
	}
	if code, _, _ = runBinary(t, "task", "ls", "--limit", "0", "--server", env.URL); code != exitUsage {
		t.Errorf("task ls --limit 0 = exit %d, want %d", code, exitUsage)
	}
	// The contract's fields are there even when empty.
	_, out, _ = runBinary(t, "task", "get", "t000", "--json", "--server", env.URL)
	var rec map[string]any
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "type", "queue", "state", "attempts", "last_error", "resource", "created_at", "updated_at"} {
		if _, ok := rec[k]; !ok {
			t.Errorf("task get --json = %s, want key %q", out, k)
		}
	}
}

// TestJobLsStatus: 'job ls' shows what the schedulers make of each job (a
// rejected one with its reason, one written without a queue on the
// default queue) and a NEXT inside the job's window; 'job next' previews.
func TestJobLsStatus(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	kv, err := env.JS.KeyValue(ctx, wire.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	for key, val := range map[string]string{
		"noqueue": `{"type":"noop","every":"1m"}`,
		"wrong":   `{"type":"noop","every":"1.5s"}`,
		"night":   `{"type":"noop","every":"10s","windows":["06:00-06:01"],"timezone":"Europe/Berlin"}`,
	} {
		if _, err := kv.PutString(ctx, key, val); err != nil {
			t.Fatal(err)
		}
	}
	code, out, stderr := runBinary(t, "job", "ls", "--server", env.URL)
	if code != exitOK {
		t.Fatalf("job ls = exit %d (%s)", code, stderr)
	}
	rows := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = l
		}
	}
	if !strings.Contains(rows["noqueue"], "default/noop") || !strings.Contains(rows["noqueue"], " active ") {
		t.Errorf("noqueue row = %q, want default/noop, active", rows["noqueue"])
	}
	if !strings.Contains(rows["wrong"], "rejected: invalid job") || !strings.Contains(rows["wrong"], `every "1.5s" must be`) {
		t.Errorf("wrong row = %q, want rejected with the reason", rows["wrong"])
	}
	if !strings.Contains(rows["night"], "T06:00:") || !strings.Contains(rows["night"], "+01:00") {
		t.Errorf("night row = %q, want NEXT at 06:00 Berlin time", rows["night"])
	}
	code, out, stderr = runBinary(t, "job", "next", "night", "--count", "7", "--server", env.URL)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 8 || !strings.Contains(lines[7], "T06:00:00+01:00") {
		t.Errorf("job next night --count 7 = exit %d, %q (%s); want 7 fires, the 7th at 06:00 the next day", code, out, stderr)
	}
}

// TestNATSContext: client commands connect with the nats CLI's context
// (--context, or the one selected), and explicit flags win over it.
func TestNATSContext(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "nats", "context"), 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, "nats", name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("context/plant.json", fmt.Sprintf(`{"description":"test broker","url":%q}`, env.URL))
	write("context/nowhere.json", `{"url":"nats://127.0.0.1:1"}`)
	xdg := []string{"XDG_CONFIG_HOME=" + dir, "NATS_URL=", "NATS_CONTEXT="}

	if code, _, stderr := runBinaryEnv(t, xdg, "resource", "ls", "--context", "plant"); code != exitOK {
		t.Errorf("resource ls --context plant = exit %d (%s), want 0", code, stderr)
	}
	if code, _, stderr := runBinaryEnv(t, xdg, "resource", "ls", "--context", "plant", "--server", "nats://127.0.0.1:1", "--timeout", "1s"); code != exitFailure {
		t.Errorf("resource ls --context plant --server elsewhere = exit %d (%s), want 1: the flag wins", code, stderr)
	}
	if code, _, stderr := runBinaryEnv(t, xdg, "resource", "ls", "--context", "nope"); code != exitNotFound || !strings.Contains(stderr, `unknown nats context "nope"`) {
		t.Errorf("resource ls --context nope = exit %d (%s), want 4 naming the context", code, stderr)
	}
	// The selected context applies without --context; NATS_CONTEXT names one.
	write("context.txt", "plant")
	if code, _, stderr := runBinaryEnv(t, xdg, "resource", "ls"); code != exitOK {
		t.Errorf("resource ls with plant selected = exit %d (%s), want 0", code, stderr)
	}
	if code, _, _ := runBinaryEnv(t, append(xdg, "NATS_CONTEXT=nowhere"), "resource", "ls", "--timeout", "1s"); code != exitFailure {
		t.Errorf("resource ls with NATS_CONTEXT=nowhere = exit %d, want 1", code)
	}
}
