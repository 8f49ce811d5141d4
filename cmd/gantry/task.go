package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/tasks"
)

func (a *app) taskCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Inspect, retry and cancel tasks",
		Long: `Task reads and changes the task records of the gantry_tasks bucket, from any
machine. States: WAITING, RUNNING, RETRY_WAIT, SUCCEEDED, NEEDS_REVIEW,
CANCELLED. Attempts are the runs of the task (the broker's delivery count,
less the deliveries that only delayed it). See docs/tasks.md.`,
	}
	cmd.AddCommand(a.taskGetCommand(), a.taskLsCommand(), a.taskRetryCommand(), a.taskCancelCommand())
	return cmd
}

// taskStore connects and opens the tasks bucket.
func (a *app) taskStore(ctx context.Context, cfg tasks.StoreConfig) (*nats.Conn, jetstream.JetStream, *tasks.Store, error) {
	nc, js, err := a.client.connect("gantry-task")
	if err != nil {
		return nil, nil, nil, err
	}
	store, err := tasks.NewStore(ctx, js, cfg)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	return nc, js, store, nil
}

// taskGet reads task id, mapping a missing one to exit 4.
func taskGet(ctx context.Context, store *tasks.Store, id string) (wire.TaskRecord, uint64, error) {
	rec, rev, err := store.Get(ctx, id)
	if errors.Is(err, tasks.ErrNotFound) {
		return rec, 0, withCode(exitNotFound, fmt.Errorf("task %s not found", id))
	}
	return rec, rev, err
}

func (a *app) taskGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show a task: state, attempts, last error, output tail, result",
		Args:  exactArgs(1, "ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			nc, _, store, err := a.taskStore(ctx, tasks.StoreConfig{})
			if err != nil {
				return err
			}
			defer nc.Close()
			rec, _, err := taskGet(ctx, store, args[0])
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(rec)
			}
			rows := [][]string{
				{"id", rec.ID}, {"type", rec.Type}, {"queue", rec.Queue}, {"state", string(rec.State)},
				{"attempts", strconv.Itoa(rec.Attempts)}, {"max_attempts", strconv.Itoa(rec.MaxAttempts)},
				{"delays", strconv.Itoa(rec.Delays)}, {"resource", dash(rec.Resource)}, {"key", dash(rec.Key)},
				{"worker", dash(rec.Worker)}, {"created_at", taskTime(&rec.CreatedAt)}, {"updated_at", taskTime(&rec.UpdatedAt)},
				{"not_before", taskTime(rec.NotBefore)}, {"retry_at", taskTime(rec.RetryAt)}, {"last_error", dash(rec.LastError)},
			}
			if err := a.printTable([]string{"FIELD", "VALUE"}, rows); err != nil {
				return err
			}
			if rec.Output != "" {
				fmt.Fprintf(a.stdout, "\noutput (tail):\n%s\n", strings.TrimRight(rec.Output, "\n"))
			}
			return a.printResult(rec)
		},
	}
}

func (a *app) taskLsCommand() *cobra.Command {
	var state, queue, typ string
	var limit int
	cmd := &cobra.Command{
		Use:   "ls [--state S] [--queue Q] [--type T] [--limit N]",
		Short: "List tasks, oldest first",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			want := wire.TaskState(strings.ToUpper(state))
			switch want {
			case "", wire.TaskWaiting, wire.TaskRunning, wire.TaskRetryWait, wire.TaskSucceeded, wire.TaskNeedsReview, wire.TaskCancelled:
			default:
				return usageError("--state %q: want WAITING, RUNNING, RETRY_WAIT, SUCCEEDED, NEEDS_REVIEW or CANCELLED", state)
			}
			ctx := cmd.Context()
			nc, _, store, err := a.taskStore(ctx, tasks.StoreConfig{})
			if err != nil {
				return err
			}
			defer nc.Close()
			list, err := store.List(ctx, func(r wire.TaskRecord) bool {
				return (want == "" || r.State == want) && (queue == "" || r.Queue == queue) && (typ == "" || r.Type == typ)
			})
			if err != nil {
				return err
			}
			if limit > 0 && len(list) > limit {
				list = list[len(list)-limit:]
			}
			if a.json {
				if list == nil {
					list = []wire.TaskRecord{}
				}
				return a.printJSON(list)
			}
			rows := make([][]string, 0, len(list))
			for _, r := range list {
				rows = append(rows, []string{r.ID, r.Queue + "/" + r.Type, string(r.State), strconv.Itoa(r.Attempts),
					dash(r.Resource), taskTime(&r.UpdatedAt), dash(truncate(r.LastError, 60))})
			}
			return a.printTable([]string{"ID", "QUEUE/TYPE", "STATE", "ATTEMPTS", "RESOURCE", "UPDATED", "LAST ERROR"}, rows)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&state, "state", "", "only tasks in this state")
	fl.StringVar(&queue, "queue", "", "only tasks of this queue")
	fl.StringVar(&typ, "type", "", "only tasks of this type")
	fl.IntVar(&limit, "limit", 0, "only the newest N (0: all)")
	return cmd
}

