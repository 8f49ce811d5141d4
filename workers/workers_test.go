package workers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/tasks"
)

func TestPlainPublishRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{}, nil)
	// A core NATS publish, as `nats pub` does, with no id: the worker names
	// the task.
	if err := b.env.NC.Publish(wire.TaskSubject("", "noop"), []byte(`{"payload":{"sleep":"10ms"}}`)); err != nil {
		t.Fatal(err)
	}
	evs := b.waitEventsAny(t, wire.EventTaskFinished, 1, 10*time.Second)
	id := evs[0].TaskID
	rec := b.waitState(t, id, wire.TaskSucceeded, 5*time.Second)
	if rec.Attempts != 1 || rec.Type != "noop" || rec.Queue != "default" {
		t.Errorf("record = %+v, want attempts 1, type noop, queue default", rec.TaskInfo)
	}
	p := payload(t, evs[0])
	if p["state"] != "SUCCEEDED" || p["attempts"] != float64(1) {
		t.Errorf("TASK_FINISHED payload = %v, want state SUCCEEDED, attempts 1", p)
	}
	for _, typ := range []wire.EventType{wire.EventTaskCreated, wire.EventTaskStarted} {
		b.waitEvents(t, id, typ, 1, 5*time.Second)
	}
	b.waitEmpty(t, 5*time.Second)
}

// waitEventsAny waits for n events of type typ of any task.
func (b *bundle) waitEventsAny(t *testing.T, typ wire.EventType, n int, within time.Duration) []wire.Event {
	t.Helper()
	var out []wire.Event
	check.For(t, within, 20*time.Millisecond, func() error {
		b.mu.Lock()
		defer b.mu.Unlock()
		out = out[:0]
		for _, ev := range b.events {
			if ev.Type == typ {
				out = append(out, ev)
			}
		}
		if len(out) < n {
			return fmt.Errorf("%d %s events, want %d", len(out), typ, n)
		}
		return nil
	})
	return out
}

// counter is a handler that counts its runs and fails the first fails.
func counter(runs *atomic.Int32, fails int32, err error) Handler {
	return HandlerFunc(func(ctx context.Context, t *Task) error {
		if n := runs.Add(1); n <= fails {
			return err
		}
		return nil
	})
}

func TestDedupe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	b.start(t, Config{}, map[string]Handler{"count": counter(&runs, 0, nil)})
	subj := wire.TaskSubject("", "count")

	// Nats-Msg-Id: the broker drops the second publish.
	b.publish(t, subj, `{}`, jetstream.MsgIDHeader, "once-1")
	b.publish(t, subj, `{}`, jetstream.MsgIDHeader, "once-1")
	b.waitState(t, "once-1", wire.TaskSucceeded, 10*time.Second)

	// key: two tasks with the same key run once; the second is rejected as
	// a duplicate.
	b.publish(t, subj, `{"id":"key-a","key":"report-2026-11-30"}`)
	b.waitState(t, "key-a", wire.TaskSucceeded, 10*time.Second)
	b.publish(t, subj, `{"id":"key-b","key":"report-2026-11-30"}`)
	evs := b.waitEvents(t, "key-b", wire.EventTaskRejected, 1, 10*time.Second)
	if !strings.Contains(evs[0].Message, "key-a") {
		t.Errorf("TASK_REJECTED message = %q, want it to name key-a", evs[0].Message)
	}
	b.waitEmpty(t, 5*time.Second)
	if got := runs.Load(); got != 2 {
		t.Errorf("runs = %d, want 2 (once-1 and key-a)", got)
	}
}

func TestRetryThenSucceed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	b.start(t, Config{Policy: fastPolicy}, map[string]Handler{"flaky": counter(&runs, 2, errFlaky)})
	b.publish(t, wire.TaskSubject("", "flaky"), `{"id":"f1"}`)
	rec := b.waitState(t, "f1", wire.TaskSucceeded, 15*time.Second)
	if rec.Attempts != 3 {
		t.Errorf("attempts = %d, want 3", rec.Attempts)
	}
	retries := b.waitEvents(t, "f1", wire.EventRetryScheduled, 2, 5*time.Second)
	d1, _ := time.ParseDuration(payload(t, retries[0])["delay"].(string))
	d2, _ := time.ParseDuration(payload(t, retries[1])["delay"].(string))
	if !(d1 > 0 && d2 > d1) {
		t.Errorf("retry delays = %v, %v, want growing", d1, d2)
	}
	fin := b.waitEvents(t, "f1", wire.EventTaskFinished, 1, 5*time.Second)
	if p := payload(t, fin[0]); p["attempts"] != float64(3) || p["state"] != "SUCCEEDED" {
		t.Errorf("TASK_FINISHED payload = %v, want SUCCEEDED on attempt 3", p)
	}
	if n := len(b.eventsOf("f1", wire.EventTaskFinished)); n != 1 {
		t.Errorf("TASK_FINISHED events = %d, want 1", n)
	}
}

