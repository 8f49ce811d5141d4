package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/rpc"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/tasks"
)

// KeyWindow is how long a submitted task's key deduplicates: the tasks
// stream's Nats-Msg-Id window, and the workers' default.
const KeyWindow = 24 * time.Hour

// cancelAnswerWait is how long CancelTask waits for the worker running a
// task to answer.
const cancelAnswerWait = time.Second

// Task is a task to submit.
type Task struct {
	// Type is the task's type: a built-in one (exec, http, noop, sql) or
	// one a handler serves on gantry.handlers.<type>. Required.
	Type string
	// Queue is the task's queue. Defaults to wire.DefaultQueue ("default").
	Queue string
	// Payload is the handler's input, encoded as JSON; a json.RawMessage
	// is sent as it is. Defaults to none.
	Payload any
	// ID names the task and is its message's Nats-Msg-Id: submitting the
	// same id twice within the stream's 24 h window runs it once. Letters,
	// digits, '-', '_' and '='. Defaults to a new ULID.
	ID string
	// Key deduplicates: while a task with the same key is known (KeyWindow),
	// Submit returns that task's id and publishes nothing.
	Key string
	// Priority orders the waiting tasks of a prioritized queue, higher
	// first.
	Priority int
	// NotBefore delays the first attempt. Defaults to none.
	NotBefore time.Time
	// MaxAttempts bounds the attempts before NEEDS_REVIEW. Defaults to the
	// queue's.
	MaxAttempts int
	// Timeout bounds one attempt. Defaults to the worker's.
	Timeout time.Duration
	// Resource is leased while the task runs. Defaults to none.
	Resource string
}

// Submitted is what Submit did.
type Submitted struct {
	// ID is the task's id: the new task's, or when Duplicate the task its
	// key already belongs to.
	ID string
	// Duplicate reports that the key belonged to another task: nothing was
	// published.
	Duplicate bool
}

// wire returns t as the body of its message.
func (t Task) wire() (wire.Task, error) {
	w := wire.Task{ID: t.ID, Resource: t.Resource, Priority: t.Priority, MaxAttempts: t.MaxAttempts, Key: t.Key}
	if w.ID == "" {
		w.ID = ulid.Make().String()
	}
	if t.Payload != nil {
		data, err := json.Marshal(t.Payload)
		if err != nil {
			return wire.Task{}, fmt.Errorf("%w: payload: %v", ErrInvalid, err)
		}
		w.Payload = data
	}
	if t.Timeout < 0 {
		return wire.Task{}, fmt.Errorf("%w: timeout %v: want a positive duration", ErrInvalid, t.Timeout)
	}
	if t.Timeout > 0 {
		w.Timeout = t.Timeout.String()
	}
	if !t.NotBefore.IsZero() {
		nb := t.NotBefore.UTC()
		w.NotBefore = &nb
	}
	return w, nil
}

// message returns t as the body of its message and the message, addressed
// to gantry.tasks.<queue>.<type>.
func (t Task) message() (wire.Task, *nats.Msg, error) {
	body, err := t.wire()
	if err != nil {
		return wire.Task{}, nil, err
	}
	msg, err := tasks.NewMsg(t.Queue, t.Type, body)
	if err != nil {
		return wire.Task{}, nil, err
	}
	return body, msg, nil
}

