package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/tasks"
)

// ErrBadTask marks a task message that cannot be decoded or is invalid.
var ErrBadTask = errors.New("bad task")

// ErrOperationInDoubt is returned by Task.Once for an operation that
// started on an earlier delivery and never reported its outcome: it may or
// may not have taken effect, so it is not run again. It is permanent: an
// operator decides.
var ErrOperationInDoubt = errors.New("operation started before and its outcome is unknown")

// Handler runs one attempt of a task. A nil error succeeds; see Permanent
// and RetryAfter for how other errors are treated.
type Handler interface {
	Run(ctx context.Context, t *Task) error
}

// checker is a built-in handler that can tell, before the task's resource
// is taken, that a task cannot run at all (a permanent failure).
type checker interface {
	check(t *Task) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, t *Task) error

// Run calls f.
func (f HandlerFunc) Run(ctx context.Context, t *Task) error { return f(ctx, t) }

// Task is one attempt of a task, as its handler sees it.
type Task struct {
	ID    string
	Type  string
	Queue string
	// Attempt counts the runs of the task, this one included (1 on the
	// first run); delayed retries are not counted.
	Attempt  int
	Payload  json.RawMessage
	Resource string
	// LeaseRevision is the revision of the lease held on Resource (0
	// without one): a fencing token, higher for every later holder, that
	// the handler can pass to what it writes.
	LeaseRevision uint64
	// Deadline is when the attempt times out.
	Deadline time.Time

	cps     Checkpoints
	touched atomic.Bool
	output  atomic.Pointer[string]
	result  atomic.Pointer[json.RawMessage]
	// live publishes the attempt's output lines; nil outside a worker.
	live *liveOutput
}

// Checkpoints keeps a task's checkpoint and its operation keys: a
// *tasks.CheckpointStore on the gantry_checkpoints bucket in a worker, an
// in-memory one in workerstest.
type Checkpoints interface {
	Load(ctx context.Context, taskID string) (*wire.Checkpoint, error)
	Save(ctx context.Context, taskID string, cp wire.Checkpoint) error
	BeginOp(ctx context.Context, taskID, op string) (tasks.OpState, error)
	FinishOp(ctx context.Context, taskID, op string) error
	AbortOp(ctx context.Context, taskID, op string) error
}

// TaskOptions describes one attempt of a task for NewTask.
type TaskOptions struct {
	ID, Type, Queue string
	// Attempt is the attempt's number, 1 for the first.
	Attempt  int
	Payload  json.RawMessage
	Resource string
	Deadline time.Time
	// Checkpoints keeps the task's checkpoint and operation keys.
	// Required.
	Checkpoints Checkpoints
}

// NewTask returns one attempt of a task for running a Handler outside a
// worker: what package workerstest does to test a handler without a
// broker. A worker makes its own.
func NewTask(o TaskOptions) *Task {
	return &Task{ID: o.ID, Type: o.Type, Queue: o.Queue, Attempt: o.Attempt, Payload: o.Payload,
		Resource: o.Resource, Deadline: o.Deadline, cps: o.Checkpoints}
}

// Output returns what the attempt kept with SetOutput.
func (t *Task) Output() string {
	if p := t.output.Load(); p != nil {
		return *p
	}
	return ""
}

// storeTry bounds one try of a checkpoint store call: a request lost with
// a broker that died is made again after it, rather than waiting out the
// task's timeout.
const storeTry = 5 * time.Second

// Checkpoint returns the task's last saved checkpoint, or nil.
func (t *Task) Checkpoint(ctx context.Context) (*wire.Checkpoint, error) {
	var cp *wire.Checkpoint
	err := kv.Retry(ctx, storeTry, func(ctx context.Context) error {
		var err error
		cp, err = t.cps.Load(ctx, t.ID)
		return err
	})
	return cp, err
}

// SaveCheckpoint saves cp as the task's checkpoint: a redelivery of the
// task gets it back from Checkpoint.
func (t *Task) SaveCheckpoint(ctx context.Context, cp wire.Checkpoint) error {
	t.touched.Store(true)
	cp.Attempt = t.Attempt
	if cp.UpdatedAt.IsZero() {
		cp.UpdatedAt = time.Now()
	}
	return kv.Retry(ctx, storeTry, func(ctx context.Context) error { return t.cps.Save(ctx, t.ID, cp) })
}