func TestPermanentAndExhausted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var perm, flaky atomic.Int32
	b.start(t, Config{Policy: fastPolicy}, map[string]Handler{
		"perm":  counter(&perm, 100, Permanent(fmt.Errorf("bad row"))),
		"flaky": counter(&flaky, 100, errFlaky),
	})
	b.publish(t, wire.TaskSubject("", "perm"), `{"id":"p1"}`)
	rec := b.waitState(t, "p1", wire.TaskNeedsReview, 10*time.Second)
	if rec.Attempts != 1 || !strings.Contains(rec.LastError, "bad row") || rec.Kept != wire.ReviewSubject("p1") {
		t.Errorf("record = %+v, want attempts 1, last error bad row, message kept", rec)
	}
	b.publish(t, wire.TaskSubject("", "flaky"), `{"id":"x1","max_attempts":2}`)
	rec = b.waitState(t, "x1", wire.TaskNeedsReview, 10*time.Second)
	if rec.Attempts != 2 || !strings.Contains(rec.LastError, "attempts exhausted") {
		t.Errorf("record = attempts %d, last error %q, want 2 and attempts exhausted", rec.Attempts, rec.LastError)
	}
	b.waitEvents(t, "x1", wire.EventNeedsReview, 1, 5*time.Second)
	b.waitEmpty(t, 5*time.Second)
	if got := perm.Load(); got != 1 {
		t.Errorf("permanent task runs = %d, want 1", got)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{MaxPayload: 1024, MaxDelays: 2, Policy: Policy{NoHandlerDelay: 50 * time.Millisecond}}, nil)
	subj := wire.TaskSubject("", "noop")
	for name, body := range map[string]string{
		"bad-json":   `{"payload":`,
		"bad-type":   `{"max_attempts":"three"}`,
		"not-object": `[1,2]`,
		"bad-id":     `{"id":"a.b"}`,
		"too-big":    `{"payload":"` + strings.Repeat("x", 2000) + `"}`,
	} {
		b.publish(t, subj, body, jetstream.MsgIDHeader, name)
		rec := b.waitState(t, name, wire.TaskNeedsReview, 10*time.Second)
		if !strings.HasPrefix(rec.LastError, "rejected: bad task") {
			t.Errorf("%s: last error = %q, want rejected: bad task…", name, rec.LastError)
		}
		b.waitEvents(t, name, wire.EventTaskRejected, 1, 5*time.Second)
	}
	// A type nobody serves waits for a handler, without using up attempts,
	// until its delays run out.
	b.publish(t, wire.TaskSubject("", "nobody-handles-this"), `{"id":"unknown-1"}`)
	rec := b.waitState(t, "unknown-1", wire.TaskNeedsReview, 10*time.Second)
	if !strings.Contains(rec.LastError, "no handler answered") || rec.Attempts != 0 || rec.Delays != 2 {
		t.Errorf("unknown type: record = attempts %d, delays %d, %q, want 0, 2 and no handler answered", rec.Attempts, rec.Delays, rec.LastError)
	}
	// The worker carries on.
	b.publish(t, subj, `{"id":"after"}`)
	b.waitState(t, "after", wire.TaskSucceeded, 10*time.Second)
	b.waitEmpty(t, 5*time.Second)
}

func TestRemoteHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	sub, err := b.env.NC.Subscribe(wire.HandlerSubject("resize"), func(m *nats.Msg) {
		n := calls.Add(1)
		reply := nats.NewMsg(m.Reply)
		switch {
		case strings.Contains(string(m.Data), `"perm-1"`):
			reply.Header.Set(wire.HeaderError, "no such image")
			reply.Header.Set(wire.HeaderErrorClass, wire.ErrorClassPermanent)
		case n == 1:
			reply.Header.Set(wire.HeaderError, "busy")
			reply.Header.Set(wire.HeaderErrorClass, wire.ErrorClassDelay)
			reply.Header.Set(wire.HeaderRetryAfter, "100ms")
		default:
			reply.Data = []byte("resized")
		}
		_ = m.RespondMsg(reply)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	b.start(t, Config{Policy: fastPolicy}, nil)
	b.publish(t, wire.TaskSubject("", "resize"), `{"id":"ok-1","payload":{"w":10}}`)
	rec := b.waitState(t, "ok-1", wire.TaskSucceeded, 10*time.Second)
	if rec.Attempts != 1 || rec.Delays != 1 || rec.Output != "resized" {
		t.Errorf("record = attempts %d, delays %d, output %q, want 1, 1, resized", rec.Attempts, rec.Delays, rec.Output)
	}
	b.publish(t, wire.TaskSubject("", "resize"), `{"id":"perm-1"}`)
	rec = b.waitState(t, "perm-1", wire.TaskNeedsReview, 10*time.Second)
	if !strings.Contains(rec.LastError, "no such image") {
		t.Errorf("last error = %q, want no such image", rec.LastError)
	}
}

func TestHeartbeatKeepsLongTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{Queues: []Queue{{Name: "default", AckWait: time.Second}}}, nil)
	b.publish(t, wire.TaskSubject("", "noop"), `{"id":"long","payload":{"sleep":"5s"}}`)
	rec := b.waitState(t, "long", wire.TaskSucceeded, 20*time.Second)
	if rec.Deliveries != 1 || rec.Attempts != 1 {
		t.Errorf("deliveries = %d, attempts = %d, want 1 and 1 (no redelivery while heartbeating)", rec.Deliveries, rec.Attempts)
	}
	if n := len(b.eventsOf("long", wire.EventTaskStarted)); n != 1 {
		t.Errorf("TASK_STARTED events = %d, want 1", n)
	}
}

func TestStoppedWorkerTaskRedelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := Config{Queues: []Queue{{Name: "default", AckWait: time.Second}}, Policy: fastPolicy}
	started := make(chan struct{}, 1)
	hang := HandlerFunc(func(ctx context.Context, t *Task) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	})
	_, nc1 := b.start(t, cfg, map[string]Handler{"job": hang})
	b.publish(t, wire.TaskSubject("", "job"), `{"id":"j1"}`)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("task not started")
	}
	// The first worker dies: its connection goes, with its heartbeats.
	nc1.Close()
	var runs atomic.Int32
	b.start(t, cfg, map[string]Handler{"job": counter(&runs, 0, nil)})
	rec := b.waitState(t, "j1", wire.TaskSucceeded, 20*time.Second)
	if rec.Deliveries != 2 || runs.Load() != 1 {
		t.Errorf("deliveries = %d, second worker runs = %d, want 2 and 1", rec.Deliveries, runs.Load())
	}
}

func TestMaxDeliveriesAdvisory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Delayed retries do not use up attempts but do count as deliveries:
	// the consumer's MaxDeliver stops them, and the advisory parks the task.
	always := HandlerFunc(func(context.Context, *Task) error { return RetryAfter(errFlaky, 20*time.Millisecond) })
	b.start(t, Config{MaxDeliver: 3, Policy: fastPolicy}, map[string]Handler{"busy": always})
	b.publish(t, wire.TaskSubject("", "busy"), `{"id":"md1"}`)
	rec := b.waitState(t, "md1", wire.TaskNeedsReview, 15*time.Second)
	if !strings.Contains(rec.LastError, "max deliveries (3)") || rec.Kept != wire.ReviewSubject("md1") {
		t.Errorf("record = last error %q, kept %q, want max deliveries (3) and the message kept", rec.LastError, rec.Kept)
	}
	b.waitEmpty(t, 5*time.Second)
	b.waitEvents(t, "md1", wire.EventTaskFinished, 1, 5*time.Second)
}

func TestNotBefore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	b.start(t, Config{}, map[string]Handler{"later": counter(&runs, 0, nil)})
	nb := time.Now().Add(1500 * time.Millisecond)
	b.publish(t, wire.TaskSubject("", "later"), fmt.Sprintf(`{"id":"nb1","not_before":%q}`, nb.Format(time.RFC3339Nano)))
	b.waitState(t, "nb1", wire.TaskWaiting, 5*time.Second)
	rec := b.waitState(t, "nb1", wire.TaskSucceeded, 10*time.Second)
	if rec.UpdatedAt.Before(nb) {
		t.Errorf("finished at %v, want after not_before %v", rec.UpdatedAt, nb)
	}
	if rec.Attempts != 1 || rec.Delays != 1 {
		t.Errorf("attempts = %d, delays = %d, want 1 and 1", rec.Attempts, rec.Delays)
	}
}

func TestCancelRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{}, nil)
	b.publish(t, wire.TaskSubject("", "noop"), `{"id":"c1","payload":{"sleep":"1m"}}`)
	b.waitEvents(t, "c1", wire.EventTaskStarted, 1, 10*time.Second)
	// The cancel is published again until the task finishes.
	check.For(t, 10*time.Second, 100*time.Millisecond, func() error {
		if err := b.env.NC.Publish(wire.SubjectTaskCancel, cancelRequest(t, "c1")); err != nil {
			t.Fatal(err)
		}
		if len(b.eventsOf("c1", wire.EventTaskFinished)) == 0 {
			return errors.New("c1 not finished after its cancel")
		}
		return nil
	})
	rec := b.waitState(t, "c1", wire.TaskCancelled, 5*time.Second)
	if rec.Attempts != 1 {
		t.Errorf("attempts = %d, want 1", rec.Attempts)
	}
	b.waitEmpty(t, 5*time.Second)
}

func TestOnceAndCheckpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var sideEffects, runs atomic.Int32
	var resumed atomic.Value
	h := HandlerFunc(func(ctx context.Context, t *Task) error {
		runs.Add(1)
		if cp, err := t.Checkpoint(ctx); err != nil {
			return err
		} else if cp != nil {
			resumed.Store(cp.Stage + "/" + cp.LastItem)
		}
		if err := t.Once(ctx, "send-invoice", func(context.Context) error {
			sideEffects.Add(1)
			return nil
		}); err != nil {
			return err
		}
		if t.Attempt == 1 {
			if err := t.SaveCheckpoint(ctx, wire.Checkpoint{Stage: "upload", LastItem: "file-7"}); err != nil {
				return err
			}
			return errFlaky
		}
		return nil
	})
	b.start(t, Config{Policy: fastPolicy}, map[string]Handler{"invoice": h})
	b.publish(t, wire.TaskSubject("", "invoice"), `{"id":"inv1"}`)
	b.waitState(t, "inv1", wire.TaskSucceeded, 10*time.Second)
	if runs.Load() != 2 || sideEffects.Load() != 1 {
		t.Errorf("runs = %d, side effects = %d, want 2 and 1", runs.Load(), sideEffects.Load())
	}
	if got, _ := resumed.Load().(string); got != "upload/file-7" {
		t.Errorf("resumed from %q, want upload/file-7", got)
	}
}

func TestTypeConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var running, most, runs atomic.Int32
	slow := HandlerFunc(func(ctx context.Context, t *Task) error {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		runs.Add(1)
		time.Sleep(50 * time.Millisecond) // a slow handler: its runs must overlap if the limit fails
		return nil
	})
	cfg := Config{Queues: []Queue{{Name: "lim", Concurrency: 8, Types: map[string]Type{"slow": {Concurrency: 1}}}}}
	// Two workers share the consumer: the broker's MaxAckPending, not a
	// worker, holds the type to one task at a time.
	b.start(t, cfg, map[string]Handler{"slow": slow})
	b.start(t, cfg, map[string]Handler{"slow": slow})
	for i := range 4 {
		b.publish(t, wire.TaskSubject("lim", "slow"), fmt.Sprintf(`{"id":"slow-%d"}`, i))
	}
	for i := range 4 {
		b.waitState(t, fmt.Sprintf("slow-%d", i), wire.TaskSucceeded, 15*time.Second)
	}
	if got := most.Load(); got != 1 {
		t.Errorf("slow tasks at once = %d, want 1", got)
	}
	info, err := b.env.JS.Consumer(context.Background(), wire.StreamTasks, "gantry-workers-lim-slow")
	if err != nil {
		t.Fatalf("per-type consumer: %v", err)
	}
	if got := info.CachedInfo().Config.MaxAckPending; got != 1 {
		t.Errorf("MaxAckPending = %d, want 1", got)
	}
}

