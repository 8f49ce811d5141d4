package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/tasks"
)

// submitFlags are the flags of 'gantry submit'.
type submitFlags struct {
	id, queue, payload, resource, key, timeout, notBefore string
	maxAttempts, priority                                 int
	wait                                                  bool
	waitTimeout                                           time.Duration
	sql                                                   sqlFlags
}

func (a *app) submitCommand() *cobra.Command {
	var f submitFlags
	cmd := &cobra.Command{
		Use:   "submit TYPE [--queue Q] [--payload JSON|@FILE] [--resource R] [--key K] [--max-attempts N] [--timeout D] [--wait]",
		Short: "Publish a task and print its id; with --wait, wait for its end",
		Long: `Submit publishes a task of TYPE on gantry.tasks.<queue>.<type>, records it as
WAITING in gantry_tasks and prints its id.

--key deduplicates: while a task with the same key is known (24 h), submit
prints that task's id and publishes nothing. --id sets the id, which is
also the message's Nats-Msg-Id, so submitting the same id twice within the
stream's 24 h window runs the task once.

With --wait, submit waits for the task's end and exits 0 if it SUCCEEDED,
1 otherwise (NEEDS_REVIEW, CANCELLED) or when --wait-timeout passes.
Bad input (type, payload, timeout, time) exits 2.`,
		Args: exactArgs(1, "TYPE"),
		RunE: func(cmd *cobra.Command, args []string) error { return a.submit(cmd.Context(), args[0], &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.id, "id", "", "task id (default a new ULID); letters, digits, '-', '_', '='")
	fl.StringVar(&f.queue, "queue", wire.DefaultQueue, "task queue")
	fl.StringVar(&f.payload, "payload", "", "task payload: JSON, or @FILE")
	fl.StringVar(&f.resource, "resource", "", "resource to lease while the task runs")
	fl.StringVar(&f.key, "key", "", "deduplication key: a second task with the same key is not run")
	fl.IntVar(&f.maxAttempts, "max-attempts", 0, "attempts before NEEDS_REVIEW (0: the queue's default)")
	fl.StringVar(&f.timeout, "timeout", "", "timeout of one attempt, e.g. 30s (default: the worker's)")
	fl.IntVar(&f.priority, "priority", 0, "priority: on a queue run with --prioritize, higher starts first")
	fl.StringVar(&f.notBefore, "not-before", "", "do not start before this RFC 3339 time")
	fl.BoolVar(&f.wait, "wait", false, "wait for the task to end; exit 0 if it SUCCEEDED, 1 otherwise")
	fl.DurationVar(&f.waitTimeout, "wait-timeout", 0, "give up waiting after this long (0: wait until the end)")
	f.sql.register(fl)
	return cmd
}

// task builds the task body from the flags.
func (f *submitFlags) task(typ string) (wire.Task, error) {
	if !wire.ValidToken(typ) {
		return wire.Task{}, usageError("type %q: a task type has no spaces, '.', '*' or '>'", typ)
	}
	if !wire.ValidToken(f.queue) {
		return wire.Task{}, usageError("--queue %q: a queue name has no spaces, '.', '*' or '>'", f.queue)
	}
	t := wire.Task{ID: f.id, Resource: f.resource, Priority: f.priority, MaxAttempts: f.maxAttempts, Timeout: f.timeout, Key: f.key}
	if t.ID == "" {
		t.ID = ulid.Make().String()
	} else if !wire.ValidTaskID(t.ID) {
		return wire.Task{}, usageError("--id %q: want 1 to %d letters, digits, '-', '_' or '='", t.ID, wire.MaxTaskIDLen)
	}
	if t.Resource != "" && !wire.ValidToken(t.Resource) {
		return wire.Task{}, usageError("--resource %q: a resource id has no spaces, '.', '*' or '>'", t.Resource)
	}
	if f.maxAttempts < 0 {
		return wire.Task{}, usageError("--max-attempts %d: want 0 or more", f.maxAttempts)
	}
	if f.timeout != "" {
		if d, err := time.ParseDuration(f.timeout); err != nil || d <= 0 {
			return wire.Task{}, usageError("--timeout %q: want a positive duration such as 30s", f.timeout)
		}
	}
	if f.notBefore != "" {
		nb, err := time.Parse(time.RFC3339, f.notBefore)
		if err != nil {
			return wire.Task{}, usageError("--not-before %q: want an RFC 3339 time such as 2026-11-30T12:00:00Z", f.notBefore)
		}
		t.NotBefore = &nb
	}
	payload, err := payloadFlag(f.payload)
	if err != nil {
		return wire.Task{}, err
	}
	if payload, err = f.sql.apply(typ, payload); err != nil {
		return wire.Task{}, err
	}
	t.Payload = payload
	return t, nil
}

// payloadFlag reads a --payload value: JSON, or @FILE holding JSON. An
// empty value is no payload.
func payloadFlag(v string) (json.RawMessage, error) {
	if v == "" {
		return nil, nil
	}
	data := []byte(v)
	if path, ok := strings.CutPrefix(v, "@"); ok {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, usageError("--payload: %v", err)
		}
	}
	if !json.Valid(data) {
		return nil, usageError("--payload: not valid JSON")
	}
	return data, nil
}

func (a *app) submit(ctx context.Context, typ string, f *submitFlags) error {
	t, err := f.task(typ)
	if err != nil {
		return err
	}
	nc, js, err := a.client.connect("gantry-submit")
	if err != nil {
		return err
	}
	defer nc.Close()
	// Submit writes only WAITING records, which never expire.
	store, err := tasks.NewStore(ctx, js, tasks.StoreConfig{})
	if err != nil {
		return err
	}
	id, err := a.publishTask(ctx, nc, js, store, f.queue, typ, t)
	if err != nil {
		return err
	}
	if !f.wait {
		if a.json {
			return a.printJSON(map[string]string{"id": id})
		}
		_, err := fmt.Fprintln(a.stdout, id)
		return err
	}
	if !a.json {
		fmt.Fprintln(a.stdout, id)
	}
	if f.waitTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.waitTimeout)
		defer cancel()
	}
	rec, err := waitTaskEnd(ctx, store, id)
	if err != nil {
		return err
	}
	if a.json {
		if err := a.printJSON(rec); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.stdout, "%s after %d attempt(s)\n", rec.State, rec.Attempts)
	}
	if rec.State != wire.TaskSucceeded {
		return withCode(exitFailure, fmt.Errorf("task %s ended %s: %s", id, rec.State, rec.LastError))
	}
	return nil
}