// Once runs fn unless the operation named op already ran for this task,
// on this or an earlier delivery: a step guarded by an operation key runs
// at most once. If fn returns an error the operation is forgotten, so a
// retry may run it again: fn must fail without effect. If an earlier run
// started fn and never finished (its worker died), Once returns an error
// wrapping ErrOperationInDoubt.
func (t *Task) Once(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	t.touched.Store(true)
	st, err := t.cps.BeginOp(ctx, t.ID, op)
	if err != nil {
		return err
	}
	switch st {
	case tasks.OpDone:
		return nil
	case tasks.OpInDoubt:
		return Permanent(fmt.Errorf("operation %q: %w", op, ErrOperationInDoubt))
	}
	// The outcome is recorded even when the attempt's context has ended,
	// for up to a minute of a broker failing over.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := fn(ctx); err != nil {
		if aerr := kv.Retry(rctx, storeTry, func(ctx context.Context) error { return t.cps.AbortOp(ctx, t.ID, op) }); aerr != nil {
			return errors.Join(err, aerr)
		}
		return err
	}
	return kv.Retry(rctx, storeTry, func(ctx context.Context) error { return t.cps.FinishOp(ctx, t.ID, op) })
}

// tee returns w, also publishing the lines written to it live as the
// task's output of stream (wire.OutputStdout, …).
func (t *Task) tee(stream string, w io.Writer) io.Writer { return t.live.tee(stream, w) }

// SetOutput keeps s (its tail) as the output of this attempt, shown by
// `gantry task get`.
func (t *Task) SetOutput(s string) { t.output.Store(&s) }

// MaxResult bounds the result a handler keeps with SetResult.
const MaxResult = 128 << 10

// SetResult keeps r, a JSON document, as the result of this attempt: if
// the attempt succeeds it is on the task's record and in its TASK_FINISHED
// event, and `gantry task get` shows it. A result that is not JSON, or is
// larger than MaxResult, is replaced by an object whose "error" says so.
func (t *Task) SetResult(r json.RawMessage) {
	switch {
	case !json.Valid(r):
		r = json.RawMessage(`{"error":"the handler's result is not JSON"}`)
	case len(r) > MaxResult:
		r = fmt.Appendf(nil, `{"error":"the handler's result of %d bytes is over the limit of %d"}`, len(r), MaxResult)
	}
	t.result.Store(&r)
}

// Result returns what the attempt kept with SetResult, or nil.
func (t *Task) Result() json.RawMessage {
	if p := t.result.Load(); p != nil {
		return *p
	}
	return nil
}

// DecodeTask decodes a task message body. An empty body is a task with
// every field unset; anything else must be a JSON object whose fields have
// the types of wire.Task. Unknown fields are ignored. The error wraps
// ErrBadTask and says what is wrong.
func DecodeTask(data []byte, maxSize int) (wire.Task, error) {
	var t wire.Task
	if maxSize > 0 && len(data) > maxSize {
		return t, fmt.Errorf("%w: message of %d bytes is over the limit of %d", ErrBadTask, len(data), maxSize)
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return t, nil
	}
	if trimmed[0] != '{' {
		return t, fmt.Errorf("%w: body must be a JSON object", ErrBadTask)
	}
	if err := json.Unmarshal(trimmed, &t); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return wire.Task{}, fmt.Errorf("%w: field %q: want %s, got %s", ErrBadTask, te.Field, te.Type, te.Value)
		}
		var pe *time.ParseError
		if errors.As(err, &pe) {
			return wire.Task{}, fmt.Errorf("%w: not_before %s: want an RFC 3339 time such as 2026-11-30T12:00:00Z", ErrBadTask, pe.Value)
		}
		return wire.Task{}, fmt.Errorf("%w: %v", ErrBadTask, err)
	}
	if err := validateTask(t); err != nil {
		return wire.Task{}, fmt.Errorf("%w: %v", ErrBadTask, err)
	}
	return t, nil
}

// publishedID is the id in the body of a task message that DecodeTask
// rejects for another reason ({"id":"r-1","timeout":5}), when it is a
// valid id; "" otherwise.
func publishedID(data []byte) string {
	var v struct {
		ID any `json:"id"`
	}
	if json.Unmarshal(bytes.TrimSpace(data), &v) != nil {
		return ""
	}
	if id, ok := v.ID.(string); ok && wire.ValidTaskID(id) {
		return id
	}
	return ""
}

func validateTask(t wire.Task) error {
	if t.ID != "" && !wire.ValidTaskID(t.ID) {
		return fmt.Errorf("id %q: want 1 to %d letters, digits, '-', '_' or '='", t.ID, wire.MaxTaskIDLen)
	}
	if t.Resource != "" && !wire.ValidToken(t.Resource) {
		return fmt.Errorf("resource %q: want a name without spaces, '.', '*' or '>'", t.Resource)
	}
	if t.MaxAttempts < 0 {
		return fmt.Errorf("max_attempts %d: want 0 (the default) or more", t.MaxAttempts)
	}
	if t.Timeout != "" {
		d, err := time.ParseDuration(t.Timeout)
		if err != nil || d <= 0 {
			return fmt.Errorf("timeout %q: want a positive Go duration such as 30s", t.Timeout)
		}
	}
	return nil
}
