package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/workers"
)

// flaky fails a task permanently on its first run and succeeds after.
type flaky struct {
	mu   sync.Mutex
	runs map[string]int
}

func (f *flaky) Run(_ context.Context, t *workers.Task) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs[t.ID]++
	if f.runs[t.ID] == 1 {
		return workers.Permanent(errors.New("first run fails"))
	}
	return nil
}

func TestSubmitWaitRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorkers(t, workers.Config{}, map[string]workers.Handler{"flaky": &flaky{runs: map[string]int{}}})
	c, ctx := b.c, ctx(t, 30*time.Second)

	sub, err := c.Submit(ctx, client.Task{Type: "noop", Payload: client.NoopPayload{Sleep: "10ms"}})
	if err != nil || sub.ID == "" || sub.Duplicate {
		t.Fatalf("Submit = %+v, %v; want a new id", sub, err)
	}
	rec, err := c.Wait(ctx, sub.ID)
	if err != nil || rec.State != client.TaskSucceeded || rec.Attempts != 1 || rec.Type != "noop" || rec.Queue != wire.DefaultQueue {
		t.Fatalf("Wait = %s after %d attempts (%s/%s), %v; want SUCCEEDED after 1, default/noop", rec.State, rec.Attempts, rec.Queue, rec.Type, err)
	}

	// A permanent failure ends NEEDS_REVIEW; a retry runs it again.
	if _, err := c.Submit(ctx, client.Task{Type: "flaky", ID: "f-1", Priority: 2, MaxAttempts: 3, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if rec, err = c.Wait(ctx, "f-1"); err != nil || rec.State != client.TaskNeedsReview || rec.LastError == "" {
		t.Fatalf("Wait(f-1) = %s (%s), %v; want NEEDS_REVIEW with the error", rec.State, rec.LastError, err)
	}
	if rec, err = c.Task(ctx, "f-1"); err != nil || rec.MaxAttempts != 3 || rec.Priority != 2 {
		t.Errorf("Task(f-1) = max attempts %d, priority %d, %v; want 3 and 2", rec.MaxAttempts, rec.Priority, err)
	}
	list, err := c.Tasks(ctx, client.TaskFilter{State: client.TaskNeedsReview})
	if err != nil || len(list) != 1 || list[0].ID != "f-1" {
		t.Errorf("Tasks(NEEDS_REVIEW) = %d tasks, %v; want f-1 only", len(list), err)
	}
	if list, err = c.Tasks(ctx, client.TaskFilter{Type: "noop", Queue: wire.DefaultQueue}); err != nil || len(list) != 1 || list[0].ID != sub.ID {
		t.Errorf("Tasks(noop) = %d tasks, %v; want the noop", len(list), err)
	}
	if list, err = c.Tasks(ctx, client.TaskFilter{Limit: 1}); err != nil || len(list) != 1 || list[0].ID != "f-1" {
		t.Errorf("Tasks(limit 1) = %v, %v; want the newest, f-1", list, err)
	}
	if _, err := c.Tasks(ctx, client.TaskFilter{State: "DONE"}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Tasks(DONE) = %v, want ErrInvalid", err)
	}
	retried, err := c.RetryTask(ctx, "f-1")
	if err != nil || retried.State != client.TaskWaiting || retried.Attempts != 0 {
		t.Fatalf("RetryTask = %s, %d attempts, %v; want WAITING with attempts reset", retried.State, retried.Attempts, err)
	}
	if rec, err = c.Wait(ctx, "f-1"); err != nil || rec.State != client.TaskSucceeded || rec.Run != 2 {
		t.Errorf("Wait after retry = %s, run %d, %v; want SUCCEEDED, run 2", rec.State, rec.Run, err)
	}
	// One TASK_FINISHED per run, numbered.
	var runs []any
	check.That(t, 20*time.Second, "a TASK_FINISHED for each run of f-1", func() bool {
		runs = finishedRuns(t, b, "f-1")
		return len(runs) >= 2
	})
	if fmt.Sprint(runs) != "[1 2]" {
		t.Errorf("TASK_FINISHED runs of f-1 = %v, want [1 2]", runs)
	}
	for _, id := range []string{"f-1", sub.ID} {
		if _, err := c.RetryTask(ctx, id); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("RetryTask(%s) of a SUCCEEDED task = %v, want ErrInvalid", id, err)
		}
	}
	if _, err := c.RetryTask(ctx, "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("RetryTask(nope) = %v, want ErrNotFound", err)
	}
	if _, err := c.Task(ctx, "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Task(nope) = %v, want ErrNotFound", err)
	}

	// Wait gives up when its context ends; the task goes on.
	if _, err := c.Submit(ctx, client.Task{Type: "noop", ID: "later", NotBefore: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := c.Wait(short, "later"); !errors.Is(err, client.ErrGaveUp) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait(later) = %v, want ErrGaveUp and the deadline", err)
	}
}

