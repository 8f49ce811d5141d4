package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/client"
)

func (a *app) queueCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "List, pause and resume task queues",
		Long: `Queue lists the task queues and pauses or resumes them, from any machine.

A paused queue's waiting tasks stay in the stream, in order, and no worker
starts one until the queue is resumed; tasks already running finish. The
pause is kept in the gantry_queues bucket and applied to the queue's
consumers on the broker, so every worker honours it at once, and after a
restart. Pausing and resuming are audit events (QUEUE_PAUSED,
QUEUE_RESUMED).`,
	}
	cmd.AddCommand(a.queueLsCommand(), a.queuePauseCommand(), a.queueResumeCommand())
	return cmd
}

func (a *app) queueLsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List the queues: paused or not, waiting, running, retry-waiting and NEEDS_REVIEW tasks",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-queue", func(c *client.Client) error {
				st, err := c.Stats(ctx)
				if err != nil {
					return err
				}
				for _, p := range st.Problems {
					fmt.Fprintf(a.stderr, "gantry: queue ls: %s\n", p)
				}
				if a.json {
					return a.printJSON(st.Queues)
				}
				rows := make([][]string, 0, len(st.Queues))
				for _, q := range st.Queues {
					paused := "no"
					if q.Paused {
						paused = "yes"
						if q.PauseReason != "" {
							paused += ": " + q.PauseReason
						}
					}
					rows = append(rows, []string{q.Queue, paused, strconv.Itoa(q.Waiting), strconv.Itoa(q.Running),
						strconv.Itoa(q.RetryWait), strconv.Itoa(q.NeedsReview), strconv.Itoa(len(q.Consumers))})
				}
				return a.printTable([]string{"QUEUE", "PAUSED", "WAITING", "RUNNING", "RETRY_WAIT", "NEEDS_REVIEW", "CONSUMERS"}, rows)
			})
		},
	}
}

func (a *app) queuePauseCommand() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "pause QUEUE [--reason TEXT]",
		Short: "Pause a queue: its tasks wait, nothing is lost",
		Args:  exactArgs(1, "QUEUE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-queue", func(c *client.Client) error {
				st, err := c.PauseQueue(ctx, args[0], reason)
				if err != nil {
					return err
				}
				if a.json {
					return a.printJSON(st)
				}
				_, err = fmt.Fprintf(a.stdout, "queue %s paused\n", st.Queue)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit trail and 'queue ls'")
	return cmd
}

func (a *app) queueResumeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "resume QUEUE",
		Short: "Resume a paused queue: its tasks run again, in order",
		Args:  exactArgs(1, "QUEUE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-queue", func(c *client.Client) error {
				st, err := c.ResumeQueue(ctx, args[0])
				if err != nil {
					return err
				}
				if a.json {
					return a.printJSON(st)
				}
				_, err = fmt.Fprintf(a.stdout, "queue %s resumed\n", st.Queue)
				return err
			})
		},
	}
}

func (a *app) workerLsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List the live workers: host, pid, queues, running tasks, version, last heartbeat",
		Long: `Ls lists the live worker processes, from any machine: each writes its entry
in the gantry_workers bucket every --presence-interval, with a TTL of three
intervals, so a killed worker disappears within that TTL and one that stops
cleanly at once. --json adds the running tasks and each queue's last hour.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-worker", func(c *client.Client) error {
				list, err := c.Workers(ctx)
				if err != nil {
					return err
				}
				if a.json {
					return a.printJSON(list)
				}
				return a.printWorkers(list)
			})
		},
	}
}