// Submit records t as WAITING in gantry_tasks, emits TASK_CREATED and
// publishes it on gantry.tasks.<queue>.<type>. A task whose key belongs to
// another task is not published: Submitted names that task. If the publish
// fails, the record and the key's claim are undone, so that submitting
// again runs the task.
func (c *Client) Submit(ctx context.Context, t Task) (Submitted, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	body, msg, err := t.message()
	if err != nil {
		return Submitted{}, err
	}
	msg.Header.Set(wire.HeaderCreated, "1")
	queue, typ, err := wire.ParseTaskSubject(msg.Subject)
	if err != nil {
		return Submitted{}, err
	}
	store, err := c.taskStore(ctx)
	if err != nil {
		return Submitted{}, err
	}
	var cps *tasks.CheckpointStore
	if body.Key != "" {
		if cps, err = c.checkpointStore(ctx); err != nil {
			return Submitted{}, err
		}
		owner, err := cps.ClaimKey(ctx, body.Key, body.ID, KeyWindow)
		if err != nil {
			return Submitted{}, err
		}
		if owner != body.ID {
			// A claim whose task has no record was left by a submit that
			// failed (its undo failed too): the key is free.
			if _, _, gerr := store.Get(ctx, owner); errors.Is(gerr, tasks.ErrNotFound) {
				if owner, err = cps.TakeKey(ctx, body.Key, owner, body.ID, KeyWindow); err != nil {
					return Submitted{}, err
				}
			}
		}
		if owner != body.ID {
			return Submitted{ID: owner, Duplicate: true}, nil
		}
	}
	now := time.Now().UTC()
	rec := wire.TaskRecord{
		TaskInfo:    wire.TaskInfo{ID: body.ID, Type: typ, Queue: queue, State: wire.TaskWaiting, Resource: body.Resource, CreatedAt: now, UpdatedAt: now},
		MaxAttempts: body.MaxAttempts, Priority: body.Priority, Key: body.Key, NotBefore: body.NotBefore,
	}
	// undo gives up what was written when the task is not submitted, so
	// that submitting it again runs it rather than naming this id.
	undo := func(err error, record bool) error {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.set.timeout)
		defer cancel()
		// Made again while the broker fails over (both are safe to repeat).
		if record {
			if derr := kv.Retry(uctx, undoTry, func(ctx context.Context) error { return store.Delete(ctx, body.ID) }); derr != nil {
				err = errors.Join(err, fmt.Errorf("remove the record of task %s: %w", body.ID, derr))
			}
		}
		if cps != nil {
			if rerr := kv.Retry(uctx, undoTry, func(ctx context.Context) error { return cps.ReleaseKey(ctx, body.Key, body.ID) }); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		return err
	}
	rev, err := store.Create(ctx, rec)
	if errors.Is(err, tasks.ErrExists) {
		return Submitted{}, undo(fmt.Errorf("%w: choose another id", err), false)
	}
	if err != nil {
		return Submitted{}, undo(c.whyNotStored(ctx, err), false)
	}
	if err := c.em.Emit(ctx, wire.Event{Type: wire.EventTaskCreated, TaskID: body.ID, ResourceID: body.Resource, Message: "task submitted",
		Payload: audit.Payload(map[string]any{"queue": queue, "type": typ})}); err != nil {
		return Submitted{}, undo(c.whyNotStored(ctx, err), true)
	}
	ack, err := c.js.PublishMsg(ctx, msg)
	if err != nil {
		return Submitted{}, undo(fmt.Errorf("publish task %s: %w (nothing was submitted: try again)", body.ID, c.whyNotStored(ctx, err)), true)
	}
	rec.Seq = ack.Sequence
	if _, err := store.Update(ctx, rec, rev); err != nil && !errors.Is(err, tasks.ErrChanged) {
		return Submitted{}, err
	}
	return Submitted{ID: body.ID}, nil
}

// Publish publishes t on gantry.tasks.<queue>.<type> and nothing else, as
// any NATS client may: the worker that takes it records it, emits
// TASK_CREATED and claims its key (a task whose key belongs to another is
// then rejected as a duplicate). It is Submit for a user whose role may
// publish tasks but not write task records (the submitter role).
func (c *Client) Publish(ctx context.Context, t Task) (Submitted, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	body, msg, err := t.message()
	if err != nil {
		return Submitted{}, err
	}
	if _, err := c.js.PublishMsg(ctx, msg); err != nil {
		return Submitted{}, fmt.Errorf("publish task %s: %w", body.ID, err)
	}
	return Submitted{ID: body.ID}, nil
}

// undoTry bounds one try of undoing a submit that failed.
const undoTry = 2 * time.Second

// WaitOption tunes Wait.
type WaitOption func(*waitSettings)

type waitSettings struct {
	onUpdate func(TaskRecord)
}

// OnUpdate has Wait call fn with each record of the task it sees before
// the last (WAITING, RUNNING, RETRY_WAIT…), from Wait's goroutine: a
// progress display follows the task with it.
func OnUpdate(fn func(TaskRecord)) WaitOption { return func(s *waitSettings) { s.onUpdate = fn } }

// whyNotStored explains a write the broker did not take: when its storage
// is failing (a full disk: nats-server then leaves publishers without an
// answer, so err is a time-out), it asks the broker's health service and
// says so, as ErrUnavailable. Otherwise it returns err.
func (c *Client) whyNotStored(ctx context.Context, err error) error {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	var h wire.BrokerHealth
	if rpc.Request(hctx, c.nc, wire.SubjectBrokerHealth, nil, &h) != nil || h.StorageOK {
		return err
	}
	return fmt.Errorf("%w: the broker's storage is full or failing, free space in its data dir (it stores again on its own once there is room): %s (%v)", ErrUnavailable, h.Error, err)
}

