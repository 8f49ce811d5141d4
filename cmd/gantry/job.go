package main

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/jobs"
)

func (a *app) jobCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "job",
		Short: "Add, list, pause, trigger and inspect scheduled jobs",
		Long: `Jobs live in the gantry_jobs bucket, one per name. Every scheduler watches
the bucket, so an add, change, pause, resume or removal takes effect at once;
a paused or removed job does not fire again, not even once.

A job fires a task of its --type on gantry.tasks.<queue>.<type> with the id
"<job>-<planned unix seconds>". Runs are kept in the gantry_scheduler bucket
('gantry job runs NAME'); fires, skips (with the reason) and misses are audit
events JOB_FIRED, JOB_SKIPPED and JOB_MISSED. See docs/scheduler.md.`,
	}
	cmd.AddCommand(a.jobAddCommand(), a.jobLsCommand(), a.jobGetCommand(), a.jobRmCommand(),
		a.jobPauseCommand(true), a.jobPauseCommand(false), a.jobTriggerCommand(), a.jobRunsCommand(),
		a.jobNextCommand())
	return cmd
}

// jobFlags are the definition flags of 'gantry job add'.
type jobFlags struct {
	typ, queue, payload, cron, every, at, timezone string
	windows                                        []string
	jitter, misfire, overlap, timeout, resource    string
	cooldown, description                          string
	misfireCap, maxPerHour, priority, maxAttempts  int
	paused                                         bool
}

func (a *app) jobAddCommand() *cobra.Command {
	var f jobFlags
	cmd := &cobra.Command{
		Use:   "add NAME --type T (--cron EXPR | --every D | --at TIME) [flags]",
		Short: "Add a job, or change the job of that name",
		Long: `Add stores a job. A job of the same name is replaced by the new definition,
keeping its paused state and creation time (use 'gantry job pause|resume'
for those).

Triggers (exactly one):
  --cron EXPR   5 fields (minute hour day month weekday), or 6 with seconds
                first, or @hourly/@daily/@weekly/@monthly; read in --timezone
  --every D     every D (whole seconds), at multiples of D since 1970-01-01 UTC
  --at TIME     once: RFC 3339, or "2006-01-02 15:04" in --timezone

Policies:
  --window HH:MM-HH:MM   allowed time of day in --timezone (repeatable; may
                         wrap midnight); a fire outside is skipped
  --jitter D             delay each fire by a fixed-per-fire amount in [0, D)
  --misfire P            after downtime: skip (none), once (the latest missed,
                         default) or all (up to --misfire-cap, default 100)
  --overlap P            while the previous run is unfinished: allow
                         (default), forbid (skip) or replace (cancel it, fire)
  --max-per-hour N       skip fires beyond N in any hour
  --cooldown D           after a run on --resource ends, no job on that
                         resource fires for D
A bad definition exits 2 and is recorded as a CONFIG_REJECTED audit event.`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error { return a.jobAdd(cmd.Context(), args[0], &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.typ, "type", "", "task type to fire (required)")
	fl.StringVar(&f.queue, "queue", wire.DefaultQueue, "task queue")
	fl.StringVar(&f.payload, "payload", "", "task payload: JSON, or @FILE")
	fl.StringVar(&f.cron, "cron", "", "cron expression (seconds optional)")
	fl.StringVar(&f.every, "every", "", "interval, e.g. 30s, 5m")
	fl.StringVar(&f.at, "at", "", "one-shot time: RFC 3339 or 2006-01-02 15:04")
	fl.StringVar(&f.timezone, "timezone", "", "IANA time zone of --cron, --at and --window (default UTC)")
	fl.StringArrayVar(&f.windows, "window", nil, "allowed time of day HH:MM-HH:MM (repeatable)")
	fl.StringVar(&f.jitter, "jitter", "", "random delay bound of each fire, e.g. 10s")
	fl.StringVar(&f.misfire, "misfire", "", "misfire policy: skip, once or all (default once)")
	fl.IntVar(&f.misfireCap, "misfire-cap", 0, "most missed fires run under --misfire all (default 100)")
	fl.StringVar(&f.overlap, "overlap", "", "overlap policy: allow, forbid or replace (default allow)")
	fl.IntVar(&f.maxPerHour, "max-per-hour", 0, "most fires in any hour (0: no cap)")
	fl.IntVar(&f.priority, "priority", 0, "task priority; among jobs due together, higher fires first")
	fl.StringVar(&f.timeout, "timeout", "", "task timeout per attempt, e.g. 30s")
	fl.IntVar(&f.maxAttempts, "max-attempts", 0, "task max attempts (0: the queue's default)")
	fl.StringVar(&f.resource, "resource", "", "resource the task leases")
	fl.StringVar(&f.cooldown, "cooldown", "", "pause for jobs on --resource after a run on it ends, e.g. 1m")
	fl.StringVar(&f.description, "description", "", "what the job is for")
	fl.BoolVar(&f.paused, "paused", false, "add the job paused")
	return cmd
}

func (a *app) jobAdd(ctx context.Context, name string, f *jobFlags) error {
	j, err := f.job(name)
	if err != nil {
		return err
	}
	if verr := jobs.Validate(j); verr != nil {
		// Bad input exits 2 whether or not the broker can be reached; when
		// it can, the client records the refusal (CONFIG_REJECTED).
		_ = a.withClient(ctx, "gantry-job", func(c *client.Client) error {
			_, err := c.AddJob(ctx, j)
			return err
		})
		return usageError("%v", verr)
	}
	return a.withClient(ctx, "gantry-job", func(c *client.Client) error {
		info, err := c.AddJob(ctx, j)
		if err != nil {
			return err
		}
		if a.json {
			return a.printJSON(info)
		}
		fmt.Fprintf(a.stdout, "job %s saved; next fire %s\n", name, jobWhenp(info.NextFire))
		return nil
	})
}

// job builds the definition the flags describe; the client checks it (and
// records a bad one as a CONFIG_REJECTED event).
func (f *jobFlags) job(name string) (wire.Job, error) {
	if f.typ == "" {
		return wire.Job{}, usageError("--type is required")
	}
	j := wire.Job{
		Name: name, Type: f.typ, Queue: f.queue, Cron: f.cron, Every: f.every, Timezone: f.timezone,
		Windows: f.windows, Jitter: f.jitter, Misfire: wire.MisfirePolicy(f.misfire), MisfireCap: f.misfireCap,
		Overlap: wire.OverlapPolicy(f.overlap), MaxPerHour: f.maxPerHour, Priority: f.priority,
		Timeout: f.timeout, MaxAttempts: f.maxAttempts, Resource: f.resource, Cooldown: f.cooldown,
		Description: f.description, Paused: f.paused, Source: wire.JobSourceCLI,
	}
	payload, err := payloadFlag(f.payload)
	if err != nil {
		return wire.Job{}, err
	}
	j.Payload = payload
	if f.at != "" {
		at, err := jobs.ParseAt(f.at, f.timezone)
		if err != nil {
			return wire.Job{}, usageError("%v", err)
		}
		if !at.After(time.Now()) {
			return wire.Job{}, usageError("--at %s is in the past: a one-shot job would never fire", at.Format(time.RFC3339))
		}
		j.At = &at
	}
	return j, nil
}

func jobTrigger(j wire.Job) string {
	switch {
	case j.Cron != "":
		return "cron " + j.Cron
	case j.Every != "":
		return "every " + j.Every
	case j.At != nil:
		return "at " + j.At.Format(time.RFC3339)
	}
	return "-"
}

func jobWhen(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.RFC3339)
}

func jobWhenp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return jobWhen(*t)
}