func TestSubmitDedupes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, ctx := b.c, ctx(t, 30*time.Second)

	first, err := c.Submit(ctx, client.Task{Type: "exec", Queue: "plant", Key: "report-2026-11-30",
		Payload: json.RawMessage(`{"cmd":["true"]}`)})
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.Submit(ctx, client.Task{Type: "exec", Queue: "plant", Key: "report-2026-11-30"})
	if err != nil || second.ID != first.ID || !second.Duplicate || first.Duplicate {
		t.Errorf("Submit with the same key = %+v, %v; want %s, a duplicate", second, err, first.ID)
	}
	if _, err := c.Submit(ctx, client.Task{Type: "noop", ID: first.ID}); !errors.Is(err, client.ErrExists) {
		t.Errorf("Submit with a taken id = %v, want ErrExists", err)
	}
	stream, err := b.env.JS.Stream(ctx, wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects["gantry.tasks.plant.exec"]; info.State.Msgs != 1 || n != 1 {
		t.Errorf("tasks stream = %d messages (%v), want one on gantry.tasks.plant.exec", info.State.Msgs, info.State.Subjects)
	}
	msg, err := stream.GetLastMsgForSubject(ctx, "gantry.tasks.plant.exec")
	if err != nil {
		t.Fatal(err)
	}
	if msg.Header.Get(jetstream.MsgIDHeader) != first.ID || msg.Header.Get(wire.HeaderCreated) == "" {
		t.Errorf("message headers = %v, want Nats-Msg-Id %s and Gantry-Created", msg.Header, first.ID)
	}
	rec, err := c.Task(ctx, first.ID)
	if err != nil || rec.State != client.TaskWaiting || rec.Seq != msg.Sequence || rec.Key != "report-2026-11-30" {
		t.Errorf("Task = %s, seq %d, key %q, %v; want WAITING at seq %d with the key", rec.State, rec.Seq, rec.Key, err, msg.Sequence)
	}

	for name, task := range map[string]client.Task{
		"type":     {Type: "no.op"},
		"queue":    {Type: "noop", Queue: "a b"},
		"id":       {Type: "noop", ID: "a/b"},
		"payload":  {Type: "noop", Payload: json.RawMessage(`{not json`)},
		"timeout":  {Type: "noop", Timeout: -time.Second},
		"attempts": {Type: "noop", MaxAttempts: -1},
		"resource": {Type: "noop", Resource: "cam.1"},
	} {
		if _, err := c.Submit(ctx, task); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("Submit with a bad %s = %v, want ErrInvalid", name, err)
		}
	}
	if info, err := stream.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Errorf("tasks stream after bad submits = %v messages, %v; want still 1", info.State.Msgs, err)
	}
}

// blocker runs until its task is cancelled, telling when it starts.
type blocker struct{ started chan string }

func (bl *blocker) Run(ctx context.Context, t *workers.Task) error {
	bl.started <- t.ID
	<-ctx.Done()
	return ctx.Err()
}

func TestCancelTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bl := &blocker{started: make(chan string, 4)}
	b.startWorkers(t, workers.Config{}, map[string]workers.Handler{"block": bl})
	c, ctx := b.c, ctx(t, 30*time.Second)

	// A waiting task is removed from the stream and ends at once.
	if _, err := c.Submit(ctx, client.Task{Type: "noop", ID: "later", NotBefore: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	check.That(t, 20*time.Second, "later WAITING with its message delivered", func() bool {
		rec, err := c.Task(ctx, "later")
		return err == nil && rec.State == client.TaskWaiting && rec.Delays > 0
	})
	got, err := c.CancelTask(ctx, "later")
	if err != nil || got.Was != client.TaskWaiting || got.Task.State != client.TaskCancelled {
		t.Fatalf("CancelTask(later) = %+v, %v; want CANCELLED, was WAITING", got, err)
	}
	if rec, err := c.Wait(ctx, "later"); err != nil || rec.State != client.TaskCancelled {
		t.Errorf("Wait(later) = %s, %v; want CANCELLED", rec.State, err)
	}

	// A running task is stopped by its worker, which records the end.
	if _, err := c.Submit(ctx, client.Task{Type: "block", ID: "long"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bl.started:
	case <-ctx.Done():
		t.Fatal("long = not started, want it running")
	}
	if got, err = c.CancelTask(ctx, "long"); err != nil || got.Task.State != client.TaskCancelled {
		t.Fatalf("CancelTask(long) = %+v, %v; want CANCELLED", got, err)
	}
	if rec, err := c.Wait(ctx, "long"); err != nil || rec.State != client.TaskCancelled {
		t.Errorf("Wait(long) = %s, %v; want CANCELLED", rec.State, err)
	}
	// The client marks the record CANCELLED at once; the worker that ran
	// the attempt then records its end, with the attempt counted.
	check.That(t, 20*time.Second, "long's end recorded by its worker, after 1 attempt", func() bool {
		rec, err := c.Task(ctx, "long")
		return err == nil && rec.State == client.TaskCancelled && rec.Attempts == 1
	})

	if _, err := c.CancelTask(ctx, "long"); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("CancelTask of an ended task = %v, want ErrInvalid", err)
	}
	if _, err := c.CancelTask(ctx, "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("CancelTask(nope) = %v, want ErrNotFound", err)
	}
}

// finishedRuns returns the run of every TASK_FINISHED event of task id so
// far, in order.
func finishedRuns(t *testing.T, b *bundle, id string) []any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := b.env.JS.OrderedConsumer(ctx, wire.StreamAudit, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.EventTaskFinished.Subject()}})
	if err != nil {
		t.Fatal(err)
	}
	var runs []any
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(200 * time.Millisecond))
		if err != nil {
			return runs
		}
		var ev wire.Event
		var p map[string]any
		if json.Unmarshal(msg.Data(), &ev) == nil && ev.TaskID == id && json.Unmarshal(ev.Payload, &p) == nil {
			runs = append(runs, p["run"])
		}
	}
}

// TestLargeTaskToReviewAndBack: a task message of nearly the broker's 1 MiB
// limit that ends in NEEDS_REVIEW, or is rejected, keeps its message until
// its record is stored: the record can be read, and the first can be
// retried and run with its payload whole.
func TestLargeTaskToReviewAndBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan int, 1)
	f := &flaky{runs: map[string]int{}}
	b.startWorkers(t, workers.Config{}, map[string]workers.Handler{"big": workers.HandlerFunc(func(ctx context.Context, t *workers.Task) error {
		if err := f.Run(ctx, t); err != nil {
			return err
		}
		got <- len(t.Payload)
		return nil
	})})
	c, ctx := b.c, ctx(t, 60*time.Second)
	blob := strings.Repeat("x", 1000*1024)
	for _, tc := range []struct {
		id, body string
		retry    bool
	}{
		{"big-1", `{"id":"big-1","payload":{"blob":"` + blob + `"}}`, true},
		{"big-bad", `{"id":"big-bad","payload":{"blob":"` + blob + `"},"max_attempts":"x"}`, false},
	} {
		if _, err := b.env.JS.Publish(ctx, wire.TaskSubject("", "big"), []byte(tc.body)); err != nil {
			t.Fatalf("publish %s (%d bytes): %v", tc.id, len(tc.body), err)
		}
		rec, err := c.Wait(ctx, tc.id)
		if err != nil || rec.State != client.TaskNeedsReview {
			t.Fatalf("Wait(%s) = %s, %v; want NEEDS_REVIEW", tc.id, rec.State, err)
		}
		if rec, err = c.Task(ctx, tc.id); err != nil || rec.Message != nil {
			t.Fatalf("Task(%s) = message %v, %v; want the record, the message kept out of it", tc.id, rec.Message != nil, err)
		}
		if !tc.retry {
			continue
		}
		if _, err := c.RetryTask(ctx, tc.id); err != nil {
			t.Fatalf("RetryTask(%s) = %v", tc.id, err)
		}
		if rec, err = c.Wait(ctx, tc.id); err != nil || rec.State != client.TaskSucceeded {
			t.Fatalf("Wait(%s) after retry = %s, %v; want SUCCEEDED", tc.id, rec.State, err)
		}
		if n := <-got; n < len(blob) {
			t.Errorf("payload on retry = %d bytes, want the %d-byte blob whole", n, len(blob))
		}
	}
	// Nothing left in the stream but the message of the task still under
	// review.
	stream, err := b.env.JS.Stream(ctx, wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{wire.ReviewSubject("big-bad"): 1}
	check.That(t, 20*time.Second, "the stream holding only the kept message", func() bool {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		return maps.Equal(info.State.Subjects, want)
	})
}

