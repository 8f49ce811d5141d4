package workers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/lease"
	"github.com/gantry-dev/gantry/lease/leasetest"
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
		time.Sleep(100 * time.Millisecond) // a slow handler: runs on one resource must overlap if the lease fails
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
	var runs atomic.Int32
	h := HandlerFunc(func(ctx context.Context, t *Task) error {
		env.Store(t.Resource)
		if runs.Add(1) == 1 {
			return lease.Fault(errors.New("paper jam"))
		}
		return nil
	})
	b.start(t, Config{Policy: Policy{Delay: time.Minute, BackoffBase: 50 * time.Millisecond}}, map[string]Handler{"print": h})
	b.publish(t, wire.TaskSubject("", "print"), `{"id":"pr1","resource":"printer"}`)
	// The retry finds the resource in FAULT: it waits in line, and an
	// operator's enable wakes it.
	line := leasetest.WaitLine(t, res, "printer", 1)
	if line[0].TaskID != "pr1" {
		t.Errorf("line = %+v, want pr1", line)
	}
	if r := resourceState(t, res, "printer"); r.State != wire.ResourceFault {
		t.Errorf("resource = %v, want FAULT", r.State)
	}
	rec := b.waitState(t, "pr1", wire.TaskWaiting, 10*time.Second)
	if rec.Attempts != 1 || !strings.Contains(rec.LastError, "waiting for resource printer: FAULT") {
		t.Errorf("record while waiting = attempts %d, last_error %q; want 1 and waiting for the FAULT printer", rec.Attempts, rec.LastError)
	}
	if _, err := res.Enable(context.Background(), "printer", "paper refilled"); err != nil {
		t.Fatal(err)
	}
	rec = b.waitState(t, "pr1", wire.TaskSucceeded, 10*time.Second)
	if rec.Attempts != 2 || rec.Delays != 0 {
		t.Errorf("record = attempts %d, delays %d; want 2 and 0 (the wait is neither)", rec.Attempts, rec.Delays)
	}
	if got, _ := env.Load().(string); got != "printer" {
		t.Errorf("Task.Resource = %q, want printer", got)
	}
}

