package tasks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// OpState is what the checkpoint store knows of an operation key.
type OpState int

// The states of an operation key.
const (
	// OpNew: the operation had not started; BeginOp has now marked it.
	OpNew OpState = iota
	// OpDone: the operation finished before.
	OpDone
	// OpInDoubt: the operation started before and never reported an
	// outcome (its worker died): it may or may not have taken effect.
	OpInDoubt
)

const (
	opStarted = "started"
	opDone    = "done"
)

// CheckpointStore is the typed store of wire.BucketCheckpoints: task
// checkpoints (key cp.<task id>), operation keys (op.<task id>.<hash>) and
// task dedupe keys (key.<hash>).
type CheckpointStore struct {
	js jetstream.JetStream
	kv jetstream.KeyValue

	// Quarantine, when set, records the checkpoints that Load finds are
	// not checkpoints (and ignores).
	Quarantine *kv.Quarantine
}

// NewCheckpointStore opens the checkpoints bucket, which the broker
// provisions.
func NewCheckpointStore(ctx context.Context, js jetstream.JetStream) (*CheckpointStore, error) {
	b, err := kv.Open(ctx, js, wire.BucketCheckpoints)
	if err != nil {
		return nil, err
	}
	return &CheckpointStore{js: js, kv: b}, nil
}

func checkpointKey(taskID string) string { return "cp." + taskID }

func opKey(taskID, op string) string { return "op." + taskID + "." + digest(op) }

func dedupeKey(key string) string { return "key." + digest(key) }

func digest(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:16])
}

