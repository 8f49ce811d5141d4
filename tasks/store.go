package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// Sentinel errors of the task store, checked with errors.Is; each matches
// its kv counterpart.
var (
	// ErrNotFound is returned for a task id absent from gantry_tasks.
	ErrNotFound = kv.Sentinel("task not found", kv.ErrNotFound)
	// ErrExists is returned by Store.Create when the id is taken.
	ErrExists = kv.Sentinel("task already exists", kv.ErrExists)
	// ErrChanged is returned by Store.Update when the record changed since
	// it was read.
	ErrChanged = kv.Sentinel("task changed meanwhile", kv.ErrChanged)
)

// DefaultRetention is how long the record of a task that ended
// SUCCEEDED or CANCELLED is kept unless told otherwise: as long as the audit
// stream keeps the task's events.
const DefaultRetention = 7 * 24 * time.Hour

// KeepForever as StoreConfig.Retention keeps the records of ended tasks
// until they are deleted.
const KeepForever time.Duration = -1

// StoreConfig tunes a Store.
type StoreConfig struct {
	// Retention is how long the record of a task that ended SUCCEEDED or
	// CANCELLED is kept after it was written: the broker then removes it
	// (the audit store keeps the task's history). The records of live tasks
	// (WAITING, RUNNING, RETRY_WAIT) and of NEEDS_REVIEW tasks, the review
	// queue, never expire. Whole seconds, at least 1 s (the broker's
	// per-message TTL). Defaults to DefaultRetention; KeepForever keeps
	// every record.
	Retention time.Duration
}

// CheckRetention reports whether d can be a StoreConfig.Retention.
func CheckRetention(d time.Duration) error {
	if d == 0 || d == KeepForever || d >= time.Second && d%time.Second == 0 {
		return nil
	}
	return fmt.Errorf("task retention %v: want whole seconds, at least 1s (or keep forever)", d)
}

// Store is the typed store of task state in wire.BucketTasks: one
// wire.TaskRecord per key, the key being the task id. Every write of an
// ended task's record carries the retention as its per-message TTL (the
// Nats-TTL header); any other write carries none, so a record that becomes
// live again stops expiring.
type Store struct {
	js jetstream.JetStream
	kv jetstream.KeyValue
	// retention is the TTL of an ended task's record; 0 for none.
	retention time.Duration
}

// NewStore opens the tasks bucket, which the broker provisions.
func NewStore(ctx context.Context, js jetstream.JetStream, cfg StoreConfig) (*Store, error) {
	if err := CheckRetention(cfg.Retention); err != nil {
		return nil, err
	}
	b, err := kv.Open(ctx, js, wire.BucketTasks)
	if err != nil {
		return nil, err
	}
	s := &Store{js: js, kv: b}
	switch cfg.Retention {
	case KeepForever:
	case 0:
		s.retention = DefaultRetention
	default:
		s.retention = cfg.Retention
	}
	return s, nil
}

// Keeping returns the store on the same bucket that writes every record
// without a TTL: for a record that must outlive its state's retention
// until someone records the task's end.
func (s *Store) Keeping() *Store {
	return &Store{js: s.js, kv: s.kv}
}

// expires reports whether the record of a task in state gets the TTL.
func (s *Store) expires(state wire.TaskState) bool {
	return s.retention > 0 && (state == wire.TaskSucceeded || state == wire.TaskCancelled)
}

// KeyValue returns the underlying bucket, for watching.
func (s *Store) KeyValue() jetstream.KeyValue { return s.kv }

// Get returns the record of task id and its revision. A value that is not
// a task record is a *kv.BadValueError (errors.Is kv.ErrBadValue).
func (s *Store) Get(ctx context.Context, id string) (wire.TaskRecord, uint64, error) {
	if !wire.ValidTaskID(id) {
		return wire.TaskRecord{}, 0, fmt.Errorf("task %q: %w", id, ErrNotFound)
	}
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return wire.TaskRecord{}, 0, fmt.Errorf("task %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return wire.TaskRecord{}, 0, fmt.Errorf("get task %s: %w", id, err)
	}
	var r wire.TaskRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return wire.TaskRecord{}, 0, fmt.Errorf("task %s: %w", id, kv.BadValue(wire.BucketTasks, id, e.Revision(), err))
	}
	return r, e.Revision(), nil
}

