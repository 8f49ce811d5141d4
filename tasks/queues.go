package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// PausedUntil is the PauseUntil of the consumers of a paused queue: a pause
// lasts until an operator resumes the queue.
var PausedUntil = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

// Queues is the typed store of wire.BucketQueues: whether each queue is
// paused. A pause is applied by pausing the queue's consumers on the
// broker (PauseConsumers), so every worker holds its tasks at once; the
// bucket keeps it for consumers created later, which workers create
// paused.
type Queues struct {
	kv jetstream.KeyValue
}

// NewQueues opens the queues bucket, which the broker provisions.
func NewQueues(ctx context.Context, js jetstream.JetStream) (*Queues, error) {
	b, err := kv.Open(ctx, js, wire.BucketQueues)
	if err != nil {
		return nil, err
	}
	return &Queues{kv: b}, nil
}

// KeyValue returns the underlying bucket, for watching.
func (q *Queues) KeyValue() jetstream.KeyValue { return q.kv }

// Get returns the state of queue; a queue never paused is not paused.
func (q *Queues) Get(ctx context.Context, queue string) (wire.QueueState, error) {
	e, err := q.kv.Get(ctx, queue)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return wire.QueueState{Queue: queue}, nil
	}
	if err != nil {
		return wire.QueueState{}, fmt.Errorf("get queue %s: %w", queue, err)
	}
	return DecodeQueueState(e.Key(), e.Value()), nil
}

// DecodeQueueState reads the value of queue's key. A value that is not a
// QueueState counts as not paused: a bad write never holds tasks back.
func DecodeQueueState(queue string, data []byte) wire.QueueState {
	var st wire.QueueState
	if err := json.Unmarshal(data, &st); err != nil {
		return wire.QueueState{Queue: queue}
	}
	st.Queue = queue
	return st
}

// List returns the state of every queue ever paused, by name.
func (q *Queues) List(ctx context.Context) ([]wire.QueueState, error) {
	out, err := kv.List(ctx, q.kv, func(e jetstream.KeyValueEntry) (wire.QueueState, bool) {
		return DecodeQueueState(e.Key(), e.Value()), true
	}, func(a, b wire.QueueState) int { return strings.Compare(a.Queue, b.Queue) })
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	return out, nil
}

// Set stores st.
func (q *Queues) Set(ctx context.Context, st wire.QueueState) error {
	if !wire.ValidToken(st.Queue) {
		return fmt.Errorf("%w: queue %q: a queue name has no spaces, '.', '*' or '>'", kv.ErrInvalid, st.Queue)
	}
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode queue %s: %w", st.Queue, err)
	}
	if _, err := q.kv.Put(ctx, st.Queue, data); err != nil {
		return fmt.Errorf("put queue %s: %w", st.Queue, err)
	}
	return nil
}

// QueueOfConsumer returns the queue whose tasks a consumer with cfg takes
// (its filter is under gantry.tasks.<queue>. or gantry.ready.<queue>.),
// or "".
func QueueOfConsumer(cfg jetstream.ConsumerConfig) string {
	for _, f := range append([]string{cfg.FilterSubject}, cfg.FilterSubjects...) {
		for _, prefix := range []string{wire.SubjectTasksPrefix + ".", wire.SubjectReadyPrefix + "."} {
			if rest, ok := strings.CutPrefix(f, prefix); ok {
				if q, _, ok := strings.Cut(rest, "."); ok && wire.ValidToken(q) {
					return q
				}
			}
		}
	}
	return ""
}

// PauseConsumers pauses (or resumes) every consumer of the tasks stream
// that takes queue's tasks, and returns their names. Pausing a paused
// consumer, or resuming a running one, changes nothing.
func PauseConsumers(ctx context.Context, js jetstream.JetStream, queue string, paused bool) ([]string, error) {
	stream, err := js.Stream(ctx, wire.StreamTasks)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
	}
	var names []string
	lister := stream.ListConsumers(ctx)
	for info := range lister.Info() {
		if QueueOfConsumer(info.Config) == queue {
			names = append(names, info.Name)
		}
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("list consumers: %w", err)
	}
	for _, name := range names {
		until := PausedUntil
		if !paused {
			// The broker (2.15) does not wake a consumer resumed through
			// its API: its waiting pull requests are served only when
			// the next message or pull comes. A pause that ends in a
			// moment, by the broker's clock, does wake it when it ends.
			cons, err := stream.Consumer(ctx, name)
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				continue
			}
			if err != nil {
				return names, fmt.Errorf("resume consumer %s: %w", name, err)
			}
			until = cons.CachedInfo().TimeStamp.Add(resumeKick)
		}
		if _, err := js.PauseConsumer(ctx, wire.StreamTasks, name, until); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return names, fmt.Errorf("pause consumer %s: %w", name, err)
		}
	}
	return names, nil
}

// resumeKick is how long after a resume, by the broker's clock, a resumed
// consumer's last pause ends and wakes it: long enough for the request to
// land first.
const resumeKick = 500 * time.Millisecond