// jobZoned shows t in the job's time zone, where its windows and cron are
// read.
func jobZoned(t *time.Time, tz string) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		loc = time.UTC
	}
	return t.In(loc).Format(time.RFC3339)
}

// jobStatus is a job's status column: active, paused, or rejected with
// the reason.
func jobStatus(v client.JobInfo) string {
	if v.Status == client.JobRejected {
		return truncate(v.Status+": "+v.Reason, 70)
	}
	return v.Status
}

func (a *app) jobLsCommand() *cobra.Command {
	var p pageFlags
	cmd := &cobra.Command{
		Use:   "ls [--limit N | --all]",
		Short: "List the jobs with their trigger, status and next fire",
		Long: `Ls lists the jobs of gantry_jobs. STATUS is what the schedulers make of a
job: active, paused, or rejected with the reason (a definition they refuse,
written by another client; it does not fire). NEXT is the moment of the next
fire, in the job's time zone: jitter included, planned times outside its
windows passed over ('gantry job next NAME' previews more).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.check(); err != nil {
				return err
			}
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-job", func(c *client.Client) error {
				views, _, err := c.Jobs(ctx)
				if err != nil {
					return err
				}
				views = page(a, p, views, "jobs", false)
				if a.json {
					return a.printJSON(views)
				}
				rows := make([][]string, 0, len(views))
				for _, v := range views {
					rows = append(rows, []string{v.Name, cmp.Or(v.Queue, wire.DefaultQueue) + "/" + v.Type, jobTrigger(v.Job), jobStatus(v),
						jobZoned(v.NextFire, v.Timezone), jobWhenp(v.LastFired), strconv.Itoa(len(v.Running))})
				}
				return a.printTable([]string{"NAME", "QUEUE/TYPE", "TRIGGER", "STATUS", "NEXT", "LAST FIRED", "RUNNING"}, rows)
			})
		},
	}
	p.register(cmd.Flags(), "jobs")
	return cmd
}

func (a *app) jobNextCommand() *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:   "next NAME [--count N]",
		Short: "Preview a job's next fire times, as the schedulers will plan them",
		Long: `Next prints the next --count fires of job NAME from now, in the job's time
zone: the planned time, the moment it fires (jitter added) and how many
planned times before it are skipped as outside the job's windows. A paused
job is previewed as if resumed. Exit 4 if there is no such job, 2 if the
schedulers reject its definition.`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 1 {
				return usageError("--count %d: want 1 or more", count)
			}
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-job", func(c *client.Client) error {
				v, err := c.Job(ctx, args[0])
				if err != nil {
					return err
				}
				fires, err := c.NextFires(ctx, args[0], count)
				if err != nil {
					return err
				}
				if a.json {
					if fires == nil {
						fires = []jobs.Fire{}
					}
					return a.printJSON(fires)
				}
				rows := make([][]string, 0, len(fires))
				for _, f := range fires {
					rows = append(rows, []string{jobZoned(&f.Planned, v.Timezone), jobZoned(&f.At, v.Timezone), strconv.Itoa(f.Skipped)})
				}
				return a.printTable([]string{"PLANNED", "FIRES AT", "SKIPPED BEFORE (OUTSIDE WINDOWS)"}, rows)
			})
		},
	}
	cmd.Flags().IntVar(&count, "count", 5, "how many fires to show")
	return cmd
}

func (a *app) jobGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show one job (exit 4 if there is none of that name)",
		Args:  exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-job", func(c *client.Client) error {
				v, err := c.Job(ctx, args[0])
				if err != nil {
					return err
				}
				if a.json {
					return a.printJSON(v)
				}
				j := v.Job
				rows := [][]string{
					{"name", j.Name}, {"task", j.Queue + "/" + j.Type}, {"trigger", jobTrigger(j)},
					{"timezone", cmp.Or(j.Timezone, "UTC")}, {"status", jobStatus(v)}, {"paused", strconv.FormatBool(j.Paused)},
					{"windows", strings.Join(j.Windows, ", ")}, {"jitter", j.Jitter}, {"misfire", string(j.Misfire)},
					{"overlap", string(j.Overlap)}, {"max per hour", strconv.Itoa(j.MaxPerHour)},
					{"priority", strconv.Itoa(j.Priority)}, {"resource", j.Resource}, {"cooldown", j.Cooldown},
					{"payload", string(j.Payload)}, {"description", j.Description}, {"next fire", jobZoned(v.NextFire, j.Timezone)},
					{"last fired", jobWhenp(v.LastFired)}, {"running", strings.Join(v.Running, ", ")},
				}
				return a.printTable([]string{"FIELD", "VALUE"}, rows)
			})
		},
	}
}

func (a *app) jobRmCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a job; it does not fire again",
		Args:  exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-job", func(c *client.Client) error {
				if err := c.RemoveJob(ctx, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "job %s removed\n", args[0])
				return nil
			})
		},
	}
}

func (a *app) jobPauseCommand(pause bool) *cobra.Command {
	use, short, done := "resume NAME", "Resume a paused job", "resumed"
	if pause {
		use, short, done = "pause NAME", "Pause a job: it does not fire on schedule until resumed", "paused"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-job", func(c *client.Client) error {
				set := c.ResumeJob
				if pause {
					set = c.PauseJob
				}
				v, err := set(ctx, args[0])
				if err != nil {
					return err
				}
				if a.json {
					return a.printJSON(v)
				}
				fmt.Fprintf(a.stdout, "job %s %s\n", v.Name, done)
				return nil
			})
		},
	}
}

func (a *app) jobTriggerCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "trigger NAME",
		Short: "Fire a job now, through the leading scheduler",
		Long: `Trigger asks the leading scheduler to fire the job now, even when it is
paused or outside its windows, and prints the task id. A job with --overlap
forbid whose previous run has not finished is refused (exit 3). Exits 4 if
there is no such job, 1 if no scheduler runs.`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-job", func(c *client.Client) error {
				run, err := c.TriggerJob(ctx, args[0])
				if err != nil {
					return err
				}
				if a.json {
					return a.printJSON(run)
				}
				fmt.Fprintln(a.stdout, run.TaskID)
				return nil
			})
		},
	}
}

func (a *app) jobRunsCommand() *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "runs NAME",
		Short: "Show a job's latest runs: planned, started, finished, state, attempts, error, machines",
		Args:  exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-job", func(c *client.Client) error {
				runs, err := c.JobRuns(ctx, args[0], limit)
				if err != nil {
					return err
				}
				if a.json {
					if runs == nil {
						runs = []wire.JobRun{}
					}
					return a.printJSON(runs)
				}
				rows := make([][]string, 0, len(runs))
				for _, r := range runs {
					rows = append(rows, []string{jobWhen(r.Planned), r.TaskID, r.Trigger, string(r.State),
						jobWhenp(r.Started), jobWhenp(r.Finished), strconv.Itoa(r.Attempts), r.Machine, cmp.Or(r.RanOn, "-"), r.Error})
				}
				return a.printTable([]string{"PLANNED", "TASK", "TRIGGER", "STATE", "STARTED", "FINISHED", "ATTEMPTS", "FIRED BY", "RAN ON", "ERROR"}, rows)
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 20, "show the latest N runs (0: all kept)")
	return cmd
}
