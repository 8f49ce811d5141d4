package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gantry-dev/gantry/bench"
	"github.com/gantry-dev/gantry/internal/logging"
)

// benchFlags are the flags every bench scenario shares.
type benchFlags struct {
	metrics string
	queue   string
	maxWait time.Duration
	runArgs []string
	soak    time.Duration
}

// benchReport is what `gantry bench --json` prints: the system measured and
// the scenario's result under its name.
type benchReport struct {
	Scenario string `json:"scenario"`
	Server   string `json:"server"`
	// Started is true when bench started its own `gantry run`; ReadyMS is
	// then from its start to its ready line.
	Started    bool              `json:"started_system"`
	ReadyMS    float64           `json:"ready_ms,omitempty"`
	Throughput *bench.Throughput `json:"throughput,omitempty"`
	Latency    *bench.Latency    `json:"latency,omitempty"`
	Lease      *bench.Lease      `json:"lease,omitempty"`
	Audit      *bench.Audit      `json:"audit,omitempty"`
	Backlog    *bench.Backlog    `json:"backlog,omitempty"`
	Soak       *bench.Soak       `json:"soak,omitempty"`
}

func (a *app) benchCommand() *cobra.Command {
	f := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the system as users run it, against raw JetStream on the same server",
		Long: `Measure gantry end to end. Without --server, bench starts its own 'gantry run'
(this binary, a temporary data dir, free loopback ports) and stops it after;
with --server it measures the system there (--metrics adds that process's
RSS, goroutines and open files). Each scenario also measures raw JetStream
on a scratch stream or bucket of the same server in the same run, reports
the ratio, and deletes the scratch stream or bucket. NATS_URL is not read:
only an explicit --server points bench at an existing system.

'gantry bench --soak D' is 'gantry bench soak --duration D'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.soak <= 0 {
				return usageError("%q needs a scenario: throughput, latency, lease, audit, backlog or soak (or --soak D)", cmd.CommandPath())
			}
			return a.bench(cmd.Context(), f, "soak", func(ctx context.Context, r *bench.Run, rep *benchReport) (err error) {
				rep.Soak, err = r.Soak(ctx, 200, f.soak, 5*time.Second)
				return err
			})
		},
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.metrics, "metrics", "", "with --server: the /metrics URL of the gantry process to sample (RSS, goroutines, open files)")
	pf.StringVar(&f.queue, "queue", "default", "queue the tasks go to")
	pf.DurationVar(&f.maxWait, "max-wait", 5*time.Minute, "how long to wait for the system (every task finished, the audit backlog drained) before failing")
	pf.StringArrayVar(&f.runArgs, "run-flag", nil, "a flag for the 'gantry run' bench starts, e.g. --run-flag=--concurrency=256 (repeatable)")
	cmd.Flags().DurationVar(&f.soak, "soak", 0, "run the soak scenario for this long at 200 tasks/s")

	var (
		tasks, backlogTasks, latRate, audRate, soakRate int
		latFor, leaseFor, audFor, soakFor, soakEvery    time.Duration
	)
	// The scenarios: each a subcommand that runs one bench.Run method.
	flags := map[string]*pflag.FlagSet{}
	for _, s := range []struct {
		name, short string
		run         func(ctx context.Context, r *bench.Run) (any, error)
	}{
		{"throughput", "N noop tasks published at once; tasks/s until every TASK_FINISHED is seen, vs raw publish + consume + ack",
			func(ctx context.Context, r *bench.Run) (any, error) { return r.Throughput(ctx, tasks) }},
		{"latency", "submit→start and submit→finished p50/p99/p99.9 at a fixed rate, vs raw publish → consume",
			func(ctx context.Context, r *bench.Run) (any, error) { return r.Latency(ctx, latRate, latFor) }},
		{"lease", "lease acquire+release cycles/s (events included) vs raw KV puts",
			func(ctx context.Context, r *bench.Run) (any, error) { return r.Lease(ctx, leaseFor) }},
		{"audit", "events/s produced vs stored by auditd at a fixed task rate, and its backlog",
			func(ctx context.Context, r *bench.Run) (any, error) { return r.Audit(ctx, audRate, audFor) }},
		{"backlog", "N tasks queued on a paused queue: RSS, then time to drain, vs raw drain",
			func(ctx context.Context, r *bench.Run) (any, error) { return r.Backlog(ctx, backlogTasks) }},
		{"soak", "a steady task rate for a duration, sampling RSS, goroutines, open files and stream sizes",
			func(ctx context.Context, r *bench.Run) (any, error) { return r.Soak(ctx, soakRate, soakFor, soakEvery) }},
	} {
		sub := &cobra.Command{
			Use:   s.name,
			Short: s.short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return a.bench(cmd.Context(), f, s.name, func(ctx context.Context, r *bench.Run, rep *benchReport) error {
					v, err := s.run(ctx, r)
					rep.keep(v)
					return err
				})
			},
		}
		flags[s.name] = sub.Flags()
		cmd.AddCommand(sub)
	}
	flags["throughput"].IntVar(&tasks, "tasks", 40000, "tasks to publish")
	pacedFlags(flags["latency"], &latRate, &latFor, 1000, 5*time.Second, "how long to publish")
	flags["lease"].DurationVar(&leaseFor, "duration", 5*time.Second, "how long each side runs")
	pacedFlags(flags["audit"], &audRate, &audFor, 1000, 5*time.Second, "how long to publish")
	flags["backlog"].IntVar(&backlogTasks, "tasks", 100000, "tasks to queue (the issue's target is at 1000000)")
	pacedFlags(flags["soak"], &soakRate, &soakFor, 200, 10*time.Minute, "how long to run")
	flags["soak"].DurationVar(&soakEvery, "sample-every", 5*time.Second, "how often to sample")
	return cmd
}

// keep puts a scenario's result in the report's field of its type.
func (rep *benchReport) keep(v any) {
	for _, f := range []any{&rep.Throughput, &rep.Latency, &rep.Lease, &rep.Audit, &rep.Backlog, &rep.Soak} {
		if dst := reflect.ValueOf(f).Elem(); dst.Type() == reflect.TypeOf(v) {
			dst.Set(reflect.ValueOf(v))
		}
	}
}

// pacedFlags are the flags of a scenario that publishes at a fixed rate
// for a while: --rate and --duration, with their defaults.
func pacedFlags(fs *pflag.FlagSet, rate *int, d *time.Duration, defRate int, defFor time.Duration, forHelp string) {
	fs.IntVar(rate, "rate", defRate, "tasks a second")
	fs.DurationVar(d, "duration", defFor, forHelp)
}

// bench connects to the system (starting one unless --server was given),
// runs scenario and prints its report.
func (a *app) bench(ctx context.Context, f *benchFlags, scenario string, run func(context.Context, *bench.Run, *benchReport) error) (err error) {
	rep := &benchReport{Scenario: scenario, Server: a.client.server}
	metrics := f.metrics
	if !a.client.fs.Changed("server") {
		sys, err := startSystem(ctx, f.runArgs)
		if err != nil {
			return err
		}
		defer func() {
			if serr := sys.stop(); serr != nil && err == nil {
				err = serr
			}
		}()
		a.client.server, rep.Server, rep.Started = sys.nats, sys.nats, true
		rep.ReadyMS = float64(sys.ready.Microseconds()) / 1000
		metrics = sys.http + "/metrics"
	}
	c, err := a.connect(ctx, "gantry-bench")
	if err != nil {
		return err
	}
	defer a.closeClient(c)

	var (
		mu  sync.Mutex
		cur bench.Progress
	)
	line := startLine(a.stderr, !a.json && logging.IsTerminal(a.stderr), 100*time.Millisecond, func() string {
		mu.Lock()
		defer mu.Unlock()
		return progressText(scenario, cur)
	})
	r, err := bench.New(bench.Config{Conn: c.Conn(), Client: c, Metrics: metrics, Queue: f.queue, Timeout: f.maxWait,
		Progress: func(p bench.Progress) {
			mu.Lock()
			cur = p
			mu.Unlock()
		}})
	if err != nil {
		line.end()
		return err
	}
	err = run(ctx, r, rep)
	line.end()
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(rep)
	}
	printBench(a.stdout, rep)
	return nil
}

// progressText is the live line of a bench run: a bar when the phase has
// a total.
func progressText(scenario string, p bench.Progress) string {
	if p.Total <= 0 {
		return fmt.Sprintf("bench %s: %s", scenario, p.Phase)
	}
	const width = 30
	fill := min(width*p.Done/p.Total, width)
	return fmt.Sprintf("bench %s: %-18s [%s%s] %d/%d", scenario, p.Phase,
		strings.Repeat("█", fill), strings.Repeat("░", width-fill), p.Done, p.Total)
}

// printBench prints a report for a person.
func printBench(w io.Writer, rep *benchReport) {
	sys := "existing system at " + rep.Server
	if rep.Started {
		sys = fmt.Sprintf("gantry run started by bench at %s (ready in %.0f ms)", rep.Server, rep.ReadyMS)
	}
	fmt.Fprintf(w, "%s: %s\n", rep.Scenario, sys)
	switch {
	case rep.Throughput != nil:
		t := rep.Throughput
		fmt.Fprintf(w, "  %d noop tasks published in %.2fs (%.0f/s)\n", t.Tasks, t.Published.Seconds, t.Published.PerSec)
		fmt.Fprintf(w, "  end to end: %d finished in %.2fs = %.0f tasks/s (%d duplicate TASK_FINISHED)\n", t.Finished.Count, t.Finished.Seconds, t.Finished.PerSec, t.DuplicateFinished)
		fmt.Fprintf(w, "  raw publish + consume + ack: %.0f msgs/s\n", t.Raw.PerSec)
		fmt.Fprintf(w, "  ratio: %.3f\n", t.Ratio)
	case rep.Latency != nil:
		l := rep.Latency
		fmt.Fprintf(w, "  %d tasks at %d/s (achieved %.0f/s)\n", l.Tasks, l.Rate, l.Published.PerSec)
		q := func(name string, v bench.Quantiles) {
			fmt.Fprintf(w, "  %-24s p50 %8.3f ms  p99 %8.3f ms  p99.9 %8.3f ms  max %8.3f ms  (%d)\n", name, v.P50, v.P99, v.P999, v.Max, v.Count)
		}
		q("submit → start", l.SubmitToStart)
		q("submit → finished", l.SubmitToFinish)
		q("raw publish → consume", l.Raw)
		fmt.Fprintf(w, "  ratio p99 start / raw: %.1f\n", l.RatioP99)
	case rep.Lease != nil:
		l := rep.Lease
		fmt.Fprintf(w, "  acquire+release: %d cycles in %.2fs = %.0f/s (%d events seen)\n", l.Cycles.Count, l.Cycles.Seconds, l.Cycles.PerSec, l.Events)
		fmt.Fprintf(w, "  raw KV put: %.0f/s\n", l.RawPuts.PerSec)
		fmt.Fprintf(w, "  ratio: %.3f\n", l.Ratio)
	case rep.Audit != nil:
		au := rep.Audit
		fmt.Fprintf(w, "  %d tasks at %d/s\n", au.Tasks, au.Rate)
		fmt.Fprintf(w, "  events produced %.0f/s, stored %.0f/s (ratio %.3f)\n", au.Produced.PerSec, au.Stored.PerSec, au.Ratio)
		fmt.Fprintf(w, "  backlog each second: %v; at the end %d; drained to %d in %.2fs\n", au.Backlog, au.BacklogAtEnd, au.BacklogAfter, au.DrainSeconds)
	case rep.Backlog != nil:
		b := rep.Backlog
		fmt.Fprintf(w, "  %d tasks queued in %.2fs; RSS with them queued %s, peak while draining %s\n", b.Tasks, b.Queued.Seconds, byteSize(b.Idle.RSSBytes), byteSize(b.PeakRSSBytes))
		fmt.Fprintf(w, "  drained in %.2fs = %.0f tasks/s; raw drain %.0f msgs/s; ratio %.3f\n", b.Drain.Seconds, b.Drain.PerSec, b.RawDrain.PerSec, b.Ratio)
	case rep.Soak != nil:
		s := rep.Soak
		fmt.Fprintf(w, "  %d tasks at %d/s over %.0fs, %d finished, %d samples\n", s.Tasks, s.Rate, s.Seconds, s.Finished, len(s.Samples))
		first, warm, last := s.Samples[0], s.WarmFrom, s.Samples[len(s.Samples)-1]
		fmt.Fprintf(w, "  %-20s %14s %14s %14s %14s %14s\n", "", "first (0s)", fmt.Sprintf("warm (%.0fs)", warm.At),
			fmt.Sprintf("last (%.0fs)", last.At), "growth", "warm growth")
		for _, row := range []struct {
			name    string
			a, b, c int64
		}{
			{"rss bytes", first.RSSBytes, warm.RSSBytes, last.RSSBytes}, {"goroutines", first.Goroutines, warm.Goroutines, last.Goroutines},
			{"open files", first.OpenFDs, warm.OpenFDs, last.OpenFDs}, {"tasks stream msgs", first.TaskMsgs, warm.TaskMsgs, last.TaskMsgs},
			{"tasks stream bytes", first.TaskBytes, warm.TaskBytes, last.TaskBytes}, {"task records bytes", first.RecordBytes, warm.RecordBytes, last.RecordBytes},
			{"audit stream msgs", first.AuditMsgs, warm.AuditMsgs, last.AuditMsgs}, {"audit stream bytes", first.AuditBytes, warm.AuditBytes, last.AuditBytes},
			{"audit pending", first.AuditPending, warm.AuditPending, last.AuditPending},
		} {
			fmt.Fprintf(w, "  %-20s %14d %14d %14d %+14d %+14d\n", row.name, row.a, row.b, row.c, row.c-row.a, row.c-row.b)
		}
		fmt.Fprintf(w, "  max RSS %s; %d samples missed\n", byteSize(s.MaxRSSBytes), s.Missed)
	}
}

// benchSystem is the `gantry run` a bench started.
type benchSystem struct {
	cmd        *exec.Cmd
	dir        string
	nats, http string
	ready      time.Duration
	// exited closes when the process has ended.
	exited chan struct{}
	// tail keeps the process's last log lines, for an error.
	mu   sync.Mutex
	tail []string
}

// startSystem starts this binary as `gantry run` on a temporary data dir
// and free loopback ports, and waits for its ready line.
func startSystem(ctx context.Context, extra []string) (*benchSystem, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "gantry-bench-")
	if err != nil {
		return nil, err
	}
	args := append([]string{"run", "--data", dir, "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
		"--log-format", "json"}, extra...)
	s := &benchSystem{cmd: exec.Command(self, args...), dir: dir, exited: make(chan struct{})}
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	start := time.Now()
	if err := s.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start gantry run: %w", err)
	}
	ready := make(chan logReady, 1)
	go func() {
		defer close(s.exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
		for sc.Scan() {
			var l logReady
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == readyMsg {
				ready <- l
			}
			s.mu.Lock()
			s.tail = append(s.tail, sc.Text())
			if len(s.tail) > 20 {
				s.tail = s.tail[1:]
			}
			s.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = s.cmd.Wait()
	}()
	select {
	case l := <-ready:
		s.ready, s.nats, s.http = time.Since(start), l.NATS, l.HTTP
		return s, nil
	case <-s.exited:
		err = fmt.Errorf("gantry run ended before it was ready: %s", s.lastLines())
	case <-time.After(30 * time.Second):
		err = fmt.Errorf("gantry run was not ready within 30s: %s", s.lastLines())
	case <-ctx.Done():
		err = ctx.Err()
	}
	return nil, errors.Join(err, s.stop())
}

// logReady is the part of gantry run's ready line bench reads.
type logReady struct {
	Msg  string `json:"msg"`
	NATS string `json:"nats"`
	HTTP string `json:"http"`
}

// lastLines is the process's last log lines, for an error.
func (s *benchSystem) lastLines() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.tail, "\n")
}

// stop asks the process to stop (SIGTERM; a kill where signals are not
// supported, or after 15 s) and removes its data dir.
func (s *benchSystem) stop() error {
	defer os.RemoveAll(s.dir)
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		_ = s.cmd.Process.Kill()
	}
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return errors.New("the gantry run bench started did not stop within 15s; killed")
	}
	if st := s.cmd.ProcessState; st != nil && !st.Success() && st.ExitCode() != -1 {
		return fmt.Errorf("the gantry run bench started exited %d: %s", st.ExitCode(), s.lastLines())
	}
	return nil
}
