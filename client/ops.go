package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/tasks"
)

type (
	// QueueState is whether a queue is paused, and by whom.
	QueueState = wire.QueueState
	// WorkerInfo is a live worker process, as its last heartbeat says.
	WorkerInfo = wire.WorkerInfo
)

func (c *Client) queueStore(ctx context.Context) (*tasks.Queues, error) {
	return c.queues.get(func() (*tasks.Queues, error) { return tasks.NewQueues(ctx, c.js) })
}

func (c *Client) presenceStore(ctx context.Context) (*tasks.Presence, error) {
	return c.presence.get(func() (*tasks.Presence, error) { return tasks.NewPresence(ctx, c.js) })
}

// PauseQueue pauses queue: its waiting tasks stay in the stream, and no
// worker starts one until ResumeQueue; tasks already running finish. The
// pause is stored in gantry_queues (workers honour it across restarts, and
// create the queue's new consumers paused) and applied at once to the
// queue's consumers on the broker. It emits QUEUE_PAUSED. Pausing a paused
// queue changes only its reason.
func (c *Client) PauseQueue(ctx context.Context, queue, reason string) (QueueState, error) {
	return c.setQueue(ctx, queue, true, reason)
}

// ResumeQueue resumes a paused queue: its tasks run again, in the order
// they were published. It emits QUEUE_RESUMED.
func (c *Client) ResumeQueue(ctx context.Context, queue string) (QueueState, error) {
	return c.setQueue(ctx, queue, false, "")
}