// Wait watches task id until it ends (SUCCEEDED, NEEDS_REVIEW or
// CANCELLED) and returns its record. It waits as long as ctx: when ctx
// ends first, the error matches ErrGaveUp (and ctx's error); the task may
// still finish.
func (c *Client) Wait(ctx context.Context, id string, opts ...WaitOption) (TaskRecord, error) {
	var set waitSettings
	for _, o := range opts {
		o(&set)
	}
	store, err := c.taskStore(ctx)
	if err != nil {
		return TaskRecord{}, err
	}
	w, err := store.KeyValue().Watch(ctx, id)
	if err != nil {
		return TaskRecord{}, fmt.Errorf("watch task %s: %w", id, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return TaskRecord{}, fmt.Errorf("task %s: %w: %w", id, ErrGaveUp, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return TaskRecord{}, fmt.Errorf("watch task %s: ended", id)
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var rec TaskRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				continue
			}
			if rec.State.Terminal() {
				return rec, nil
			}
			if set.onUpdate != nil {
				set.onUpdate(rec)
			}
		}
	}
}

// Task returns the record of task id (a message an earlier release kept in
// it has its payload redacted).
func (c *Client) Task(ctx context.Context, id string) (TaskRecord, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.taskStore(ctx)
	if err != nil {
		return TaskRecord{}, err
	}
	rec, _, err := store.Get(ctx, id)
	return forDisplay(rec), err
}

// forDisplay returns rec with the payload of a message an earlier release
// kept in it redacted: Task and Tasks are for display, and RetryTask reads
// the record itself.
func forDisplay(rec TaskRecord) TaskRecord {
	if rec.Message != nil {
		m := *rec.Message
		m.Data = wire.RedactJSON(m.Data)
		rec.Message = &m
	}
	return rec
}

// TaskFilter selects the tasks Tasks returns; its zero value selects all.
type TaskFilter struct {
	// State, Queue and Type, when set, must match.
	State TaskState
	Queue string
	Type  string
	// Limit keeps only the newest Limit tasks (0: all).
	Limit int
}

// taskStates are the states of the contract, in life order.
var taskStates = []TaskState{TaskWaiting, TaskRunning, TaskRetryWait, TaskSucceeded, TaskNeedsReview, TaskCancelled}

// Tasks returns the records of the tasks f selects, oldest first.
func (c *Client) Tasks(ctx context.Context, f TaskFilter) ([]TaskRecord, error) {
	if f.State != "" && !slices.Contains(taskStates, f.State) {
		return nil, fmt.Errorf("%w: state %q: want WAITING, RUNNING, RETRY_WAIT, SUCCEEDED, NEEDS_REVIEW or CANCELLED", ErrInvalid, f.State)
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("%w: limit %d: want 0 (all) or more", ErrInvalid, f.Limit)
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.taskStore(ctx)
	if err != nil {
		return nil, err
	}
	list, err := store.List(ctx, func(r wire.TaskRecord) bool {
		return (f.State == "" || r.State == f.State) && (f.Queue == "" || r.Queue == f.Queue) && (f.Type == "" || r.Type == f.Type)
	})
	if err != nil {
		return nil, err
	}
	if f.Limit > 0 && len(list) > f.Limit {
		list = list[len(list)-f.Limit:]
	}
	for i := range list {
		list[i] = forDisplay(list[i])
	}
	return list, nil
}

// RetryTask runs a NEEDS_REVIEW task again: it publishes the task's
// message (kept on its review subject when it left its queue), sets it
// WAITING with a fresh set of attempts, and removes the kept copy. A task in another state, or one whose
// message was malformed or not kept, is ErrInvalid.
func (c *Client) RetryTask(ctx context.Context, id string) (TaskRecord, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.taskStore(ctx)
	if err != nil {
		return TaskRecord{}, err
	}
	rec, rev, err := store.Get(ctx, id)
	if err != nil {
		return TaskRecord{}, err
	}
	if rec.State != wire.TaskNeedsReview {
		return TaskRecord{}, fmt.Errorf("%w: task %s is %s: only a NEEDS_REVIEW task can be retried", ErrInvalid, id, rec.State)
	}
	kept, stream, err := c.keptMessage(ctx, rec)
	if err != nil {
		return TaskRecord{}, err
	}
	run := max(rec.Run, 1) + 1
	msg, err := requeueMsg(id, kept, run)
	if err != nil {
		return TaskRecord{}, fmt.Errorf("%w: task %s was rejected as malformed (%s): publish a corrected task instead", ErrInvalid, id, rec.LastError)
	}

	orig, last := rec, rec.LastError
	rec.State, rec.Attempts, rec.Deliveries, rec.Delays = wire.TaskWaiting, 0, 0, 0
	rec.Message, rec.Kept, rec.RetryAt, rec.Output = nil, "", nil, ""
	rec.LastError = "retried by an operator; before: " + last
	rec.Run = run
	rec.UpdatedAt = time.Now().UTC()
	if rev, err = store.Update(ctx, rec, rev); err != nil {
		return TaskRecord{}, err
	}
	ack, err := c.js.PublishMsg(ctx, msg)
	if err != nil {
		// Not requeued: put the record back as it was, message included,
		// rather than leave a WAITING task that nothing will run.
		err = fmt.Errorf("publish task %s: %w", id, err)
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.set.timeout)
		defer cancel()
		orig.UpdatedAt = time.Now().UTC()
		if _, rerr := store.Update(uctx, orig, rev); rerr != nil {
			return TaskRecord{}, errors.Join(err, fmt.Errorf("put task %s back to %s: %w", id, orig.State, rerr))
		}
		return TaskRecord{}, fmt.Errorf("%w (task %s is %s again: retry it)", err, id, orig.State)
	}
	rec.Seq = ack.Sequence
	if _, err := store.Update(ctx, rec, rev); err != nil && !errors.Is(err, tasks.ErrChanged) {
		return TaskRecord{}, err
	}
	// Requeued: the kept copy has done its job. Not the one of the new
	// run, if it went to review again already.
	if err := tasks.ForgetReview(ctx, stream, id, ack.Sequence); err != nil {
		return TaskRecord{}, fmt.Errorf("task %s requeued, but: %w", id, err)
	}
	if err := c.em.Emit(ctx, wire.Event{Type: wire.EventRetryScheduled, TaskID: id, ResourceID: rec.Resource,
		Message: "retried by an operator", Payload: audit.Payload(map[string]any{"class": "operator", "seq": ack.Sequence, "run": run})}); err != nil {
		return TaskRecord{}, err
	}
	return rec, nil
}

