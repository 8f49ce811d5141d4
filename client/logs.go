package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/rpc"
)

// OutputLine is one line of a task's output.
type OutputLine = wire.OutputLine

// LogOptions tunes TaskLogs.
type LogOptions struct {
	// Follow keeps yielding the task's live lines, attempt after attempt,
	// until the task ends. Defaults to yielding what there is now.
	Follow bool
}

// outputBuffer bounds the live lines TaskLogs holds for a slow reader;
// past it the broker drops lines for it.
const outputBuffer = 4096

// TaskLogs yields the output of task id. For a running task, the lines
// its worker kept of the attempt so far (asked on
// gantry.control.task.output); for a task that is not running, the
// output its record kept of the last attempt, as lines of stream
// wire.OutputTail. With o.Follow it then yields the task's live lines
// (gantry.output.<id>: an exec task's stdout and stderr, a remote
// handler's progress lines) until the task ends, or ctx does (then it
// stops without an error). Lines are redacted by the worker. An unknown
// task yields an error matching ErrNotFound.
func (c *Client) TaskLogs(ctx context.Context, id string, o LogOptions) iter.Seq2[OutputLine, error] {
	return func(yield func(OutputLine, error) bool) {
		live := make(chan *nats.Msg, outputBuffer)
		sub, err := c.nc.ChanSubscribe(wire.OutputSubject(id), live)
		if err == nil {
			defer func() { _ = sub.Unsubscribe() }()
			err = c.nc.Flush()
		}
		if err != nil {
			yield(OutputLine{}, fmt.Errorf("follow the output of task %s: %w", id, err))
			return
		}
		rec, err := c.Task(ctx, id)
		if err != nil {
			yield(OutputLine{}, err)
			return
		}
		var attempt int
		var seq uint64
		if rec.State.Terminal() {
			for _, l := range tailLines(rec) {
				if !yield(l, nil) {
					return
				}
			}
			return
		}
		reply, running, err := c.runningOutput(ctx, id)
		if err != nil {
			yield(OutputLine{}, err)
			return
		}
		lines := tailLines(rec)
		if running {
			lines, attempt = reply.Lines, reply.Attempt
		}
		for _, l := range lines {
			if l.Attempt == attempt && l.Seq > seq {
				seq = l.Seq
			}
			if !yield(l, nil) {
				return
			}
		}
		if !o.Follow {
			return
		}
		c.followOutput(ctx, id, live, attempt, seq, yield)
	}
}

// followOutput yields the live lines after line seq of attempt until
// task id ends.
func (c *Client) followOutput(ctx context.Context, id string, live chan *nats.Msg, attempt int, seq uint64, yield func(OutputLine, error) bool) {
	store, err := c.taskStore(ctx)
	if err != nil {
		yield(OutputLine{}, err)
		return
	}
	w, err := store.KeyValue().Watch(ctx, id)
	if err != nil {
		yield(OutputLine{}, fmt.Errorf("watch task %s: %w", id, err))
		return
	}
	defer func() { _ = w.Stop() }()
	// emit yields one live line, unless it came before the lines already
	// yielded.
	emit := func(m *nats.Msg) bool {
		var l OutputLine
		if err := json.Unmarshal(m.Data, &l); err != nil {
			return yield(OutputLine{}, fmt.Errorf("output line of task %s is not JSON: %w", id, err))
		}
		if l.Attempt < attempt || (l.Attempt == attempt && l.Seq <= seq) {
			return true
		}
		attempt, seq = l.Attempt, l.Seq
		return yield(l, nil)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-live:
			if !emit(m) {
				return
			}
		case e, ok := <-w.Updates():
			if !ok {
				yield(OutputLine{}, fmt.Errorf("watch task %s: ended", id))
				return
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var rec TaskRecord
			if json.Unmarshal(e.Value(), &rec) != nil || !rec.State.Terminal() {
				continue
			}
			// The worker published its lines before it wrote the end: a
			// round trip to the broker brings in the last of them.
			if err := c.nc.FlushWithContext(ctx); err != nil && ctx.Err() == nil {
				yield(OutputLine{}, fmt.Errorf("follow the output of task %s: %w", id, err))
				return
			}
			for {
				select {
				case m := <-live:
					if !emit(m) {
						return
					}
				default:
					return
				}
			}
		}
	}
}

// runningOutput asks the workers for the lines of task id's running
// attempt, and reports whether the worker running it answered.
func (c *Client) runningOutput(ctx context.Context, id string) (wire.TaskOutputReply, bool, error) {
	actx, cancel := context.WithTimeout(ctx, cancelAnswerWait)
	defer cancel()
	var reply wire.TaskOutputReply
	err := rpc.Request(actx, c.nc, wire.SubjectTaskOutput, wire.TaskOutputRequest{ID: id}, &reply)
	switch {
	case err == nil:
		return reply, true, nil
	case errors.Is(err, rpc.ErrNoResponders), errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return reply, false, nil
	}
	return reply, false, fmt.Errorf("ask for the output of task %s: %w", id, err)
}

// tailLines are the lines of the output rec kept of its last attempt.
func tailLines(rec TaskRecord) []OutputLine {
	text := strings.TrimRight(rec.Output, "\n")
	if text == "" {
		return nil
	}
	var out []OutputLine
	for i, line := range strings.Split(text, "\n") {
		out = append(out, OutputLine{TaskID: rec.ID, Seq: uint64(i + 1), Stream: wire.OutputTail, Time: rec.UpdatedAt, Line: line})
	}
	return out
}
