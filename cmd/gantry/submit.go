package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/logging"
)

// submitFlags are the flags of 'gantry submit'.
type submitFlags struct {
	id, queue, payload, resource, key, timeout, notBefore string
	maxAttempts, priority                                 int
	wait, publishOnly                                     bool
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
1 otherwise (NEEDS_REVIEW, CANCELLED), and 5 when --wait-timeout passes
first (the task may still finish). Bad input (type, payload, timeout,
time) exits 2.

--publish-only only publishes the task, as any NATS client may (the role
submitter allows no more): the worker that takes it records it and checks
its key.`,
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
	fl.DurationVar(&f.waitTimeout, "wait-timeout", 0, "give up waiting after this long, exit 5 (0: wait until the end)")
	f.sql.register(fl)
	fl.BoolVar(&f.publishOnly, "publish-only", false, "only publish the task (no record, no key check until a worker takes it): what the submitter role allows")
	return cmd
}

// task reads the flags into the task to submit; the client checks the
// rest.
func (f *submitFlags) task(typ string) (client.Task, error) {
	t := client.Task{Type: typ, Queue: f.queue, ID: f.id, Resource: f.resource, Priority: f.priority, MaxAttempts: f.maxAttempts, Key: f.key}
	if f.timeout != "" {
		d, err := time.ParseDuration(f.timeout)
		if err != nil || d <= 0 {
			return client.Task{}, usageError("--timeout %q: want a positive duration such as 30s", f.timeout)
		}
		t.Timeout = d
	}
	if f.notBefore != "" {
		nb, err := time.Parse(time.RFC3339, f.notBefore)
		if err != nil {
			return client.Task{}, usageError("--not-before %q: want an RFC 3339 time such as 2026-11-30T12:00:00Z", f.notBefore)
		}
		t.NotBefore = nb
	}
	payload, err := payloadFlag(f.payload)
	if err != nil {
		return client.Task{}, err
	}
	if payload, err = f.sql.apply(typ, payload); err != nil {
		return client.Task{}, err
	}
	if payload != nil {
		t.Payload = payload
	}
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
	return a.withClient(ctx, "gantry-submit", func(c *client.Client) error {
		submit := c.Submit
		if f.publishOnly {
			submit = c.Publish
		}
		sub, err := submit(ctx, t)
		if err != nil {
			return err
		}
		if sub.Duplicate {
			fmt.Fprintf(a.stderr, "gantry: key %q belongs to task %s: not submitted again\n", t.Key, sub.ID)
		}
		if !f.wait {
			if a.json {
				return a.printJSON(map[string]string{"id": sub.ID})
			}
			_, err := fmt.Fprintln(a.stdout, sub.ID)
			return err
		}
		if !a.json {
			fmt.Fprintln(a.stdout, sub.ID)
		}
		if f.waitTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, f.waitTimeout)
			defer cancel()
		}
		// On a terminal, a line follows the task's state; piped, nothing.
		prog := startProgress(a.stderr, !a.json && logging.IsTerminal(a.stderr), sub.ID, 100*time.Millisecond)
		rec, err := c.Wait(ctx, sub.ID, client.OnUpdate(prog.update))
		prog.end()
		if errors.Is(err, client.ErrGaveUp) && f.waitTimeout > 0 {
			return withCode(exitWaitTimeout, fmt.Errorf("task %s has not ended within --wait-timeout %v; it goes on ('gantry task get %s')", sub.ID, f.waitTimeout, sub.ID))
		}
		if err != nil {
			return err
		}
		if a.json {
			if err := a.printJSON(taskView(rec)); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(a.stdout, "%s after %d attempt(s)\n", rec.State, rec.Attempts)
		}
		if rec.State != wire.TaskSucceeded {
			return fmt.Errorf("task %s ended %s: %s", sub.ID, rec.State, rec.LastError)
		}
		return nil
	})
}
