package workers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
)

// recorder is a handler that records the order tasks start in; a task
// whose id is in block waits until release is closed.
type recorder struct {
	mu      sync.Mutex
	order   []string
	block   map[string]bool
	started chan string
	release chan struct{}
}

func newRecorder(block ...string) *recorder {
	r := &recorder{block: map[string]bool{}, started: make(chan string, 100), release: make(chan struct{})}
	for _, id := range block {
		r.block[id] = true
	}
	return r
}

func (r *recorder) Run(ctx context.Context, t *Task) error {
	r.mu.Lock()
	r.order = append(r.order, t.ID)
	r.mu.Unlock()
	r.started <- t.ID
	if r.block[t.ID] {
		select {
		case <-r.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (r *recorder) wait(t *testing.T, n int) []string {
	t.Helper()
	for range n {
		select {
		case <-r.started:
		case <-time.After(20 * time.Second):
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("started %v, want %d tasks", r.order, n)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

// waitHeld waits until the sorter of queue holds n tasks.
func (b *bundle) waitHeld(t *testing.T, queue string, n int) {
	t.Helper()
	ctx := context.Background()
	check.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		cons, err := b.env.JS.Consumer(ctx, wire.StreamTasks, sorterName(queue))
		if err != nil {
			return err
		}
		if info := cons.CachedInfo(); info.NumAckPending != n || info.NumPending != 0 {
			return fmt.Errorf("sorter of %s: %d held, %d not delivered; want %d held", queue, info.NumAckPending, info.NumPending, n)
		}
		return nil
	})
}

// busyUrgent starts workers on a prioritized queue "urgent" of
// concurrency 1 and keeps its one slot busy with task "first" until
// rec.release is closed. It returns the recorder of the tasks' starts and
// the subject to publish "job" tasks on.
func busyUrgent(t *testing.T, b *bundle) (*recorder, string) {
	t.Helper()
	rec := newRecorder("first")
	b.start(t, Config{Queues: []Queue{{Name: "urgent", Concurrency: 1, Prioritized: true}}, Policy: fastPolicy},
		map[string]Handler{"job": rec})
	subject := wire.TaskSubject("urgent", "job")
	b.publish(t, subject, `{"id":"first"}`)
	rec.wait(t, 1)
	return rec, subject
}

func TestPriorityOrdersWaitingTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec, subject := busyUrgent(t, b)
	// Published while the one worker slot is busy, lowest priority first;
	// two without an id of their own and one malformed, as `nats pub`
	// might send them.
	b.publish(t, subject, `{"id":"low-1"}`)
	// low-1 goes ahead to the ready subject at once (the lookahead of a
	// lane of concurrency 1); wait for that, or it might come in one batch
	// with the higher ones and be ordered after them.
	b.waitHeld(t, "urgent", 0)
	b.publish(t, subject, `{"id":"low-2","priority":-1}`)
	b.publish(t, subject, `{"id":"mid","priority":5}`)
	b.publish(t, subject, `{"priority":10}`, jetstream.MsgIDHeader, "high")
	b.publish(t, subject, `{"id":"low-3"}`)
	b.publish(t, subject, `{"id":"also-mid","priority":5}`)
	b.publish(t, subject, `{"id":`)
	b.waitHeld(t, "urgent", 6)
	close(rec.release)
	got := rec.wait(t, 6)
	want := []string{"first", "low-1", "high", "mid", "also-mid", "low-3", "low-2"}
	if !slices.Equal(got, want) {
		t.Fatalf("start order = %v, want %v", got, want)
	}
	for _, id := range want {
		r := b.waitState(t, id, wire.TaskSucceeded, 10*time.Second)
		if r.Queue != "urgent" || r.Type != "job" || r.Attempts != 1 {
			t.Errorf("task %s: queue %q type %q attempts %d, want urgent, job, 1", id, r.Queue, r.Type, r.Attempts)
		}
	}
	// The malformed task is rejected as on a FIFO queue, and kept as
	// published, so that a retry is sorted again.
	rejected := b.waitEventsAny(t, wire.EventTaskRejected, 1, 10*time.Second)
	r := b.waitState(t, rejected[0].TaskID, wire.TaskNeedsReview, 10*time.Second)
	kept := b.kept(t, r)
	if r.Queue != "urgent" || r.Type != "job" || kept.Data == nil || len(kept.Header[wire.HeaderTaskID]) != 0 {
		t.Errorf("rejected task kept as %s/%s %+v, want urgent/job without sorter headers", r.Queue, r.Type, kept)
	}
	b.waitEmpty(t, 10*time.Second)
}

func TestPriorityCancelWhileHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec, subject := busyUrgent(t, b)
	ctx := context.Background()
	seqs := map[string]uint64{}
	for _, id := range []string{"next", "doomed"} {
		ack, err := b.env.JS.Publish(ctx, subject, []byte(`{"id":"`+id+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		seqs[id] = ack.Sequence
		if id == "next" {
			b.waitHeld(t, "urgent", 0)
		}
	}
	// next went ahead to the ready subject; doomed waits in the sorter.
	// Cancel both as `gantry task cancel` does: record CANCELLED, then ask
	// who holds the task. The sorter answers for doomed; nobody holds
	// next, and its worker finds it cancelled when its turn comes.
	b.waitHeld(t, "urgent", 1)
	for _, id := range []string{"next", "doomed"} {
		if _, err := b.tasks.Put(ctx, wire.TaskRecord{TaskInfo: wire.TaskInfo{ID: id, Type: "job", Queue: "urgent",
			State: wire.TaskCancelled}, Seq: seqs[id]}); err != nil {
			t.Fatal(err)
		}
	}
	if reply, err := askCancel(b, "doomed", 5*time.Second); err != nil || reply.Action != wire.CancelDropped || reply.ID != "doomed" {
		t.Fatalf("cancel doomed = %+v, %v; want the sorter's answer", reply, err)
	}
	if _, err := askCancel(b, "next", 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancel next = %v, want no answer", err)
	}
	b.publish(t, subject, `{"id":"last"}`)
	close(rec.release)
	b.waitState(t, "last", wire.TaskSucceeded, 10*time.Second)
	b.waitEmpty(t, 10*time.Second)
	if got := rec.wait(t, 0); !slices.Equal(got, []string{"first", "last"}) {
		t.Fatalf("ran %v, want first and last: the cancelled tasks must not run", got)
	}
	for _, id := range []string{"next", "doomed"} {
		if r, _, err := b.tasks.Get(ctx, id); err != nil || r.State != wire.TaskCancelled {
			t.Errorf("%s: %v, %v; want CANCELLED", id, r.State, err)
		}
		b.waitEvents(t, id, wire.EventTaskFinished, 1, 5*time.Second)
		time.Sleep(100 * time.Millisecond) // a span for a second, wrong TASK_FINISHED to show, not a wait
		if evs := b.eventsOf(id, wire.EventTaskFinished); len(evs) != 1 || payload(t, evs[0])["state"] != string(wire.TaskCancelled) {
			t.Errorf("%s: TASK_FINISHED %+v, want one, CANCELLED", id, evs)
		}
	}
}

// A sorter's process stopping hands its held tasks back at once; a queue
// that stops being prioritized runs both the tasks held and those already
// sorted. Nothing accepted is lost either way.
func TestPriorityHandBackAndSwitchToFIFO(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	subject := wire.TaskSubject("urgent", "job")
	hold := newRecorder("first")
	nc, _ := brokertest.Connect(t, b.env.URL)
	w, err := New(Config{Queues: []Queue{{Name: "urgent", Concurrency: 1, Prioritized: true}}, Policy: fastPolicy,
		DrainTimeout: 100 * time.Millisecond, Logger: b.env.Log}, nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("job", hold); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-w.Ready()
	b.publish(t, subject, `{"id":"first"}`)
	hold.wait(t, 1)
	for i := range 5 {
		b.publish(t, subject, fmt.Sprintf(`{"id":"t%d","priority":%d}`, i, i))
	}
	b.waitHeld(t, "urgent", 4)
	w.Stop()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if _, err := b.env.JS.Consumer(ctx, wire.StreamTasks, sorterName("urgent")); err != nil {
		t.Fatal(err)
	}

	runs := newRecorder()
	b.start(t, Config{Queues: []Queue{{Name: "urgent", Concurrency: 4}}, Policy: fastPolicy}, map[string]Handler{"job": runs})
	got := runs.wait(t, 6)
	slices.Sort(got)
	if want := []string{"first", "t0", "t1", "t2", "t3", "t4"}; !slices.Equal(got, want) {
		t.Fatalf("ran %v after the switch, want %v", got, want)
	}
	if _, err := b.env.JS.Consumer(ctx, wire.StreamTasks, sorterName("urgent")); err == nil {
		t.Error("the sorter's consumer is still there on a FIFO queue")
	}
	b.waitEmpty(t, 10*time.Second)
}

// A prioritized queue with type limits sorts each type for its own
// consumer: a busy type does not hold up another.
func TestPrioritySplitByType(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := newRecorder("a-first")
	b.start(t, Config{Queues: []Queue{{Name: "split", Concurrency: 4, Prioritized: true,
		Types: map[string]Type{"a": {Concurrency: 1}, "b": {Concurrency: 1}}}}, Policy: fastPolicy},
		map[string]Handler{"a": rec, "b": rec})
	a, bb := wire.TaskSubject("split", "a"), wire.TaskSubject("split", "b")
	b.publish(t, a, `{"id":"a-first"}`)
	rec.wait(t, 1)
	b.publish(t, a, `{"id":"a-low-1"}`)
	b.waitHeld(t, "split", 0)
	b.publish(t, a, `{"id":"a-low-2"}`)
	b.publish(t, a, `{"id":"a-high","priority":3}`)
	// Type b runs while a's one slot is busy.
	b.publish(t, bb, `{"id":"b-1"}`)
	if got := rec.wait(t, 1); got[len(got)-1] != "b-1" {
		t.Fatalf("started %v, want b-1 while a-first runs", got)
	}
	b.waitHeld(t, "split", 2)
	close(rec.release)
	got := rec.wait(t, 3)
	if want := []string{"a-first", "b-1", "a-low-1", "a-high", "a-low-2"}; !slices.Equal(got, want) {
		t.Fatalf("start order = %v, want %v", got, want)
	}
	b.waitEmpty(t, 10*time.Second)
}

// A cancel request that no one recorded (the scheduler replacing a run
// publishes one) leaves a held task alone, as it would a waiting task of a
// FIFO queue.
func TestPriorityForeignCancelLeavesHeldTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec, subject := busyUrgent(t, b)
	b.publish(t, subject, `{"id":"ahead"}`)
	b.waitHeld(t, "urgent", 0)
	b.publish(t, subject, `{"id":"run-1"}`)
	b.waitHeld(t, "urgent", 1)
	if _, err := askCancel(b, "run-1", 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancel of an unrecorded task = %v, want no answer", err)
	}
	close(rec.release)
	b.waitState(t, "run-1", wire.TaskSucceeded, 10*time.Second)
}

// With two worker processes on a prioritized queue, the pinned sorter
// keeps its pin while it lives, even when nothing happens for longer than
// the pin's TTL: one heap keeps ordering the whole queue.
func TestPriorityKeepsPinWhileAlive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var unpinned []string
	sub, err := b.env.NC.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.UNPINNED.>", func(m *nats.Msg) {
		mu.Lock()
		unpinned = append(unpinned, string(m.Data))
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The sorters pull far more often than the broker's pinned TTL would
	// unpin a silent one: they renew their pin.
	timings := SorterTimings{PinnedTTL: 2 * time.Second, PullExpiry: time.Second}
	var pulls atomic.Int64
	pullSub, err := b.env.NC.Subscribe("$JS.API.CONSUMER.MSG.NEXT."+wire.StreamTasks+"."+sorterName("urgent"), func(*nats.Msg) { pulls.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pullSub.Unsubscribe() }()
	rec := newRecorder("first")
	cfg := Config{Queues: []Queue{{Name: "urgent", Concurrency: 1, Prioritized: true}}, Policy: fastPolicy, Sorter: timings}
	b.start(t, cfg, map[string]Handler{"job": rec})
	b.start(t, cfg, map[string]Handler{"job": rec})
	subject := wire.TaskSubject("urgent", "job")
	b.publish(t, subject, `{"id":"first"}`)
	rec.wait(t, 1)
	b.publish(t, subject, `{"id":"low-1"}`)
	b.waitHeld(t, "urgent", 0)
	b.publish(t, subject, `{"id":"high-1","priority":9}`)
	b.publish(t, subject, `{"id":"high-2","priority":9}`)
	b.waitHeld(t, "urgent", 2)
	// With no task coming, let the pins age past twice the pinned TTL: at
	// two sorters each pulling every PullExpiry, that many pulls take at
	// least that long.
	from := pulls.Load()
	enough := int64(2 * 2 * timings.PinnedTTL / timings.PullExpiry)
	check.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		if n := pulls.Load() - from; n < enough {
			return fmt.Errorf("%d pull requests since the tasks were held, want %d", n, enough)
		}
		return nil
	})
	b.publish(t, subject, `{"id":"low-late"}`)
	b.waitHeld(t, "urgent", 3)
	close(rec.release)
	got := rec.wait(t, 4)
	if want := []string{"first", "low-1", "high-1", "high-2", "low-late"}; !slices.Equal(got, want) {
		t.Errorf("start order = %v, want %v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(unpinned) > 0 {
		t.Errorf("the sorter was unpinned while alive: %v", unpinned)
	}
}

// A worker started with other settings for a queue while a prioritized
// worker runs it (a mistake the docs warn of) removes the sorter's
// consumer: that sorter stops, and every task still runs exactly once.
func TestPrioritySorterConsumerRemovedUnderIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec, subject := busyUrgent(t, b)
	b.publish(t, subject, `{"id":"t0"}`)
	b.waitHeld(t, "urgent", 0)
	for i := 1; i <= 4; i++ {
		b.publish(t, subject, fmt.Sprintf(`{"id":"t%d","priority":%d}`, i, i))
	}
	b.waitHeld(t, "urgent", 4)
	b.start(t, Config{Queues: []Queue{{Name: "urgent", Concurrency: 4}}, Policy: fastPolicy}, map[string]Handler{"job": rec})
	close(rec.release)
	rec.wait(t, 5)
	b.waitEmpty(t, 40*time.Second)
	// A task run twice would show in the order by now: a span to observe,
	// not a wait.
	time.Sleep(200 * time.Millisecond)
	got := rec.wait(t, 0)
	slices.Sort(got)
	if want := []string{"first", "t0", "t1", "t2", "t3", "t4"}; !slices.Equal(got, want) {
		t.Fatalf("ran %v, want each task once: %v", got, want)
	}
}
