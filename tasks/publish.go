package tasks

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// ErrInvalid marks a task that cannot be published as given. It matches
// kv.ErrInvalid.
var ErrInvalid = kv.Sentinel("invalid task", kv.ErrInvalid)

// NewMsg builds the message that puts task t of type typ on queue
// (wire.DefaultQueue when empty): subject gantry.tasks.<queue>.<type>, body
// t as JSON, and Nats-Msg-Id t.ID, on which the stream drops a second
// publish of the same task. It refuses what a worker would reject: a type,
// queue or resource that cannot be a subject token, a missing or malformed
// id, negative max attempts, a timeout that is not a positive duration.
//
// Every task gantry publishes is built here: 'gantry submit' and 'gantry
// task retry' through the client package, and the scheduler's fires, which
// add their own headers and publish asynchronously.
func NewMsg(queue, typ string, t wire.Task) (*nats.Msg, error) {
	if queue == "" {
		queue = wire.DefaultQueue
	}
	switch {
	case !wire.ValidToken(typ):
		return nil, fmt.Errorf("%w: type %q: a task type has no spaces, '.', '*' or '>'", ErrInvalid, typ)
	case !wire.ValidToken(queue):
		return nil, fmt.Errorf("%w: queue %q: a queue name has no spaces, '.', '*' or '>'", ErrInvalid, queue)
	case !wire.ValidTaskID(t.ID):
		return nil, fmt.Errorf("%w: id %q: want 1 to %d letters, digits, '-', '_' or '='", ErrInvalid, t.ID, wire.MaxTaskIDLen)
	case t.Resource != "" && !wire.ValidToken(t.Resource):
		return nil, fmt.Errorf("%w: resource %q: a resource id has no spaces, '.', '*' or '>'", ErrInvalid, t.Resource)
	case t.MaxAttempts < 0:
		return nil, fmt.Errorf("%w: max attempts %d: want 0 (the queue's default) or more", ErrInvalid, t.MaxAttempts)
	}
	if t.Timeout != "" {
		if d, err := time.ParseDuration(t.Timeout); err != nil || d <= 0 {
			return nil, fmt.Errorf("%w: timeout %q: want a positive duration such as 30s", ErrInvalid, t.Timeout)
		}
	}
	data, err := json.Marshal(t)
	if err != nil {
		return nil, fmt.Errorf("encode task %s: %w", t.ID, err)
	}
	msg := nats.NewMsg(wire.TaskSubject(queue, typ))
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, t.ID)
	return msg, nil
}