// Load returns the last checkpoint of task id, or nil if it saved none (or
// what it holds is not a checkpoint).
func (s *CheckpointStore) Load(ctx context.Context, taskID string) (*wire.Checkpoint, error) {
	e, err := s.kv.Get(ctx, checkpointKey(taskID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load checkpoint of %s: %w", taskID, err)
	}
	var cp wire.Checkpoint
	if err := json.Unmarshal(e.Value(), &cp); err != nil {
		// Not a checkpoint: the task starts over rather than failing on it.
		s.Quarantine.Report(kv.BadValue(wire.BucketCheckpoints, e.Key(), e.Revision(), err), "ignored: the task starts without a checkpoint")
		return nil, nil
	}
	return &cp, nil
}

// Save stores cp as the last checkpoint of task id.
func (s *CheckpointStore) Save(ctx context.Context, taskID string, cp wire.Checkpoint) error {
	data, err := json.Marshal(cp)
	if err != nil {
		return fmt.Errorf("encode checkpoint of %s: %w", taskID, err)
	}
	if _, err := s.kv.Put(ctx, checkpointKey(taskID), data); err != nil {
		return fmt.Errorf("save checkpoint of %s: %w", taskID, err)
	}
	return nil
}

// BeginOp marks operation op of task id as started, unless it started
// before: then it reports OpDone or OpInDoubt and marks nothing.
//
// The mark names this call, so that a mark whose reply was lost (a broker
// that died), made again, is recognised as this call's own.
func (s *CheckpointStore) BeginOp(ctx context.Context, taskID, op string) (OpState, error) {
	k := opKey(taskID, op)
	mark := opStarted + " " + ulid.Make().String()
	var st OpState
	err := kv.Retry(ctx, storeTry, func(ctx context.Context) error {
		_, err := s.kv.Create(ctx, k, []byte(mark))
		if err == nil {
			st = OpNew
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
		e, err := s.kv.Get(ctx, k)
		if err != nil {
			return err
		}
		switch string(e.Value()) {
		case mark:
			st = OpNew
		case opDone:
			st = OpDone
		default:
			st = OpInDoubt
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("begin operation %q of %s: %w", op, taskID, err)
	}
	return st, nil
}

// storeTry bounds one try of a call that is made again when its reply is
// lost.
const storeTry = 5 * time.Second

// FinishOp marks operation op of task id as done.
func (s *CheckpointStore) FinishOp(ctx context.Context, taskID, op string) error {
	if _, err := s.kv.Put(ctx, opKey(taskID, op), []byte(opDone)); err != nil {
		return fmt.Errorf("finish operation %q of %s: %w", op, taskID, err)
	}
	return nil
}

// AbortOp forgets operation op of task id, so that it may run again: for an
// operation that failed cleanly, without effect.
func (s *CheckpointStore) AbortOp(ctx context.Context, taskID, op string) error {
	if err := s.kv.Purge(ctx, opKey(taskID, op)); err != nil {
		return fmt.Errorf("abort operation %q of %s: %w", op, taskID, err)
	}
	return nil
}

// Clear removes the checkpoint and every operation key of task id, once the
// task has succeeded.
func (s *CheckpointStore) Clear(ctx context.Context, taskID string) error {
	if err := s.kv.Purge(ctx, checkpointKey(taskID)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("clear checkpoint of %s: %w", taskID, err)
	}
	lister, err := s.kv.ListKeysFiltered(ctx, "op."+taskID+".*")
	if err != nil {
		return fmt.Errorf("list operations of %s: %w", taskID, err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	for _, k := range keys {
		if err := s.kv.Purge(ctx, k); err != nil {
			return fmt.Errorf("clear operation of %s: %w", taskID, err)
		}
	}
	return nil
}

// ClaimKey records that dedupe key belongs to task id for ttl (whole
// seconds, at least 1 s). If another task claimed it first and the claim
// is live, it returns that task's id; otherwise taskID.
func (s *CheckpointStore) ClaimKey(ctx context.Context, key, taskID string, ttl time.Duration) (string, error) {
	k := dedupeKey(key)
	_, err := s.kv.Create(ctx, k, []byte(taskID), jetstream.KeyTTL(ttl))
	if err == nil {
		return taskID, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return "", fmt.Errorf("claim key %q: %w", key, err)
	}
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s.ClaimKey(ctx, key, taskID, ttl)
	}
	if err != nil {
		return "", fmt.Errorf("read key %q: %w", key, err)
	}
	return string(e.Value()), nil
}

// TakeKey moves dedupe key's claim from task from to task to, for ttl, by
// compare-and-swap: for a claim left behind by a submit that failed and
// could not release it (the claiming task has no record). It returns the
// key's owner afterwards: to, or the task that claimed it meanwhile.
func (s *CheckpointStore) TakeKey(ctx context.Context, key, from, to string, ttl time.Duration) (string, error) {
	k := dedupeKey(key)
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s.ClaimKey(ctx, key, to, ttl)
	}
	if err != nil {
		return "", fmt.Errorf("read key %q: %w", key, err)
	}
	if string(e.Value()) != from {
		return string(e.Value()), nil
	}
	_, err = s.js.PublishMsg(ctx, kv.Msg(wire.BucketCheckpoints, k, []byte(to), ttl), jetstream.WithExpectLastSequencePerSubject(e.Revision()))
	if kv.Conflict(err) {
		return s.TakeKey(ctx, key, from, to, ttl)
	}
	if err != nil {
		return "", fmt.Errorf("take key %q: %w", key, err)
	}
	return to, nil
}

// ReleaseKey gives up taskID's claim on dedupe key, so that the key can be
// used again at once: for a task that was claimed but could not be
// published. A claim that belongs to another task is left alone.
func (s *CheckpointStore) ReleaseKey(ctx context.Context, key, taskID string) error {
	k := dedupeKey(key)
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read key %q: %w", key, err)
	}
	if string(e.Value()) != taskID {
		return nil
	}
	err = s.kv.Delete(ctx, k, jetstream.LastRevision(e.Revision()))
	if err != nil && !kv.Conflict(err) {
		return fmt.Errorf("release key %q: %w", key, err)
	}
	return nil
}