func (a *app) taskRetryCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "retry ID",
		Short: "Run a NEEDS_REVIEW task again, with a fresh set of attempts",
		Long: `Retry publishes a NEEDS_REVIEW task's message again (kept in its record when
it left the stream) and sets it WAITING with its attempts reset. A task in
another state exits 2; an unknown one exits 4.`,
		Args: exactArgs(1, "ID"),
		RunE: func(cmd *cobra.Command, args []string) error { return a.taskRetry(cmd.Context(), args[0]) },
	}
}

func (a *app) taskRetry(ctx context.Context, id string) error {
	// Retry writes WAITING (and NEEDS_REVIEW back on failure): no TTL, so
	// the record no longer expires.
	nc, js, store, err := a.taskStore(ctx, tasks.StoreConfig{})
	if err != nil {
		return err
	}
	defer nc.Close()
	rec, rev, err := taskGet(ctx, store, id)
	if err != nil {
		return err
	}
	if rec.State != wire.TaskNeedsReview {
		return usageError("task %s is %s: only a NEEDS_REVIEW task can be retried", id, rec.State)
	}
	if rec.Message == nil {
		return usageError("task %s: its message was not kept; publish it again", id)
	}
	var body map[string]json.RawMessage
	if len(rec.Message.Data) > 0 {
		if err := json.Unmarshal(rec.Message.Data, &body); err != nil {
			return usageError("task %s was rejected as malformed (%s): publish a corrected task instead", id, rec.LastError)
		}
	}
	if body == nil {
		body = map[string]json.RawMessage{}
	}
	body["id"], _ = json.Marshal(id)
	data, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode task: %w", err)
	}
	msg := nats.NewMsg(rec.Message.Subject)
	for k, v := range rec.Message.Header {
		if k != jetstream.MsgIDHeader {
			msg.Header[k] = v
		}
	}
	msg.Header.Set(wire.HeaderCreated, "1")
	msg.Data = data

	orig, last := rec, rec.LastError
	rec.State, rec.Attempts, rec.Deliveries, rec.Delays = wire.TaskWaiting, 0, 0, 0
	rec.Message, rec.RetryAt, rec.Output = nil, nil, ""
	rec.LastError = "retried by an operator; before: " + last
	rec.UpdatedAt = time.Now().UTC()
	rev, err = store.Update(ctx, rec, rev)
	if errors.Is(err, tasks.ErrChanged) {
		return withCode(exitFailure, fmt.Errorf("task %s changed meanwhile: try again", id))
	}
	if err != nil {
		return err
	}
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		// Not requeued: put the record back as it was, message included,
		// rather than leave a WAITING task that nothing will run.
		err = fmt.Errorf("publish task %s: %w", id, err)
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.client.timeout)
		defer cancel()
		orig.UpdatedAt = time.Now().UTC()
		if _, rerr := store.Update(uctx, orig, rev); rerr != nil {
			return errors.Join(err, fmt.Errorf("put task %s back to %s: %w", id, orig.State, rerr))
		}
		return fmt.Errorf("%w (task %s is %s again: retry it)", err, id, orig.State)
	}
	rec.Seq = ack.Sequence
	if _, err := store.Update(ctx, rec, rev); err != nil && !errors.Is(err, tasks.ErrChanged) {
		return err
	}
	em := audit.NewEmitter(js, "cli", nil)
	if err := em.Emit(ctx, wire.Event{Type: wire.EventRetryScheduled, TaskID: id, ResourceID: rec.Resource,
		Message: "retried by an operator", Payload: audit.Payload(map[string]any{"class": "operator", "seq": ack.Sequence})}); err != nil {
		return err
	}
	if a.json {
		return a.printJSON(rec)
	}
	_, err = fmt.Fprintf(a.stdout, "task %s requeued\n", id)
	return err
}

// cancelAnswerWait is how long `gantry task cancel` waits for the worker
// running a task to answer.
const cancelAnswerWait = time.Second