// publishTask records t as WAITING, emits TASK_CREATED and publishes it. A
// task whose key is already claimed is not published: the claimant's id is
// returned.
func (a *app) publishTask(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, store *tasks.Store, queue, typ string, t wire.Task) (string, error) {
	var cps *tasks.CheckpointStore
	if t.Key != "" {
		var err error
		if cps, err = tasks.NewCheckpointStore(ctx, js); err != nil {
			return "", err
		}
		owner, err := cps.ClaimKey(ctx, t.Key, t.ID, 24*time.Hour)
		if err != nil {
			return "", err
		}
		if owner != t.ID {
			fmt.Fprintf(a.stderr, "gantry: key %q belongs to task %s: not submitted again\n", t.Key, owner)
			return owner, nil
		}
	}
	now := time.Now().UTC()
	rec := wire.TaskRecord{
		TaskInfo:    wire.TaskInfo{ID: t.ID, Type: typ, Queue: queue, State: wire.TaskWaiting, Resource: t.Resource, CreatedAt: now, UpdatedAt: now},
		MaxAttempts: t.MaxAttempts, Priority: t.Priority, Key: t.Key, NotBefore: t.NotBefore,
	}
	rev, err := store.Create(ctx, rec)
	if errors.Is(err, tasks.ErrExists) {
		return "", usageError("task %s exists already: choose another --id", t.ID)
	}
	if err != nil {
		return "", err
	}
	em := audit.NewEmitter(js, "cli", nil)
	if err := em.Emit(ctx, wire.Event{Type: wire.EventTaskCreated, TaskID: t.ID, ResourceID: t.Resource, Message: "task submitted",
		Payload: audit.Payload(map[string]any{"queue": queue, "type": typ})}); err != nil {
		return "", err
	}
	body, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("encode task: %w", err)
	}
	msg := nats.NewMsg(wire.TaskSubject(queue, typ))
	msg.Data = body
	msg.Header.Set(jetstream.MsgIDHeader, t.ID)
	msg.Header.Set(wire.HeaderCreated, "1")
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		// Nothing was submitted: undo the record and the key's claim, so
		// that submitting again runs the task rather than naming this id.
		err = fmt.Errorf("publish task %s: %w (nothing was submitted: try again)", t.ID, err)
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.client.timeout)
		defer cancel()
		if derr := store.Delete(uctx, t.ID); derr != nil {
			err = errors.Join(err, fmt.Errorf("remove the record of task %s: %w", t.ID, derr))
		}
		if cps != nil {
			if rerr := cps.ReleaseKey(uctx, t.Key, t.ID); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		return "", err
	}
	rec.Seq = ack.Sequence
	if _, err := store.Update(ctx, rec, rev); err != nil && !errors.Is(err, tasks.ErrChanged) {
		return "", err
	}
	return t.ID, nil
}

// waitTaskEnd watches task id's record until it is in a terminal state.
func waitTaskEnd(ctx context.Context, store *tasks.Store, id string) (wire.TaskRecord, error) {
	w, err := store.KeyValue().Watch(ctx, id)
	if err != nil {
		return wire.TaskRecord{}, fmt.Errorf("watch task %s: %w", id, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return wire.TaskRecord{}, withCode(exitFailure, fmt.Errorf("task %s: gave up waiting: %w", id, ctx.Err()))
		case e, ok := <-w.Updates():
			if !ok {
				return wire.TaskRecord{}, fmt.Errorf("watch task %s: ended", id)
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var rec wire.TaskRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				continue
			}
			if rec.State.Terminal() {
				return rec, nil
			}
		}
	}
}