func resourceState(t *testing.T, res *lease.Resources, id string) lease.Resource {
	t.Helper()
	r, err := res.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// span is when one run of a task started and ended.
type span struct {
	id         string
	start, end time.Time
}

// TestResourceQueueWakesOnRelease: ten short tasks on one resource, on two
// worker processes, run one after the other as fast as they end, not one
// per lease TTL.
func TestResourceQueueWakesOnRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := resources(t, b)
	if _, err := res.Add(context.Background(), lease.ResourceSpec{ID: "cam"}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var spans []span
	h := HandlerFunc(func(ctx context.Context, t *Task) error {
		s := span{id: t.ID, start: time.Now()}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		s.end = time.Now()
		mu.Lock()
		spans = append(spans, s)
		mu.Unlock()
		return nil
	})
	// A wait per lease TTL (the old behaviour) would take minutes.
	cfg := Config{LeaseTTL: time.Minute}
	b.start(t, cfg, map[string]Handler{"snap": h})
	b.start(t, cfg, map[string]Handler{"snap": h})
	start := time.Now()
	for i := range 10 {
		b.publish(t, wire.TaskSubject("", "snap"), fmt.Sprintf(`{"id":"q%d","resource":"cam"}`, i))
	}
	for i := range 10 {
		rec := b.waitState(t, fmt.Sprintf("q%d", i), wire.TaskSucceeded, 30*time.Second-time.Since(start))
		if rec.Attempts != 1 {
			t.Errorf("q%d attempts = %d, want 1 (waiting is not an attempt)", i, rec.Attempts)
		}
	}
	total := time.Since(start)
	t.Logf("ten 0.2s tasks on one resource: %v end to end", total)
	if total > 30*time.Second {
		t.Errorf("ten 0.2s tasks took %v, want well under one 60s lease TTL", total)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(spans, func(a, b span) int { return a.start.Compare(b.start) })
	if len(spans) != 10 {
		t.Fatalf("runs = %d, want 10", len(spans))
	}
	var gaps []time.Duration
	for i := 1; i < len(spans); i++ {
		if spans[i].start.Before(spans[i-1].end) {
			t.Errorf("%s started at %v, before %s ended at %v: overlap", spans[i].id, spans[i].start, spans[i-1].id, spans[i-1].end)
		}
		gaps = append(gaps, spans[i].start.Sub(spans[i-1].end))
	}
	t.Logf("end of one -> start of the next: %v", gaps)
}

// TestResourceWaitOrder: tasks that wait for a held resource start in the
// order published; on a prioritized queue, highest priority first.
func TestResourceWaitOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		prioritized bool
		bodies      []string
		want        string
	}{
		{"fifo", false, []string{`{"id":"A","resource":"cam","priority":1}`, `{"id":"B","resource":"cam","priority":9}`, `{"id":"C","resource":"cam"}`}, "A,B,C"},
		{"prioritized", true, []string{`{"id":"A","resource":"cam"}`, `{"id":"B","resource":"cam","priority":5}`, `{"id":"C","resource":"cam","priority":1}`}, "B,C,A"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			res := resources(t, b)
			ctx := context.Background()
			if _, err := res.Add(ctx, lease.ResourceSpec{ID: "cam"}); err != nil {
				t.Fatal(err)
			}
			holder, err := res.Lease(ctx, "cam", "operator", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			rec := newRecorder()
			cfg := Config{Queues: []Queue{{Name: wire.DefaultQueue, Prioritized: tc.prioritized}}}
			b.start(t, cfg, map[string]Handler{"snap": rec})
			b.start(t, cfg, map[string]Handler{"snap": rec})
			for _, body := range tc.bodies {
				b.publish(t, wire.TaskSubject("", "snap"), body)
			}
			line := leasetest.WaitLine(t, res, "cam", 3)
			var ids []string
			for _, w := range line {
				ids = append(ids, w.TaskID)
			}
			if got := strings.Join(ids, ","); got != tc.want {
				t.Errorf("line = %s, want %s", got, tc.want)
			}
			if err := holder.Finish(ctx, lease.Outcome{}); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(rec.wait(t, 3), ","); got != tc.want {
				t.Errorf("started %s, want %s", got, tc.want)
			}
			for _, id := range ids {
				if r := b.waitState(t, id, wire.TaskSucceeded, 10*time.Second); r.Attempts != 1 || r.Delays != 0 {
					t.Errorf("%s: attempts %d, delays %d; want 1 and 0", id, r.Attempts, r.Delays)
				}
			}
		})
	}
}

// TestResourceWaitCancelAndStop: a task waiting in line is cancelled at
// once, and a stopping worker hands its waiting tasks back at once, not
// after its drain timeout.
func TestResourceWaitCancelAndStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := resources(t, b)
	ctx := context.Background()
	holder, err := res.Lease(ctx, "cam", "operator", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Finish(ctx, lease.Outcome{}) }()
	w, _ := b.start(t, Config{DrainTimeout: time.Minute}, map[string]Handler{"snap": newRecorder()})
	b.publish(t, wire.TaskSubject("", "snap"), `{"id":"x1","resource":"cam"}`)
	b.publish(t, wire.TaskSubject("", "snap"), `{"id":"x2","resource":"cam"}`)
	// An unregistered resource has a line too.
	check.For(t, 20*time.Second, 10*time.Millisecond, func() error {
		lines, err := res.Leases().List(ctx)
		if err != nil {
			return err
		}
		if len(lines) != 1 {
			return fmt.Errorf("leases = %v", lines)
		}
		return nil
	})
	b.waitState(t, "x1", wire.TaskWaiting, 10*time.Second)
	b.waitState(t, "x2", wire.TaskWaiting, 10*time.Second)
	reply, err := askCancel(b, "x1", 5*time.Second)
	if err != nil || reply.Action != wire.CancelStopping {
		t.Fatalf("cancel = %+v, %v; want stopping", reply, err)
	}
	if r := b.waitState(t, "x1", wire.TaskCancelled, 10*time.Second); r.Attempts != 0 {
		t.Errorf("cancelled while waiting: attempts = %d, want 0", r.Attempts)
	}
	// Handed back at once (a delay, not an attempt), not after the drain
	// timeout.
	w.Stop()
	check.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		r, _, err := b.tasks.Get(ctx, "x2")
		if err != nil {
			return err
		}
		if r.Attempts != 0 || r.Delays != 1 || !strings.Contains(r.LastError, "stopping while waiting for resource cam") {
			return fmt.Errorf("x2 = attempts %d, delays %d, last_error %q; want 0, 1, stopping while waiting", r.Attempts, r.Delays, r.LastError)
		}
		return nil
	})
}

