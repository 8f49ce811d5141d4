package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/client"
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
	cmd.AddCommand(a.taskGetCommand(), a.taskLsCommand(), a.taskRetryCommand(), a.taskCancelCommand(), a.taskLogsCommand())
	return cmd
}

// taskOut is a task as --json prints it: the record, with the contract's
// last_error and resource present even when empty (the stored record
// omits them then).
type taskOut struct {
	client.TaskRecord
	LastError string `json:"last_error"`
	Resource  string `json:"resource"`
}

func taskView(r client.TaskRecord) taskOut {
	return taskOut{TaskRecord: r, LastError: r.LastError, Resource: r.Resource}
}

func (a *app) taskGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show a task: state, attempts, last error, output tail, result",
		Args:  exactArgs(1, "ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-task", func(c *client.Client) error {
				rec, err := c.Task(ctx, args[0])
				if err != nil {
					return err
				}
				if a.json {
					return a.printJSON(taskView(rec))
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
			})
		},
	}
}

func (a *app) taskLsCommand() *cobra.Command {
	var (
		f     client.TaskFilter
		state string
		p     pageFlags
	)
	cmd := &cobra.Command{
		Use:   "ls [--state S] [--queue Q] [--type T] [--limit N | --all]",
		Short: "List the newest tasks (100 unless --limit or --all), oldest first",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.check(); err != nil {
				return err
			}
			f.State = client.TaskState(strings.ToUpper(state))
			if n := p.max(); n > 0 {
				// One more than the page tells whether there are more.
				f.Limit = n + 1
			}
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-task", func(c *client.Client) error {
				list, err := c.Tasks(ctx, f)
				if err != nil {
					return err
				}
				if n := p.max(); n > 0 && len(list) > n {
					list = list[1:]
					fmt.Fprintf(a.stderr, "showing the newest %d tasks: --limit N or --all for more\n", n)
				}
				if a.json {
					views := make([]taskOut, 0, len(list))
					for _, r := range list {
						views = append(views, taskView(r))
					}
					return a.printJSON(views)
				}
				rows := make([][]string, 0, len(list))
				for _, r := range list {
					rows = append(rows, []string{r.ID, r.Queue + "/" + r.Type, string(r.State), strconv.Itoa(r.Attempts),
						dash(r.Resource), taskTime(&r.UpdatedAt), dash(truncate(r.LastError, 60))})
				}
				return a.printTable([]string{"ID", "QUEUE/TYPE", "STATE", "ATTEMPTS", "RESOURCE", "UPDATED", "LAST ERROR"}, rows)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&state, "state", "", "only tasks in this state")
	fl.StringVar(&f.Queue, "queue", "", "only tasks of this queue")
	fl.StringVar(&f.Type, "type", "", "only tasks of this type")
	p.register(fl, "tasks (the newest)")
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
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-task", func(c *client.Client) error {
				rec, err := c.RetryTask(ctx, args[0])
				if err != nil {
					return err
				}
				if a.json {
					return a.printJSON(taskView(rec))
				}
				_, err = fmt.Fprintf(a.stdout, "task %s requeued\n", rec.ID)
				return err
			})
		},
	}
}

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
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-task", func(c *client.Client) error {
				got, err := c.CancelTask(ctx, args[0])
				if err != nil {
					return err
				}
				if a.json {
					return a.printJSON(taskView(got.Task))
				}
				_, err = fmt.Fprintf(a.stdout, "task %s cancelled (was %s)\n", got.Task.ID, got.Was)
				return err
			}, client.WithTaskRetention(cfg.Retention))
		},
	}
	cmd.Flags().Var(&retention, "task-retention", "how long the CANCELLED record is kept (as the workers' --task-retention); 0 keeps it")
	return cmd
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
