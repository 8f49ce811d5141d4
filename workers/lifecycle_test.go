package workers

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/lifecycle/lifecycletest"
)

func TestLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lifecycletest.Misuse(t, func(t testing.TB) lifecycletest.Actor {
		// A prioritized queue too, so that its sorter starts and stops.
		w, err := New(Config{Logger: b.env.Log, Queues: []Queue{{Name: "default"}, {Name: "urgent", Prioritized: true}}}, b.env.NC)
		if err != nil {
			t.Fatal(err)
		}
		return w
	})
}

// TestFailedStartStopsWhatStarted: queue a consumes and delivers a task,
// then the start fails on queue b, whose durable consumer exists as a push
// consumer, which cannot become a pull one. Run returns its error only once the task
// is interrupted and has ended: no task runs after it, and goleak finds no
// goroutine left.
func TestFailedStartStopsWhatStarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.env.JS.CreateConsumer(context.Background(), wire.StreamTasks, jetstream.ConsumerConfig{
		Durable: "gantry-workers-b", FilterSubject: wire.SubjectTasksPrefix + ".b.>", AckPolicy: jetstream.AckExplicitPolicy,
		DeliverSubject: "lifecycle-test.push",
	}); err != nil {
		t.Fatal(err)
	}
	var running atomic.Int32
	started := make(chan string, 1)
	block := HandlerFunc(func(ctx context.Context, task *Task) error {
		running.Add(1)
		defer running.Add(-1)
		select {
		case started <- task.ID:
		default:
		}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	// Whether the task reaches its handler before the start fails is a
	// race: try until it does.
	const attempts = 50
	for attempt := 1; attempt <= attempts; attempt++ {
		b.publish(t, wire.TaskSubject("a", "job"), fmt.Sprintf(`{"id":"task-%d"}`, attempt))
		w, err := New(Config{Logger: b.env.Log, Queues: []Queue{{Name: "a"}, {Name: "b"}}}, b.env.NC)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Handle("job", block); err != nil {
			t.Fatal(err)
		}
		err = lifecycletest.FailedStart(t, w)
		if !strings.Contains(err.Error(), "gantry-workers-b") {
			t.Errorf("Run = %v, want the error of consumer gantry-workers-b", err)
		}
		if n := running.Load(); n != 0 {
			t.Fatalf("tasks running after Run returned = %d, want 0", n)
		}
		select {
		case id := <-started:
			t.Logf("attempt %d: task %s started before the start failed", attempt, id)
			rec := b.waitState(t, id, wire.TaskWaiting, 5*time.Second)
			if !strings.Contains(rec.LastError, "worker stopping") {
				t.Errorf("task %s last error = %q, want worker stopping: interrupted and handed back", id, rec.LastError)
			}
			return
		default:
		}
	}
	t.Fatalf("no task reached its handler before the start failed in %d attempts", attempts)
}

// TestConsumerAndStreamDeletedAreRecreated: the queue's consumer, then the
// tasks stream, deleted behind the workers' back, are recreated as
// provisioned, and tasks run again; Healthy says so meanwhile.
func TestConsumerAndStreamDeletedAreRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.start(t, Config{ConsumerCheck: 100 * time.Millisecond}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Healthy(); err != nil {
		t.Fatalf("Healthy once ready = %v, want nil", err)
	}
	for i, remove := range []func() error{
		func() error { return b.env.JS.DeleteConsumer(ctx, wire.StreamTasks, "gantry-workers-default") },
		func() error { return b.env.JS.DeleteStream(ctx, wire.StreamTasks) },
	} {
		if err := remove(); err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("after-%d", i)
		check.For(t, 10*time.Second, 50*time.Millisecond, func() error {
			if err := w.Healthy(); err != nil {
				return err
			}
			_, err := b.env.JS.Publish(ctx, wire.TaskSubject("", "noop"), []byte(`{"id":"`+id+`"}`), jetstream.WithMsgID(id))
			return err
		})
		b.waitState(t, id, wire.TaskSucceeded, 10*time.Second)
	}
}
