// Package workerstest runs a gantry task handler without a broker, in the
// manner of River's rivertest.Worker: a unit test calls Run with a handler
// and a task, and gets back what a worker would do with the result — the
// class (succeeded, retry, delay, permanent...), the error, the output and
// the checkpoint saved. Operation keys (Task.Once) and checkpoints live in
// memory, in a Checkpoints that a test can pass to a second Run to play a
// redelivery.
//
//	res := workerstest.Run(ctx, myHandler, workerstest.Task{Type: "resize", Payload: `{"w":64}`})
//	if res.Class != workers.ClassSucceeded { t.Fatal(res.Err) }
package workerstest

import (
	"cmp"
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/tasks"
	"github.com/gantry-dev/gantry/workers"
)

// Task is the attempt to run. Every field is optional.
type Task struct {
	// ID defaults to "test-task"; Type to "test"; Queue to "default";
	// Attempt to 1.
	ID, Type, Queue string
	Attempt         int
	// Payload is the task's payload, as JSON.
	Payload string
	// Resource is the resource the task names (not leased here).
	Resource string
	// Timeout bounds the attempt. Defaults to 10 minutes, a worker's
	// default.
	Timeout time.Duration
	// Checkpoints holds the task's checkpoint and operation keys. Defaults
	// to a new, empty one; pass the same one to two Runs to play a
	// redelivery.
	Checkpoints *Checkpoints
}

// Result is what a worker would do with the attempt.
type Result struct {
	// Class says what becomes of the task (ClassSucceeded for a nil error).
	Class workers.Class
	// RetryAfter is the delay a ClassDelay error asked for (0: the queue's
	// default).
	RetryAfter time.Duration
	// Err is what the handler returned.
	Err error
	// Output is what the handler kept with Task.SetOutput.
	Output string
	// Result is what the handler kept with Task.SetResult, or nil.
	Result json.RawMessage
	// Checkpoint is the task's checkpoint after the attempt, or nil.
	Checkpoint *wire.Checkpoint
}

// Run runs one attempt of h on t, with a deadline as a worker gives it, and
// classifies its result as a worker does.
func Run(ctx context.Context, h workers.Handler, t Task) Result {
	cps := t.Checkpoints
	if cps == nil {
		cps = NewCheckpoints()
	}
	timeout := cmp.Or(t.Timeout, 10*time.Minute)
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, workers.ErrTimeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	var payload json.RawMessage
	if t.Payload != "" {
		payload = json.RawMessage(t.Payload)
	}
	task := workers.NewTask(workers.TaskOptions{
		ID: cmp.Or(t.ID, "test-task"), Type: cmp.Or(t.Type, "test"), Queue: cmp.Or(t.Queue, wire.DefaultQueue),
		Attempt: max(t.Attempt, 1), Payload: payload, Resource: t.Resource, Deadline: deadline, Checkpoints: cps,
	})
	err := h.Run(ctx, task)
	class, after := workers.Classify(err)
	cp, _ := cps.Load(context.Background(), task.ID)
	return Result{Class: class, RetryAfter: after, Err: err, Output: task.Output(), Result: task.Result(), Checkpoint: cp}
}

// Checkpoints keeps checkpoints and operation keys in memory. It is safe
// for concurrent use.
type Checkpoints struct {
	mu  sync.Mutex
	cps map[string]wire.Checkpoint
	ops map[string]tasks.OpState
}

// NewCheckpoints returns an empty in-memory store.
func NewCheckpoints() *Checkpoints {
	return &Checkpoints{cps: map[string]wire.Checkpoint{}, ops: map[string]tasks.OpState{}}
}

// Load returns the last checkpoint of task id, or nil.
func (c *Checkpoints) Load(_ context.Context, taskID string) (*wire.Checkpoint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cp, ok := c.cps[taskID]
	if !ok {
		return nil, nil
	}
	return &cp, nil
}

// Save stores cp as the last checkpoint of task id.
func (c *Checkpoints) Save(_ context.Context, taskID string, cp wire.Checkpoint) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cps[taskID] = cp
	return nil
}

// BeginOp marks operation op of task id as started, unless it started
// before: then it reports OpDone, or OpInDoubt for one that never
// finished.
func (c *Checkpoints) BeginOp(_ context.Context, taskID, op string) (tasks.OpState, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := taskID + "\x00" + op
	st, ok := c.ops[k]
	if !ok {
		c.ops[k] = tasks.OpInDoubt
		return tasks.OpNew, nil
	}
	return st, nil
}

// FinishOp marks operation op of task id as done.
func (c *Checkpoints) FinishOp(_ context.Context, taskID, op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[taskID+"\x00"+op] = tasks.OpDone
	return nil
}

// AbortOp forgets operation op of task id.
func (c *Checkpoints) AbortOp(_ context.Context, taskID, op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.ops, taskID+"\x00"+op)
	return nil
}

var _ workers.Checkpoints = (*Checkpoints)(nil)
