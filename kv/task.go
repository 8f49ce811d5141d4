package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

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
	if data, ok := appendTask(nil, &r); ok {
		return data, nil
	}
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode task %s: %w", r.ID, err)
	}
	return data, nil
}

// appendTask appends json.Marshal(r), byte for byte, without reflection:
// a worker writes a record per task, and encoding/json took ~3 % of the
// CPU of the workers' BenchmarkRatio. It reports false, having appended
// nothing, for a record it leaves to json.Marshal: one with a stored
// message, a time json.Marshal refuses, or a string encoding/json would
// change (escapes, HTML characters, non-ASCII).
func appendTask(b []byte, r *wire.TaskRecord) ([]byte, bool) {
	if r.Message != nil || !jsonTime(r.CreatedAt) || !jsonTime(r.UpdatedAt) ||
		(r.NotBefore != nil && !jsonTime(*r.NotBefore)) || (r.RetryAt != nil && !jsonTime(*r.RetryAt)) {
		return b, false
	}
	for _, s := range [...]string{r.ID, r.Type, r.Queue, string(r.State), r.LastError, r.Resource, r.Key, r.Worker, r.Output} {
		if !plainString(s) {
			return b, false
		}
	}
	b = append(b, `{"id":"`...)
	b = append(b, r.ID...)
	b = append(b, `","type":"`...)
	b = append(b, r.Type...)
	b = append(b, `","queue":"`...)
	b = append(b, r.Queue...)
	b = append(b, `","state":"`...)
	b = append(b, r.State...)
	b = append(b, `","attempts":`...)
	b = strconv.AppendInt(b, int64(r.Attempts), 10)
	b = appendString(b, `,"last_error":"`, r.LastError)
	b = appendString(b, `,"resource":"`, r.Resource)
	b = append(b, `,"created_at":"`...)
	b = r.CreatedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","updated_at":"`...)
	b = r.UpdatedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	b = appendInt(b, `,"deliveries":`, r.Deliveries)
	b = appendInt(b, `,"delays":`, r.Delays)
	b = appendInt(b, `,"max_attempts":`, r.MaxAttempts)
	b = appendInt(b, `,"priority":`, r.Priority)
	b = appendString(b, `,"key":"`, r.Key)
	b = appendTime(b, `,"not_before":"`, r.NotBefore)
	b = appendTime(b, `,"retry_at":"`, r.RetryAt)
	if r.Seq != 0 {
		b = append(b, `,"seq":`...)
		b = strconv.AppendUint(b, r.Seq, 10)
	}
	b = appendString(b, `,"worker":"`, r.Worker)
	b = appendString(b, `,"output":"`, r.Output)
	return append(b, '}'), true
}

// appendString appends key and the quoted s, an omitempty string field.
func appendString(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	b = append(b, key...)
	b = append(b, s...)
	return append(b, '"')
}

// appendInt appends key and n, an omitempty int field.
func appendInt(b []byte, key string, n int) []byte {
	if n == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), int64(n), 10)
}

// appendTime appends key and the quoted *t, an omitempty time pointer.
func appendTime(b []byte, key string, t *time.Time) []byte {
	if t == nil {
		return b
	}
	b = t.AppendFormat(append(b, key...), time.RFC3339Nano)
	return append(b, '"')
}

// jsonTime reports whether json.Marshal accepts t (its year in 0-9999).
func jsonTime(t time.Time) bool { return t.Year() >= 0 && t.Year() <= 9999 }

// plainString reports whether encoding/json writes s as it is between
// quotes: printable ASCII without '"', '\\', '<', '>' and '&'.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}
