package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/client"
)

// bulkFlags select the tasks of 'task retry --all' and 'task purge'.
type bulkFlags struct {
	state     string
	queue     string
	typ       string
	olderThan time.Duration
	dryRun    bool
}

func (f *bulkFlags) register(cmd *cobra.Command, withState bool) {
	fl := cmd.Flags()
	if withState {
		fl.StringVar(&f.state, "state", "", "only tasks in this state: SUCCEEDED, NEEDS_REVIEW or CANCELLED (required)")
	}
	fl.StringVar(&f.queue, "queue", "", "only tasks of this queue")
	fl.StringVar(&f.typ, "type", "", "only tasks of this type")
	fl.DurationVar(&f.olderThan, "older-than", 0, "only tasks last updated longer ago than this")
	fl.BoolVar(&f.dryRun, "dry-run", false, "count and list the tasks, change nothing")
}

func (f *bulkFlags) filter() client.BulkFilter {
	return client.BulkFilter{State: client.TaskState(strings.ToUpper(f.state)), Queue: f.queue, Type: f.typ,
		OlderThan: f.olderThan, DryRun: f.dryRun}
}

// printBulk reports what a bulk call did, or would do.
func (a *app) printBulk(verb string, res client.BulkResult) error {
	if a.json {
		return a.printJSON(res)
	}
	if res.DryRun {
		fmt.Fprintf(a.stdout, "%d task(s) would be %s (dry run):\n", res.Matched, verb)
		for _, id := range res.IDs {
			fmt.Fprintln(a.stdout, id)
		}
		return nil
	}
	fmt.Fprintf(a.stdout, "%d of %d task(s) %s\n", res.Done, res.Matched, verb)
	for id, why := range res.Failed {
		fmt.Fprintf(a.stderr, "gantry: task %s: %s\n", id, why)
	}
	if len(res.Failed) > 0 {
		return withCode(exitFailure, fmt.Errorf("%d task(s) not %s", len(res.Failed), verb))
	}
	return nil
}

func (a *app) taskPurgeCommand() *cobra.Command {
	var f bulkFlags
	cmd := &cobra.Command{
		Use:   "purge --state S [--queue Q] [--type T] [--older-than D] [--dry-run]",
		Short: "Remove the records of ended tasks (SUCCEEDED, NEEDS_REVIEW or CANCELLED)",
		Long: `Purge removes the records of the ended tasks it selects from gantry_tasks,
each with a TASK_PURGED audit event; their history stays in the audit store.
--state is required and must be an ended state: a live task is cancelled,
not purged. --dry-run counts and lists them and changes nothing.`,
		Example: `  gantry task purge --state NEEDS_REVIEW --type exec --older-than 720h --dry-run`,
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.state == "" {
				return usageError("task purge: --state is required (SUCCEEDED, NEEDS_REVIEW or CANCELLED)")
			}
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-task", func(c *client.Client) error {
				res, err := c.PurgeTasks(ctx, f.filter())
				if err != nil {
					return err
				}
				return a.printBulk("purged", res)
			})
		},
	}
	f.register(cmd, true)
	return cmd
}
