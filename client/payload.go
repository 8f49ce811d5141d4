package client

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/gantry-dev/gantry/broker/wire"
)

// TaskPayload returns the payload task id was submitted with, as it was
// sent: secrets are not redacted (wire.RedactJSON redacts them for
// display). It is read from the task's message: in the tasks stream while
// the task waits or runs, or kept for a NEEDS_REVIEW task.
// Once the task has ended otherwise its message is gone, and so is the
// payload: ErrNotFound. A task without a payload returns nil.
func (c *Client) TaskPayload(ctx context.Context, id string) (json.RawMessage, error) {
	rec, err := c.Task(ctx, id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	var data []byte
	switch {
	case rec.Message != nil || rec.Kept != "":
		kept, _, err := c.keptMessage(ctx, rec)
		if err != nil {
			return nil, err
		}
		data = kept.Data
	case rec.Seq != 0 && !rec.State.Terminal():
		stream, err := c.js.Stream(ctx, wire.StreamTasks)
		if err != nil {
			return nil, fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
		}
		m, err := stream.GetMsg(ctx, rec.Seq)
		if msgGone(err) {
			return nil, fmt.Errorf("payload of task %s: its message has left the stream: %w", id, ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("payload of task %s: %w", id, err)
		}
		data = m.Data
	default:
		return nil, fmt.Errorf("payload of task %s: not kept once a task is %s: %w", id, rec.State, ErrNotFound)
	}
	var t wire.Task
	if len(data) > 0 {
		if err := json.Unmarshal(data, &t); err != nil {
			return nil, fmt.Errorf("%w: task %s: its message is not a task: %v", ErrInvalid, id, err)
		}
	}
	if t.ID != "" && t.ID != id {
		return nil, fmt.Errorf("payload of task %s: its message has left the stream: %w", id, ErrNotFound)
	}
	return t.Payload, nil
}
