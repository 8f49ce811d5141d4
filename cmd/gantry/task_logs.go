package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
)

func (a *app) taskLogsCommand() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs ID [-f]",
		Short: "Show a task's output: live while it runs, the kept tail after",
		Long: `Logs shows a task's output. For a running task, the lines of its current
attempt so far (its worker keeps the last 4 KiB); for a task that is not
running, the tail its record kept of the last attempt. With -f it then
follows the task's live lines (gantry.output.<id>: an exec task's stdout
and stderr, a remote handler's progress lines), attempt after attempt,
until the task ends, and says how it ended.

Lines are redacted like audit events, cut past 1 KiB, and bounded to 100 a
second per task (a dropped run is counted on stderr). stderr lines go to
stderr, the others to stdout; --json prints one JSON object a line
(task_id, attempt, seq, stream, time, line, cut, dropped). An unknown task
exits 4.`,
		Args: exactArgs(1, "ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return a.withClient(ctx, "gantry-task-logs", func(c *client.Client) error {
				attempt := 0
				for l, err := range c.TaskLogs(ctx, args[0], client.LogOptions{Follow: follow}) {
					if err != nil {
						return err
					}
					if err := a.printOutputLine(l, &attempt); err != nil {
						return err
					}
				}
				if !follow || ctx.Err() != nil {
					return nil
				}
				rec, err := c.Task(ctx, args[0])
				if err != nil {
					return err
				}
				if rec.State.Terminal() && !a.json {
					fmt.Fprintf(a.stderr, "task %s %s after %d attempt(s)\n", rec.ID, rec.State, rec.Attempts)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the live output until the task ends")
	return cmd
}

// printOutputLine prints one line of a task's output: its text on stdout
// (a stdout or tail line) or stderr, what was dropped or cut and where a
// new attempt starts on stderr; with --json, the line as one JSON object.
func (a *app) printOutputLine(l client.OutputLine, attempt *int) error {
	if a.json {
		return a.printJSONLine(l)
	}
	if l.Attempt != 0 && l.Attempt != *attempt {
		if *attempt != 0 {
			fmt.Fprintf(a.stderr, "--- attempt %d ---\n", l.Attempt)
		}
		*attempt = l.Attempt
	}
	if l.Dropped > 0 {
		fmt.Fprintf(a.stderr, "[%d lines dropped: over the live output rate]\n", l.Dropped)
	}
	text := l.Line
	if l.Cut {
		text += " [cut]"
	}
	w := a.stderr
	if l.Stream == wire.OutputStdout || l.Stream == wire.OutputTail || l.Stream == wire.OutputHandler {
		w = a.stdout
	}
	_, err := fmt.Fprintln(w, text)
	return err
}
