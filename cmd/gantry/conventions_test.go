package main

import (
	"context"
	"encoding/json"
	"fmt"
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