// Create stores r if no record of its id exists yet.
func (s *Store) Create(ctx context.Context, r wire.TaskRecord) (uint64, error) {
	data, err := encodeTask(r)
	if err != nil {
		return 0, err
	}
	var opts []jetstream.KVCreateOpt
	if s.expires(r.State) {
		opts = append(opts, jetstream.KeyTTL(s.retention))
	}
	rev, err := s.kv.Create(ctx, r.ID, data, opts...)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("task %q: %w", r.ID, ErrExists)
	}
	if err != nil {
		return 0, fmt.Errorf("create task %s: %w", r.ID, err)
	}
	return rev, nil
}

// Update stores r if its record is still at revision rev.
func (s *Store) Update(ctx context.Context, r wire.TaskRecord, rev uint64) (uint64, error) {
	m, err := s.PutMsg(r)
	if err != nil {
		return 0, err
	}
	ack, err := s.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(rev))
	if kv.Conflict(err) {
		return 0, fmt.Errorf("task %q: %w", r.ID, ErrChanged)
	}
	if err != nil {
		return 0, fmt.Errorf("update task %s: %w", r.ID, err)
	}
	return ack.Sequence, nil
}

// Put stores r and waits for the bucket's acknowledgement.
func (s *Store) Put(ctx context.Context, r wire.TaskRecord) (uint64, error) {
	m, err := s.PutMsg(r)
	if err != nil {
		return 0, err
	}
	ack, err := s.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, fmt.Errorf("put task %s: %w", r.ID, err)
	}
	return ack.Sequence, nil
}

// PutMsg returns the put of r as a message on the bucket's subject, for a
// caller that publishes it itself without waiting for each
// acknowledgement. Puts published on one connection are stored in the
// order they were published.
func (s *Store) PutMsg(r wire.TaskRecord) (*nats.Msg, error) {
	data, err := encodeTask(r)
	if err != nil {
		return nil, err
	}
	var ttl time.Duration
	if s.expires(r.State) {
		ttl = s.retention
	}
	return kv.Msg(wire.BucketTasks, r.ID, data, ttl), nil
}

// List returns every task record for which keep returns true (all when
// keep is nil), oldest first.
func (s *Store) List(ctx context.Context, keep func(wire.TaskRecord) bool) ([]wire.TaskRecord, error) {
	entries, err := kv.Entries(ctx, s.kv, "")
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	var out []wire.TaskRecord
	for _, e := range entries {
		var r wire.TaskRecord
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			continue
		}
		if keep == nil || keep(r) {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Delete removes the record of task id.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := s.kv.Delete(ctx, id); err != nil {
		return fmt.Errorf("delete task %s: %w", id, err)
	}
	return nil
}

// DeleteAt removes the record of task id if it is still at revision rev.
func (s *Store) DeleteAt(ctx context.Context, id string, rev uint64) error {
	err := s.kv.Delete(ctx, id, jetstream.LastRevision(rev))
	if kv.Conflict(err) {
		return fmt.Errorf("task %q: %w", id, ErrChanged)
	}
	if err != nil {
		return fmt.Errorf("delete task %s: %w", id, err)
	}
	return nil
}

func encodeTask(r wire.TaskRecord) ([]byte, error) {
	if !wire.ValidTaskID(r.ID) {
		return nil, fmt.Errorf("task id %q: want 1 to %d letters, digits, '-', '_' or '='", r.ID, wire.MaxTaskIDLen)
	}
	// An error text may quote what a handler printed or received: it is
	// shown by 'gantry task get', so it is stored redacted.
	r.LastError = wire.RedactLine(r.LastError)
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode task %s: %w", r.ID, err)
	}
	return data, nil
}