func (a *app) taskCancelCommand() *cobra.Command {
	retention := retentionValue(tasks.DefaultRetention)
	cmd := &cobra.Command{
		Use:   "cancel ID [--task-retention D]",
		Short: "Cancel a task: a waiting one is removed, a running one is stopped",
		Long: `Cancel sets a task CANCELLED. A task waiting in the stream (WAITING,
RETRY_WAIT) is removed from it; a running one is stopped by its worker (an
exec task's whole process tree is killed), which records the end with its
own --task-retention. A task that has ended exits 2; an unknown one exits 4.`,
		Args: exactArgs(1, "ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := taskRetention(retention)
			if err != nil {
				return err
			}
			return a.taskCancel(cmd.Context(), args[0], cfg)
		},
	}
	cmd.Flags().Var(&retention, "task-retention", "how long the CANCELLED record is kept (as the workers' --task-retention); 0 keeps it")
	return cmd
}

func (a *app) taskCancel(ctx context.Context, id string, cfg tasks.StoreConfig) error {
	nc, js, store, err := a.taskStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	rec, rev, err := taskGet(ctx, store, id)
	if err != nil {
		return err
	}
	if rec.State.Terminal() {
		return usageError("task %s has ended (%s): nothing to cancel", id, rec.State)
	}
	was := rec.State
	rec.State = wire.TaskCancelled
	rec.RetryAt = nil
	rec.UpdatedAt = time.Now().UTC()
	// Until the end is recorded, the CANCELLED record must not expire: a
	// task a sorter already moved to gantry.ready (its message is not
	// rec.Seq) is found cancelled by its worker only through it, however
	// long it waits. Whoever records the end writes it with the retention.
	if rev, err = store.Keeping().Update(ctx, rec, rev); errors.Is(err, tasks.ErrChanged) {
		return withCode(exitFailure, fmt.Errorf("task %s changed meanwhile: try again", id))
	} else if err != nil {
		return err
	}
	// A running task: its worker stops it, answers, and records the end. The
	// record may still say WAITING for a task that started an instant ago,
	// so the answer, not the record, decides who finishes the task.
	running := was == wire.TaskRunning
	if _, err := nc.Request(wire.SubjectTaskCancel, []byte(id), cancelAnswerWait); err == nil {
		running = true
	} else if !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("announce cancel: %w", err)
	}
	removed := false
	if rec.Seq != 0 && !running {
		stream, err := js.Stream(ctx, wire.StreamTasks)
		if err != nil {
			return fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
		}
		err = stream.DeleteMsg(ctx, rec.Seq)
		removed = err == nil
		if err != nil && !msgGone(err) {
			return fmt.Errorf("remove task message: %w", err)
		}
	}
	em := audit.NewEmitter(js, "cli", nil)
	if err := em.Emit(ctx, wire.Event{Type: wire.EventTaskCancelled, TaskID: id, ResourceID: rec.Resource,
		Message: "cancelled by an operator", Payload: audit.Payload(map[string]any{"was": was})}); err != nil {
		return err
	}
	if removed {
		if _, err := store.Update(ctx, rec, rev); err != nil && !errors.Is(err, tasks.ErrChanged) {
			return err
		}
		if err := em.Emit(ctx, wire.Event{Type: wire.EventTaskFinished, TaskID: id, ResourceID: rec.Resource, Message: "task cancelled",
			Payload: audit.Payload(map[string]any{"state": wire.TaskCancelled, "attempts": rec.Attempts})}); err != nil {
			return err
		}
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	if a.json {
		return a.printJSON(rec)
	}
	_, err = fmt.Fprintf(a.stdout, "task %s cancelled (was %s)\n", id, was)
	return err
}

func taskTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// msgGone reports whether a message delete failed because the message is no
// longer in the stream: its worker took it (and records its end). The server
// says so either as "message not found" or, for a delete, as its generic
// delete failure (10057) with the text "no message found".
func msgGone(err error) bool {
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound ||
			apiErr.ErrorCode == errCodeSequenceNotFound ||
			apiErr.ErrorCode == errCodeMsgDeleteFailed && strings.Contains(apiErr.Description, "no message found")
	}
	// Stream.DeleteMsg passes the server's error on as text only.
	if errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		text := err.Error()
		return strings.Contains(text, fmt.Sprintf("err_code=%d", errCodeSequenceNotFound)) || strings.Contains(text, "no message found")
	}
	return false
}

// nats-server's error codes for a message that is not there:
// JSStreamMsgDeleteFailedF, and JSSequenceNotFoundErrF for a sequence
// below the stream's first (a work queue's consumed messages).
const (
	errCodeMsgDeleteFailed  jetstream.ErrorCode = 10057
	errCodeSequenceNotFound jetstream.ErrorCode = 10043
)