// keptMessage returns the message of a NEEDS_REVIEW task: the one kept on
// its review subject, as its publisher sent it to its queue, or the one an
// earlier release kept in the record. It returns the tasks stream too.
func (c *Client) keptMessage(ctx context.Context, rec wire.TaskRecord) (*wire.StoredMessage, jetstream.Stream, error) {
	stream, err := c.js.Stream(ctx, wire.StreamTasks)
	if err != nil {
		return nil, nil, fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
	}
	if rec.Kept == "" {
		if rec.Message == nil {
			return nil, nil, fmt.Errorf("%w: task %s: its message was not kept; publish it again", ErrInvalid, rec.ID)
		}
		return rec.Message, stream, nil
	}
	raw, err := stream.GetLastMsgForSubject(ctx, rec.Kept)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil, fmt.Errorf("%w: task %s: its message is no longer on %s; publish it again", ErrInvalid, rec.ID, rec.Kept)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read the kept message of task %s: %w", rec.ID, err)
	}
	return &wire.StoredMessage{Subject: wire.TaskSubject(rec.Queue, rec.Type), Header: raw.Header, Data: raw.Data}, stream, nil
}

// requeueMsg rebuilds a kept task message for a retry, its id in the body,
// its publisher's headers kept and its run numbered. It carries no
// Nats-Msg-Id: the stream would drop it as a duplicate of the first
// publish within its window.
func requeueMsg(id string, kept *wire.StoredMessage, run int) (*nats.Msg, error) {
	queue, typ, err := wire.ParseTaskSubject(kept.Subject)
	if err != nil {
		return nil, err
	}
	var t wire.Task
	if len(kept.Data) > 0 {
		if err := json.Unmarshal(kept.Data, &t); err != nil {
			return nil, err
		}
	}
	t.ID = id
	msg, err := tasks.NewMsg(queue, typ, t)
	if err != nil {
		return nil, err
	}
	for k, v := range kept.Header {
		if k != jetstream.MsgIDHeader {
			msg.Header[k] = v
		}
	}
	msg.Header.Del(jetstream.MsgIDHeader)
	msg.Header.Set(wire.HeaderCreated, "1")
	msg.Header.Set(wire.HeaderRun, strconv.Itoa(run))
	return msg, nil
}

// Cancelled is what CancelTask did.
type Cancelled struct {
	// Task is the task's record, CANCELLED.
	Task TaskRecord
	// Was is the task's state before.
	Was TaskState
}