// TestSubmitSaysTheStorageIsFull: with the broker's disk full, Submit does
// not just time out: it says the broker's storage is full, as
// ErrUnavailable, and submits again once space is freed.
func TestSubmitSaysTheStorageIsFull(t *testing.T) {
	t.Parallel()
	small := brokertest.SmallDisk(t, "24m")
	env := brokertest.Start(t, brokertest.WithDataDir(small+"/data"), func(c *broker.Config) {
		c.MinFreeSpace, c.StorageCheck = 1<<20, 100*time.Millisecond
	})
	c, err := client.Connect(context.Background(), client.Options{Servers: env.URL, Name: t.Name()},
		client.WithLogger(env.Log.With("component", "client")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	submit := func(payload string) error {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err := c.Submit(ctx, client.Task{Type: "noop", Payload: payload})
		return err
	}
	free := brokertest.FillDisk(t, small)
	var sub error
	check.That(t, 20*time.Second, "a submit refused", func() bool {
		sub = submit(strings.Repeat("x", 4000))
		return sub != nil
	})
	if !errors.Is(sub, client.ErrUnavailable) || !strings.Contains(sub.Error(), "storage is full") {
		t.Errorf("Submit on a full disk = %v, want ErrUnavailable saying the broker's storage is full", sub)
	}
	free()
	check.That(t, 20*time.Second, "a submit taken again", func() bool { return submit("") == nil })
}

// TestStatsCountsTasksInReview: the NEEDS_REVIEW counts of Stats come from
// the tasks in review — those with a kept message, and a rejected one too
// large to keep (its marker) — not from reading every task record; a
// purge takes a task out of the count and its message or marker out of
// the stream.
func TestStatsCountsTasksInReview(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fail := workers.HandlerFunc(func(context.Context, *workers.Task) error { return workers.Permanent(errors.New("no")) })
	b.startWorkers(t, workers.Config{MaxPayload: 256}, map[string]workers.Handler{"fail": fail})
	c, ctx := b.c, ctx(t, 30*time.Second)
	for i := range 3 {
		if _, err := c.Submit(ctx, client.Task{Type: "fail", ID: fmt.Sprintf("fail-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		if _, err := c.Submit(ctx, client.Task{Type: "noop"}); err != nil {
			t.Fatal(err)
		}
	}
	// Too large to keep: rejected, its message not kept.
	big := nats.NewMsg(wire.TaskSubject("", "junk"))
	big.Header.Set(jetstream.MsgIDHeader, "big-1")
	big.Data = []byte(`{"payload":"` + strings.Repeat("x", 1000) + `"}`)
	if _, err := b.env.JS.PublishMsg(ctx, big); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"fail-0", "fail-1", "fail-2", "big-1"} {
		if rec, err := c.Wait(ctx, id); err != nil || rec.State != client.TaskNeedsReview {
			t.Fatalf("Wait(%s) = %s, %v; want NEEDS_REVIEW", id, rec.State, err)
		}
	}
	reviews := func(want int, byType map[string]int) {
		t.Helper()
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range st.Queues {
			if q.Queue == wire.DefaultQueue {
				if q.NeedsReview != want || !maps.Equal(q.NeedsReviewByType, byType) {
					t.Errorf("queue default: needs review %d %v, want %d %v", q.NeedsReview, q.NeedsReviewByType, want, byType)
				}
				return
			}
		}
		t.Errorf("Stats has no queue default: %+v", st.Queues)
	}
	reviews(4, map[string]int{"fail": 3, "junk": 1})
	for _, id := range []string{"fail-0", "big-1"} {
		if err := c.PurgeTask(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	reviews(2, map[string]int{"fail": 2})
	// A retried task that fails again at once keeps its new copy: the
	// retry removes only the copy it republished.
	if _, err := c.RetryTask(ctx, "fail-1"); err != nil {
		t.Fatal(err)
	}
	check.That(t, 20*time.Second, "fail-1's second run in review", func() bool {
		rec, err := c.Task(ctx, "fail-1")
		return err == nil && rec.Run == 2 && rec.State == client.TaskNeedsReview
	})
	reviews(2, map[string]int{"fail": 2})
	if _, err := c.RetryTask(ctx, "fail-1"); err != nil {
		t.Errorf("RetryTask(fail-1) again = %v, want its kept copy found", err)
	}
	check.That(t, 20*time.Second, "fail-1's third run in review", func() bool {
		rec, err := c.Task(ctx, "fail-1")
		return err == nil && rec.Run == 3 && rec.State == client.TaskNeedsReview
	})
	stream, err := b.env.JS.Stream(ctx, wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(wire.SubjectReviewAll))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != 2 {
		t.Errorf("review subjects after the purges = %v, want fail-1 and fail-2 only", info.State.Subjects)
	}
}
