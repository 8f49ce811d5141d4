package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
)

// ErrTaskNotFound is returned for a task id absent from gantry_tasks.
var ErrTaskNotFound = errors.New("task not found")

// ErrTaskExists is returned by TaskStore.Create when the id is taken.
var ErrTaskExists = errors.New("task already exists")

// ErrTaskChanged is returned by TaskStore.Update when the record changed
// since it was read.
var ErrTaskChanged = errors.New("task changed meanwhile")

// TaskStore is the typed store of task state in wire.BucketTasks: one
// wire.TaskRecord per key, the key being the task id.
type TaskStore struct {
	js jetstream.JetStream
	kv jetstream.KeyValue
}

// NewTaskStore opens the tasks bucket, which the broker provisions.
func NewTaskStore(ctx context.Context, js jetstream.JetStream) (*TaskStore, error) {
	b, err := js.KeyValue(ctx, wire.BucketTasks)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", wire.BucketTasks, err)
	}
	return &TaskStore{js: js, kv: b}, nil
}

// KeyValue returns the underlying bucket, for watching.
func (s *TaskStore) KeyValue() jetstream.KeyValue { return s.kv }

// Get returns the record of task id and its revision.
func (s *TaskStore) Get(ctx context.Context, id string) (wire.TaskRecord, uint64, error) {
	if !wire.ValidTaskID(id) {
		return wire.TaskRecord{}, 0, fmt.Errorf("task %q: %w", id, ErrTaskNotFound)
	}
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return wire.TaskRecord{}, 0, fmt.Errorf("task %q: %w", id, ErrTaskNotFound)
	}
	if err != nil {
		return wire.TaskRecord{}, 0, fmt.Errorf("get task %s: %w", id, err)
	}
	var r wire.TaskRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return wire.TaskRecord{}, 0, fmt.Errorf("decode task %s: %w", id, err)
	}
	return r, e.Revision(), nil
}

// Create stores r if no record of its id exists yet.
func (s *TaskStore) Create(ctx context.Context, r wire.TaskRecord) (uint64, error) {
	data, err := encodeTask(r)
	if err != nil {
		return 0, err
	}
	rev, err := s.kv.Create(ctx, r.ID, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("task %q: %w", r.ID, ErrTaskExists)
	}
	if err != nil {
		return 0, fmt.Errorf("create task %s: %w", r.ID, err)
	}
	return rev, nil
}

// Update stores r if its record is still at revision rev.
func (s *TaskStore) Update(ctx context.Context, r wire.TaskRecord, rev uint64) (uint64, error) {
	data, err := encodeTask(r)
	if err != nil {
		return 0, err
	}
	nrev, err := s.kv.Update(ctx, r.ID, data, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("task %q: %w", r.ID, ErrTaskChanged)
	}
	if err != nil {
		return 0, fmt.Errorf("update task %s: %w", r.ID, err)
	}
	return nrev, nil
}

// Put stores r and waits for the bucket's acknowledgement.
func (s *TaskStore) Put(ctx context.Context, r wire.TaskRecord) (uint64, error) {
	data, err := encodeTask(r)
	if err != nil {
		return 0, err
	}
	rev, err := s.kv.Put(ctx, r.ID, data)
	if err != nil {
		return 0, fmt.Errorf("put task %s: %w", r.ID, err)
	}
	return rev, nil
}

// PutMsg returns the put of r as a message on the bucket's subject, for a
// caller that publishes it itself without waiting for each
// acknowledgement. Puts published on one connection are stored in the
// order they were published.
func (s *TaskStore) PutMsg(r wire.TaskRecord) (*nats.Msg, error) {
	data, err := encodeTask(r)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: "$KV." + wire.BucketTasks + "." + r.ID, Data: data}, nil
}

// List returns every task record for which keep returns true (all when
// keep is nil), oldest first.
func (s *TaskStore) List(ctx context.Context, keep func(wire.TaskRecord) bool) ([]wire.TaskRecord, error) {
	w, err := s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	defer func() { _ = w.Stop() }()
	var out []wire.TaskRecord
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("list tasks: %w", ctx.Err())
		case e := <-w.Updates():
			if e == nil {
				sort.Slice(out, func(i, j int) bool {
					if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
						return out[i].CreatedAt.Before(out[j].CreatedAt)
					}
					return out[i].ID < out[j].ID
				})
				return out, nil
			}
			var r wire.TaskRecord
			if err := json.Unmarshal(e.Value(), &r); err != nil {
				continue
			}
			if keep == nil || keep(r) {
				out = append(out, r)
			}
		}
	}
}

// Delete removes the record of task id.
func (s *TaskStore) Delete(ctx context.Context, id string) error {
	if err := s.kv.Delete(ctx, id); err != nil {
		return fmt.Errorf("delete task %s: %w", id, err)
	}
	return nil
}

func encodeTask(r wire.TaskRecord) ([]byte, error) {
	if !wire.ValidTaskID(r.ID) {
		return nil, fmt.Errorf("task id %q: want 1 to %d letters, digits, '-', '_' or '='", r.ID, wire.MaxTaskIDLen)
	}
	data, err := wire.EncodeTaskRecord(&r)
	if err != nil {
		return nil, fmt.Errorf("encode task %s: %w", r.ID, err)
	}
	return data, nil
}
