package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/client"
)

func (a *app) statsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Show the whole system at a glance: queues, resources, routes, jobs, workers, auditd",
		Long: `Stats shows, from any machine, what waits, runs and ended in each queue,
how fast (tasks ended per minute and the p50/p99 wait and run times over the
last hour, as the live workers saw it), who holds which resource and how
busy each was over the last hour, the routes' health, the jobs, the live
workers, the scheduler's leader and how far auditd lags behind.

WAITING is in the stream and not handed to a worker; RUNNING runs on a live
worker; RETRY_WAIT was handed out and waits for a retry or a delay;
NEEDS_REVIEW counts the task records in that state (this reads every task
record). See docs/operations.md. --json prints the same picture as one
document (the client package's Stats).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-stats", func(c *client.Client) error {
				st, err := c.Stats(ctx)
				if err != nil {
					return err
				}
				for _, p := range st.Problems {
					fmt.Fprintf(a.stderr, "gantry: stats: %s\n", p)
				}
				if a.json {
					return a.printJSON(st)
				}
				return a.printStats(st)
			})
		},
	}
}

func (a *app) printStats(st client.Stats) error {
	section := func(title string) { fmt.Fprintf(a.stdout, "\n%s\n", title) }
	fmt.Fprintf(a.stdout, "gantry at %s\n", st.Time.Format(time.RFC3339))

	section("QUEUES (done, rate and percentiles over the last hour)")
	rows := make([][]string, 0, len(st.Queues))
	for _, q := range st.Queues {
		name := q.Queue
		if q.Paused {
			name += " (paused)"
		}
		rows = append(rows, []string{name, strconv.Itoa(q.Waiting), strconv.Itoa(q.Running), strconv.Itoa(q.RetryWait),
			strconv.Itoa(q.NeedsReview), strconv.FormatUint(q.Done, 10), fmt.Sprintf("%.1f", q.ThroughputPerMin),
			seconds(q.WaitP50) + " / " + seconds(q.WaitP99), seconds(q.RunP50) + " / " + seconds(q.RunP99)})
	}
	if err := a.printTable([]string{"QUEUE", "WAITING", "RUNNING", "RETRY_WAIT", "NEEDS_REVIEW", "DONE", "PER_MIN", "WAIT P50/P99", "RUN P50/P99"}, rows); err != nil {
		return err
	}

	section("RESOURCES")
	rows = rows[:0]
	for _, r := range st.Resources {
		util := "-"
		if r.Utilisation != nil {
			util = fmt.Sprintf("%.0f%%", *r.Utilisation*100)
		}
		rows = append(rows, []string{r.ID, string(r.State), dash(r.LeaseOwner), util})
	}
	if err := a.printTable([]string{"RESOURCE", "STATE", "HOLDER", "BUSY (1H)"}, rows); err != nil {
		return err
	}

	section("ROUTES")
	rows = rows[:0]
	for _, r := range st.Routes {
		rows = append(rows, []string{r.ID, string(r.State), fmt.Sprintf("%.0f", r.Score), strconv.Itoa(int(r.LatencyMS)) + "ms", taskTime(r.CooldownUntil)})
	}
	if err := a.printTable([]string{"ROUTE", "STATE", "SCORE", "LATENCY", "COOLDOWN UNTIL"}, rows); err != nil {
		return err
	}

	section("JOBS")
	rows = rows[:0]
	for _, j := range st.Jobs {
		state := "active"
		if j.Paused {
			state = "paused"
		}
		rows = append(rows, []string{j.Name, j.Type, state, taskTime(j.LastFired), taskTime(j.NextFire), strconv.Itoa(len(j.Running))})
	}
	if err := a.printTable([]string{"JOB", "TYPE", "STATE", "LAST FIRED", "NEXT FIRE", "RUNNING"}, rows); err != nil {
		return err
	}

	section("WORKERS")
	if err := a.printWorkers(st.Workers); err != nil {
		return err
	}

	leader := "none"
	if l := st.Scheduler.Leader; l != nil {
		leader = fmt.Sprintf("%s on %s (term %d)", l.ID, l.Host, l.Term)
	}
	stored := "- (auditd does not answer)"
	if st.Audit.Stored != nil {
		stored = strconv.FormatUint(*st.Audit.Stored, 10)
	}
	_, err := fmt.Fprintf(a.stdout, "\nscheduler leader: %s\nauditd: %s stored, %d pending, lag %.1fs\n", leader, stored, st.Audit.Pending, st.Audit.LagSeconds)
	return err
}

// printWorkers prints live workers as a table.
func (a *app) printWorkers(list []client.WorkerInfo) error {
	rows := make([][]string, 0, len(list))
	for _, w := range list {
		rows = append(rows, []string{w.Name, w.Host, strconv.Itoa(w.PID), strings.Join(w.Queues, ","), strconv.Itoa(w.Running),
			dash(w.Version), w.Heartbeat.Format(time.RFC3339)})
	}
	return a.printTable([]string{"WORKER", "HOST", "PID", "QUEUES", "RUNNING", "VERSION", "HEARTBEAT"}, rows)
}

// seconds formats a percentile in seconds, or "-" without one.
func seconds(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'g', 3, 64) + "s"
}
