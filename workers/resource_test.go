package workers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/lease"
)

func resources(t *testing.T, b *bundle) *lease.Resources {
	t.Helper()
	r, err := lease.NewResources(b.env.JS, lease.ResourcesConfig{Audit: audit.NewEmitter(b.env.JS, "test", nil)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestResourceTasksNeverOverlap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := resources(t, b)
	if _, err := res.Add(context.Background(), lease.ResourceSpec{ID: "cam1"}); err != nil {
		t.Fatal(err)
	}
	var running, most atomic.Int32
	var states atomic.Value
	h := HandlerFunc(func(ctx context.Context, t *Task) error {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		if r, err := res.Get(ctx, "cam1"); err == nil {
			states.Store(string(r.State))
		}
		time.Sleep(100 * time.Millisecond)
		return nil
	})
	cfg := Config{BusyDelay: 50 * time.Millisecond, Policy: Policy{Delay: 200 * time.Millisecond}}
	b.start(t, cfg, map[string]Handler{"snap": h})
	b.start(t, cfg, map[string]Handler{"snap": h})
	for i := range 4 {
		b.publish(t, wire.TaskSubject("", "snap"), fmt.Sprintf(`{"id":"s%d","resource":"cam1"}`, i))
	}
	for i := range 4 {
		rec := b.waitState(t, fmt.Sprintf("s%d", i), wire.TaskSucceeded, 20*time.Second)
		if rec.Attempts != 1 {
			t.Errorf("s%d attempts = %d, want 1 (busy is a delay, not an attempt)", i, rec.Attempts)
		}
	}
	if got := most.Load(); got != 1 {
		t.Errorf("tasks on cam1 at once = %d, want 1", got)
	}
	if got, _ := states.Load().(string); got != string(wire.ResourceRunning) {
		t.Errorf("resource state while running = %q, want RUNNING", got)
	}
	r, err := res.Get(context.Background(), "cam1")
	if err != nil || r.State != wire.ResourceAvailable {
		t.Errorf("resource after = %v (%v), want AVAILABLE", r.State, err)
	}
}

func TestResourceFault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := resources(t, b)
	if _, err := res.Add(context.Background(), lease.ResourceSpec{ID: "printer"}); err != nil {
		t.Fatal(err)
	}
	var env atomic.Value
	h := HandlerFunc(func(ctx context.Context, t *Task) error {
		env.Store(t.Resource)
		return lease.Fault(errors.New("paper jam"))
	})
	b.start(t, Config{Policy: Policy{Delay: time.Minute, BackoffBase: 50 * time.Millisecond}}, map[string]Handler{"print": h})
	b.publish(t, wire.TaskSubject("", "print"), `{"id":"pr1","resource":"printer"}`)
	rec := b.waitState(t, "pr1", wire.TaskRetryWait, 10*time.Second)
	if rec.Attempts != 1 || rec.Resource != "printer" {
		t.Errorf("record = attempts %d, resource %q; want 1, printer", rec.Attempts, rec.Resource)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := res.Get(context.Background(), "printer")
		if err == nil && r.State == wire.ResourceFault {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("resource = %v (%v), want FAULT", r.State, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The retry finds the resource in FAULT: a delay, not an attempt.
	b.waitEvents(t, "pr1", wire.EventRetryScheduled, 2, 10*time.Second)
	rec, _, _ = b.tasks.Get(context.Background(), "pr1")
	if rec.Attempts != 1 || rec.Delays != 1 {
		t.Errorf("after retry: attempts = %d, delays = %d, want 1 and 1", rec.Attempts, rec.Delays)
	}
	if got, _ := env.Load().(string); got != "printer" {
		t.Errorf("Task.Resource = %q, want printer", got)
	}
}

// TestResourceBusyLastError: a task whose resource someone else holds
// records why once: "resource cam1 is held by alice until …", not
// "resource cam1: resource cam1 is held …".
func TestResourceBusyLastError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := resources(t, b)
	ctx := context.Background()
	if _, err := res.Add(ctx, lease.ResourceSpec{ID: "cam1"}); err != nil {
		t.Fatal(err)
	}
	h, err := res.Lease(ctx, "cam1", "alice", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	h.Detach()
	b.start(t, Config{BusyDelay: time.Minute, Policy: Policy{Delay: time.Minute}}, map[string]Handler{"snap": HandlerFunc(func(context.Context, *Task) error { return nil })})
	b.publish(t, wire.TaskSubject("", "snap"), `{"id":"busy1","resource":"cam1"}`)
	b.waitEvents(t, "busy1", wire.EventRetryScheduled, 1, 10*time.Second)
	rec, _, err := b.tasks.Get(ctx, "busy1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "resource cam1 is held by alice until "; !strings.HasPrefix(rec.LastError, want) {
		t.Errorf("last_error = %q, want it to start %q", rec.LastError, want)
	}
}