// TestTaskRetention ends tasks every way a worker ends them under a 1 s
// retention: the SUCCEEDED and CANCELLED records disappear, the NEEDS_REVIEW
// ones (a permanent failure, max deliveries) stay.
func TestTaskRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	busy := HandlerFunc(func(context.Context, *Task) error { return RetryAfter(errFlaky, 20*time.Millisecond) })
	b.start(t, Config{TaskRetention: time.Second, MaxDeliver: 3, Policy: fastPolicy}, map[string]Handler{
		"perm": HandlerFunc(func(context.Context, *Task) error { return Permanent(fmt.Errorf("bad row")) }),
		"busy": busy,
	})
	b.publish(t, wire.TaskSubject("", "noop"), `{"id":"ok"}`)
	b.publish(t, wire.TaskSubject("", "noop"), `{"id":"cancelled","payload":{"sleep":"1m"}}`)
	b.publish(t, wire.TaskSubject("", "perm"), `{"id":"failed"}`)
	b.publish(t, wire.TaskSubject("", "busy"), `{"id":"stuck"}`)
	b.waitEvents(t, "cancelled", wire.EventTaskStarted, 1, 10*time.Second)
	if err := b.env.NC.Publish(wire.SubjectTaskCancel, cancelRequest(t, "cancelled")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"ok", "cancelled", "failed", "stuck"} {
		b.waitEvents(t, id, wire.EventTaskFinished, 1, 15*time.Second)
	}
	b.waitState(t, "failed", wire.TaskNeedsReview, 5*time.Second)
	b.waitState(t, "stuck", wire.TaskNeedsReview, 5*time.Second)
	b.publish(t, wire.TaskSubject("", "noop"), `{"id":"last"}`)
	b.waitEvents(t, "last", wire.EventTaskFinished, 1, 10*time.Second)

	// The ended records go; once the last one, written after the review
	// queue, is gone, the review queue is past the retention too and must
	// still be there.
	check.For(t, 15*time.Second, 50*time.Millisecond, func() error {
		for _, id := range []string{"ok", "cancelled", "last"} {
			if _, _, err := b.tasks.Get(context.Background(), id); !errors.Is(err, tasks.ErrNotFound) {
				return fmt.Errorf("record of %s: Get = %v after it ended, want ErrTaskNotFound", id, err)
			}
		}
		return nil
	})
	for _, id := range []string{"failed", "stuck"} {
		if rec, _, err := b.tasks.Get(context.Background(), id); err != nil || rec.State != wire.TaskNeedsReview {
			t.Errorf("record of %s = %s, %v; want NEEDS_REVIEW kept", id, rec.State, err)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]Config{
		"bad queue":            {Queues: []Queue{{Name: "a.b"}}},
		"twice":                {Queues: []Queue{{Name: "a"}, {Name: "a"}}},
		"short ack":            {Queues: []Queue{{Name: "a", AckWait: time.Millisecond}}},
		"bad type":             {Queues: []Queue{{Name: "a", Types: map[string]Type{"x y": {}}}}},
		"neg type conc":        {Queues: []Queue{{Name: "a", Types: map[string]Type{"x": {Concurrency: -1}}}}},
		"short lease":          {LeaseTTL: time.Millisecond},
		"sub-second retention": {TaskRetention: 1500 * time.Millisecond},
		"negative retention":   {TaskRetention: -time.Hour},
	} {
		if _, err := cfg.withDefaults(); err == nil {
			t.Errorf("%s: withDefaults = nil, want an error", name)
		}
	}
	c, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Queues) != 1 || c.Queues[0].Name != "default" || c.Queues[0].Concurrency != 64 || c.Queues[0].AckWait != 30*time.Second ||
		c.Policy != defaultPolicy || c.MaxPayload != 1<<20 || c.KillGrace != 2*time.Second || c.TaskRetention != 7*24*time.Hour {
		t.Errorf("defaults = %+v, want the documented ones", c)
	}
	if _, err := New(Config{}, nil); err == nil {
		t.Error("New without a connection = nil error, want one")
	}
}

func TestStopHandsRunningTaskBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	block := HandlerFunc(func(ctx context.Context, t *Task) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	nc, _ := brokertest.Connect(t, b.env.URL)
	w, err := New(Config{DrainTimeout: 200 * time.Millisecond, Logger: b.env.Log}, nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("job", block); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	<-w.Ready()
	b.publish(t, wire.TaskSubject("", "job"), `{"id":"handed-back"}`)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("task not started")
	}
	w.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of Stop")
	}
	rec := b.waitState(t, "handed-back", wire.TaskWaiting, 5*time.Second)
	if rec.Delays != 1 || !strings.Contains(rec.LastError, "worker stopping") {
		t.Errorf("record = delays %d, last error %q; want 1, worker stopping", rec.Delays, rec.LastError)
	}
	var runs atomic.Int32
	b.start(t, Config{}, map[string]Handler{"job": counter(&runs, 0, nil)})
	rec = b.waitState(t, "handed-back", wire.TaskSucceeded, 15*time.Second)
	if rec.Attempts != 1 || runs.Load() != 1 {
		t.Errorf("attempts = %d, runs = %d, want 1 and 1", rec.Attempts, runs.Load())
	}
}