func (c *Client) setQueue(ctx context.Context, queue string, paused bool, reason string) (QueueState, error) {
	if !wire.ValidToken(queue) {
		return QueueState{}, fmt.Errorf("%w: queue %q: a queue name has no spaces, '.', '*' or '>'", ErrInvalid, queue)
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.queueStore(ctx)
	if err != nil {
		return QueueState{}, err
	}
	st := QueueState{Queue: queue, Paused: paused, Reason: reason, By: operator(), UpdatedAt: time.Now().UTC()}
	// Stored first: a worker that creates a consumer of the queue from
	// now on creates it paused, and every worker follows the bucket.
	if err := store.Set(ctx, st); err != nil {
		return QueueState{}, err
	}
	consumers, err := tasks.PauseConsumers(ctx, c.js, queue, paused)
	if err != nil {
		return QueueState{}, err
	}
	typ, msg := wire.EventQueueResumed, "queue resumed by an operator"
	if paused {
		typ, msg = wire.EventQueuePaused, "queue paused by an operator"
	}
	if err := c.em.Emit(ctx, wire.Event{Type: typ, Message: msg,
		Payload: audit.Payload(map[string]any{"queue": queue, "reason": reason, "by": st.By, "consumers": consumers})}); err != nil {
		return QueueState{}, err
	}
	return st, nil
}

// operator names who runs this client: the user and the host.
func operator() string {
	host, _ := os.Hostname()
	return cmp.Or(os.Getenv("USER"), os.Getenv("USERNAME"), "?") + "@" + cmp.Or(host, "?")
}

// Workers returns the live worker processes, by name: those whose
// presence entry in gantry_workers has not lapsed.
func (c *Client) Workers(ctx context.Context) ([]WorkerInfo, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.presenceStore(ctx)
	if err != nil {
		return nil, err
	}
	return store.List(ctx)
}

// BulkFilter selects the tasks of RetryTasks and PurgeTasks.
type BulkFilter struct {
	// State, Queue and Type, when set, must match.
	State TaskState
	Queue string
	Type  string
	// OlderThan, when set, keeps only tasks last updated longer ago.
	OlderThan time.Duration
	// DryRun counts and lists the tasks, changing nothing.
	DryRun bool
}

// BulkResult is what a bulk call did, or would do.
type BulkResult struct {
	// Matched counts the tasks selected; IDs lists them.
	Matched int      `json:"matched"`
	IDs     []string `json:"ids"`
	// Done counts the tasks changed (0 on a dry run).
	Done   int  `json:"done"`
	DryRun bool `json:"dry_run"`
	// Failed maps the id of each selected task that was not changed to why.
	Failed map[string]string `json:"failed,omitempty"`
}

// selectTasks returns the records f selects.
func (c *Client) selectTasks(ctx context.Context, f BulkFilter) ([]TaskRecord, error) {
	if f.OlderThan < 0 {
		return nil, fmt.Errorf("%w: older than %v: want a positive duration", ErrInvalid, f.OlderThan)
	}
	list, err := c.Tasks(ctx, TaskFilter{State: f.State, Queue: f.Queue, Type: f.Type})
	if err != nil {
		return nil, err
	}
	if f.OlderThan == 0 {
		return list, nil
	}
	cutoff := time.Now().Add(-f.OlderThan)
	out := list[:0]
	for _, r := range list {
		if r.UpdatedAt.Before(cutoff) {
			out = append(out, r)
		}
	}
	return out, nil
}

// RetryTasks runs again every NEEDS_REVIEW task f selects (f.State must be
// NEEDS_REVIEW or empty), as RetryTask does for one: each gets a fresh set
// of attempts and a RETRY_SCHEDULED event. A task that cannot be retried
// is listed in Failed and the others go on.
func (c *Client) RetryTasks(ctx context.Context, f BulkFilter) (BulkResult, error) {
	if f.State != "" && f.State != TaskNeedsReview {
		return BulkResult{}, fmt.Errorf("%w: state %s: only NEEDS_REVIEW tasks can be retried", ErrInvalid, f.State)
	}
	f.State = TaskNeedsReview
	return c.bulk(ctx, f, func(ctx context.Context, r TaskRecord) error {
		_, err := c.RetryTask(ctx, r.ID)
		return err
	})
}

// PurgeTasks removes the records of the ended tasks (SUCCEEDED,
// NEEDS_REVIEW or CANCELLED; f.State is required) that f selects, each
// with a TASK_PURGED event; their events stay in the audit store. A record
// that changed meanwhile (a task retried) is left alone and listed in
// Failed.
func (c *Client) PurgeTasks(ctx context.Context, f BulkFilter) (BulkResult, error) {
	if !f.State.Terminal() {
		return BulkResult{}, fmt.Errorf("%w: state %q: want SUCCEEDED, NEEDS_REVIEW or CANCELLED (a live task cannot be purged; cancel it)", ErrInvalid, f.State)
	}
	return c.bulk(ctx, f, func(ctx context.Context, r TaskRecord) error {
		return c.purge(ctx, r.ID, func(cur TaskRecord) error {
			if cur.State != f.State {
				return fmt.Errorf("%w: task %s is %s now", ErrChanged, r.ID, cur.State)
			}
			return nil
		})
	})
}

// PurgeTask removes the record of one ended task (SUCCEEDED, NEEDS_REVIEW
// or CANCELLED), with a TASK_PURGED event, as PurgeTasks does for many; its
// events stay in the audit store. A live task is ErrInvalid: cancel it
// first.
func (c *Client) PurgeTask(ctx context.Context, id string) error {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	return c.purge(ctx, id, func(cur TaskRecord) error {
		if !cur.State.Terminal() {
			return fmt.Errorf("%w: task %s is %s: only an ended task can be purged (cancel it first)", ErrInvalid, id, cur.State)
		}
		return nil
	})
}

// purge deletes the record of task id, at the revision read, if check
// passes for it, and emits TASK_PURGED.
func (c *Client) purge(ctx context.Context, id string, check func(TaskRecord) error) error {
	store, err := c.taskStore(ctx)
	if err != nil {
		return err
	}
	cur, rev, err := store.Get(ctx, id)
	if err != nil {
		return err
	}
	if err := check(cur); err != nil {
		return err
	}
	if err := store.DeleteAt(ctx, id, rev); err != nil {
		return err
	}
	if cur.State == wire.TaskNeedsReview {
		stream, err := c.js.Stream(ctx, wire.StreamTasks)
		if err != nil {
			return fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
		}
		if err := tasks.ForgetReview(ctx, stream, id, 0); err != nil {
			return err
		}
	}
	return c.em.Emit(ctx, wire.Event{Type: wire.EventTaskPurged, TaskID: id, ResourceID: cur.Resource, JobID: cur.Job,
		Message: "record purged by an operator", Payload: audit.Payload(map[string]any{"state": cur.State, "queue": cur.Queue, "type": cur.Type})})
}

// bulk applies op to every task f selects, unless f.DryRun.
func (c *Client) bulk(ctx context.Context, f BulkFilter, op func(context.Context, TaskRecord) error) (BulkResult, error) {
	list, err := c.selectTasks(ctx, f)
	if err != nil {
		return BulkResult{}, err
	}
	res := BulkResult{Matched: len(list), IDs: make([]string, 0, len(list)), DryRun: f.DryRun}
	for _, r := range list {
		res.IDs = append(res.IDs, r.ID)
	}
	if f.DryRun {
		return res, nil
	}
	for _, r := range list {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		octx, cancel := c.bound(context.WithoutCancel(ctx))
		err := op(octx, r)
		cancel()
		if err != nil {
			if res.Failed == nil {
				res.Failed = map[string]string{}
			}
			res.Failed[r.ID] = err.Error()
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrChanged) && !errors.Is(err, ErrNotFound) {
				return res, err
			}
			continue
		}
		res.Done++
	}
	return res, nil
}