// CancelTask sets a task CANCELLED. A task waiting in the stream (WAITING,
// RETRY_WAIT) is removed from it and its end recorded; a running one is
// stopped by its worker (an exec task's whole process tree is killed), and
// a prioritized queue's sorter drops one it holds: they record the end. A
// task that has ended is ErrInvalid.
func (c *Client) CancelTask(ctx context.Context, id string) (Cancelled, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.taskStore(ctx)
	if err != nil {
		return Cancelled{}, err
	}
	rec, rev, err := store.Get(ctx, id)
	if err != nil {
		return Cancelled{}, err
	}
	if rec.State.Terminal() {
		return Cancelled{}, fmt.Errorf("%w: task %s has ended (%s): nothing to cancel", ErrInvalid, id, rec.State)
	}
	was := rec.State
	rec.State = wire.TaskCancelled
	rec.RetryAt = nil
	rec.UpdatedAt = time.Now().UTC()
	// Until the end is recorded, the CANCELLED record must not expire: a
	// task a sorter already moved to gantry.ready (its message is not
	// rec.Seq) is found cancelled by its worker only through it, however
	// long it waits. Whoever records the end writes it with the retention.
	if rev, err = store.Keeping().Update(ctx, rec, rev); err != nil {
		return Cancelled{}, err
	}
	// A running task: its worker stops it, answers, and records the end. The
	// record may still say WAITING for a task that started an instant ago,
	// so the answer, not the record, decides who finishes the task.
	running, err := c.announceCancel(ctx, id)
	if err != nil {
		return Cancelled{}, err
	}
	running = running || was == wire.TaskRunning
	removed := false
	if rec.Seq != 0 && !running {
		stream, err := c.js.Stream(ctx, wire.StreamTasks)
		if err != nil {
			return Cancelled{}, fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
		}
		err = stream.DeleteMsg(ctx, rec.Seq)
		removed = err == nil
		if err != nil && !msgGone(err) {
			return Cancelled{}, fmt.Errorf("remove task message: %w", err)
		}
	}
	if err := c.em.Emit(ctx, wire.Event{Type: wire.EventTaskCancelled, TaskID: id, ResourceID: rec.Resource, JobID: rec.Job,
		Message: "cancelled by an operator", Payload: audit.Payload(map[string]any{"was": was})}); err != nil {
		return Cancelled{}, err
	}
	if removed {
		if _, err := store.Update(ctx, rec, rev); err != nil && !errors.Is(err, tasks.ErrChanged) {
			return Cancelled{}, err
		}
		if err := c.em.Emit(ctx, wire.Event{Type: wire.EventTaskFinished, TaskID: id, ResourceID: rec.Resource, JobID: rec.Job, Message: "task cancelled",
			Payload: audit.Payload(map[string]any{"state": wire.TaskCancelled, "attempts": rec.Attempts, "run": max(rec.Run, 1)})}); err != nil {
			return Cancelled{}, err
		}
	}
	return Cancelled{Task: rec, Was: was}, nil
}

// announceCancel asks the workers' cancel service who runs or holds task
// id, and reports whether one answered (it then records the task's end).
// No answer within cancelAnswerWait means nobody does.
func (c *Client) announceCancel(ctx context.Context, id string) (bool, error) {
	actx, cancel := context.WithTimeout(ctx, cancelAnswerWait)
	defer cancel()
	var reply wire.TaskCancelReply
	err := rpc.Request(actx, c.nc, wire.SubjectTaskCancel, wire.TaskCancelRequest{ID: id}, &reply)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, rpc.ErrNoResponders), errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return false, nil
	}
	return false, fmt.Errorf("announce cancel: %w", err)
}

// msgGone reports whether a message delete failed because the message is no
// longer in the stream: its worker took it (and records its end). The server
// says so either as "message not found" or, for a delete, as its generic
// delete failure (10057) with the text "no message found".
func msgGone(err error) bool {
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound ||
			apiErr.ErrorCode == errCodeSequenceNotFound ||
			apiErr.ErrorCode == errCodeMsgDeleteFailed && strings.Contains(apiErr.Description, "no message found")
	}
	// Stream.DeleteMsg passes the server's error on as text only.
	if errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		text := err.Error()
		return strings.Contains(text, fmt.Sprintf("err_code=%d", errCodeSequenceNotFound)) || strings.Contains(text, "no message found")
	}
	return false
}

// nats-server's error codes for a message that is not there:
// JSStreamMsgDeleteFailedF, and JSSequenceNotFoundErrF for a sequence
// below the stream's first (a work queue's consumed messages).
const (
	errCodeMsgDeleteFailed  jetstream.ErrorCode = 10057
	errCodeSequenceNotFound jetstream.ErrorCode = 10043
)