// TestResourceWaitEndedMeanwhile: a delivery that waited as long as the ack
// deadline may have been redelivered and run elsewhere; when its turn
// comes, it finds the task ended and does not run it again.
func TestResourceWaitEndedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := resources(t, b)
	ctx := context.Background()
	if _, err := res.Add(ctx, lease.ResourceSpec{ID: "cam"}); err != nil {
		t.Fatal(err)
	}
	holder, err := res.Lease(ctx, "cam", "operator", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := HandlerFunc(func(context.Context, *Task) error {
		runs.Add(1)
		return nil
	})
	ackWait := 300 * time.Millisecond
	b.start(t, Config{Queues: []Queue{{Name: wire.DefaultQueue, AckWait: ackWait}}}, map[string]Handler{"snap": h})
	b.publish(t, wire.TaskSubject("", "snap"), `{"id":"m1","resource":"cam"}`)
	leasetest.WaitLine(t, res, "cam", 1)
	joined := time.Now()
	rec := b.waitState(t, "m1", wire.TaskWaiting, 10*time.Second)
	// Another delivery of m1 ran it meanwhile.
	rec.State = wire.TaskSucceeded
	if _, err := b.tasks.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	check.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		if d := time.Since(joined); d < 2*ackWait {
			return fmt.Errorf("waited %v, want past the ack deadline", d)
		}
		return nil
	})
	if err := holder.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
	b.waitEmpty(t, 10*time.Second)
	if n := runs.Load(); n != 0 {
		t.Errorf("runs = %d, want 0 (the task had ended)", n)
	}
	if r := resourceState(t, res, "cam"); r.State != wire.ResourceAvailable || len(r.Waiters) != 0 {
		t.Errorf("resource = %s with %d waiting, want AVAILABLE, nobody waiting", r.State, len(r.Waiters))
	}
}

// TestResourceBusyLastError: a task waiting for a resource someone else
// holds says why, naming the resource once: "waiting for resource cam1:
// held by alice until …", not "resource cam1: resource cam1 is held …".
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
	defer func() { _ = h.Finish(ctx, lease.Outcome{}) }()
	b.start(t, Config{}, map[string]Handler{"snap": HandlerFunc(func(context.Context, *Task) error { return nil })})
	b.publish(t, wire.TaskSubject("", "snap"), `{"id":"busy1","resource":"cam1"}`)
	rec := b.waitState(t, "busy1", wire.TaskWaiting, 10*time.Second)
	if want := "waiting for resource cam1: held by alice until "; !strings.HasPrefix(rec.LastError, want) || strings.Count(rec.LastError, "cam1") != 1 {
		t.Errorf("last_error = %q, want it to start %q and name cam1 once", rec.LastError, want)
	}
}

// TestExecUnderLeaseGetsFencingToken: an exec task on a resource finds its
// lease's revision in GANTRY_LEASE_REVISION, and the next task on the same
// resource a higher one.
func TestExecUnderLeaseGetsFencingToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{}, nil)
	dir := t.TempDir()
	var tokens []uint64
	for i := range 2 {
		file := fmt.Sprintf("%s/token-%d", dir, i)
		id := fmt.Sprintf("fenced-%d", i)
		b.publish(t, wire.TaskSubject("", "exec"), map[string]any{"id": id, "resource": "cam1",
			"payload": map[string]any{"cmd": []string{"sh", "-c", `echo "$GANTRY_LEASE_REVISION" > "$0"`, file}}})
		b.waitState(t, id, wire.TaskSucceeded, 10*time.Second)
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil || n == 0 {
			t.Fatalf("GANTRY_LEASE_REVISION = %q, want a revision", data)
		}
		tokens = append(tokens, n)
	}
	if tokens[1] <= tokens[0] {
		t.Errorf("fencing tokens = %v, want the later task's higher", tokens)
	}
}
