package workers

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

// A broker that dies forgets the deliveries it made just before, and makes
// them again as first deliveries, to a worker that may be new too: a task
// whose end is recorded must not start again.
func TestFinishedTaskDeliveredAsFirstDoesNotRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pub := func(id string) uint64 {
		t.Helper()
		ack, err := b.env.JS.Publish(ctx, wire.TaskSubject("", "count"), []byte(`{"id":"`+id+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	record := func(id string, seq uint64, state wire.TaskState) {
		t.Helper()
		now := time.Now().UTC()
		rec := wire.TaskRecord{TaskInfo: wire.TaskInfo{ID: id, Type: "count", Queue: "default", State: state,
			Attempts: 1, CreatedAt: now, UpdatedAt: now}, Deliveries: 1, Seq: seq}
		if _, err := b.tasks.Put(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	// What the worker that died left: one task done, one running.
	record("done-1", pub("done-1"), wire.TaskSucceeded)
	record("running-1", pub("running-1"), wire.TaskRunning)
	pub("new-1")

	var runs atomic.Int32
	b.start(t, Config{}, map[string]Handler{"count": counter(&runs, 0, nil)})
	b.waitState(t, "running-1", wire.TaskSucceeded, 10*time.Second)
	b.waitState(t, "new-1", wire.TaskSucceeded, 10*time.Second)
	b.waitEmpty(t, 10*time.Second)
	if n := runs.Load(); n != 2 {
		t.Errorf("runs = %d, want 2 (done-1 must not run again)", n)
	}
	if evs := b.eventsOf("done-1", wire.EventTaskStarted); len(evs) != 0 {
		t.Errorf("done-1: %d TASK_STARTED events, want 0", len(evs))
	}

	// Published after the worker started: no record to read, it runs.
	pub("later-1")
	b.waitState(t, "later-1", wire.TaskSucceeded, 10*time.Second)
	if n := runs.Load(); n != 3 {
		t.Errorf("runs = %d, want 3", n)
	}
}
