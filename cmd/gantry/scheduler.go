package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/jobs"
	"github.com/gantry-dev/gantry/scheduler"
)

// schedulerFlags tune the scheduler in 'gantry scheduler' and 'gantry run'.
type schedulerFlags struct {
	leaderTTL        time.Duration
	misfireThreshold time.Duration
	maxConcurrent    int
	maxPerType       []string
	runHistory       time.Duration
}

func (f *schedulerFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.DurationVar(&f.leaderTTL, "leader-ttl", 10*time.Second, "scheduler leader lease TTL (whole seconds): the longest a killed leader's successor waits")
	fl.DurationVar(&f.misfireThreshold, "misfire-threshold", time.Minute, "how late a planned fire may still run as usual; older ones follow the job's misfire policy")
	fl.IntVar(&f.maxConcurrent, "max-concurrent", 0, "skip a job's fire while the tasks stream holds this many tasks (0: no cap)")
	fl.StringSliceVar(&f.maxPerType, "max-per-type", nil, "skip a job's fire while the tasks stream holds this many tasks of its type: TYPE=N (repeatable)")
	fl.DurationVar(&f.runHistory, "run-history", 72*time.Hour, "how long 'gantry job runs' keeps each run")
}

// config builds the scheduler's Config from the flags and the config file.
func (f *schedulerFlags) config(cfg *config.File, log *slog.Logger) (scheduler.Config, error) {
	perType := map[string]int{}
	for _, kv := range f.maxPerType {
		typ, n, ok := strings.Cut(kv, "=")
		v, err := strconv.Atoi(n)
		if !ok || err != nil || v <= 0 || !wire.ValidToken(typ) {
			return scheduler.Config{}, usageError("--max-per-type %q: want TYPE=N with N > 0", kv)
		}
		perType[typ] = v
	}
	if f.leaderTTL < time.Second || f.leaderTTL%time.Second != 0 {
		return scheduler.Config{}, usageError("--leader-ttl %s: want whole seconds, at least 1s", f.leaderTTL)
	}
	defs, err := cfg.JobDefinitions()
	if err != nil {
		return scheduler.Config{}, err
	}
	return scheduler.Config{
		LeaderTTL:        f.leaderTTL,
		MisfireThreshold: f.misfireThreshold,
		MaxConcurrent:    f.maxConcurrent,
		MaxPerType:       perType,
		RunHistoryTTL:    f.runHistory,
		Jobs:             defs,
		Logger:           log,
	}, nil
}

// newScheduler builds the scheduler, its metrics on reg; 'gantry run' and
// 'gantry scheduler' share it. A bad job in the config file is invalid
// input (exit 2).
func newScheduler(cfg scheduler.Config, js jetstream.JetStream, reg prometheus.Registerer) (*scheduler.Scheduler, error) {
	cfg.Metrics = reg
	s, err := scheduler.New(cfg, js)
	if errors.Is(err, jobs.ErrInvalid) {
		return nil, fmt.Errorf("%w: %w", config.ErrInvalid, err)
	}
	return s, err
}

func (a *app) schedulerCommand() *cobra.Command {
	var (
		cf componentFlags
		sf schedulerFlags
	)
	cmd := &cobra.Command{
		Use:   "scheduler [--config FILE]",
		Short: "Run the job scheduler alone, connected to a broker with --server",
		Long: `Scheduler runs only the job scheduler, connected to a broker with --server,
for a system split across machines ('gantry run' includes it).

It watches the gantry_jobs bucket ('gantry job add|pause|rm' change it; a
change takes effect at once) and fires each job's task on
gantry.tasks.<queue>.<type> when its cron, every or at trigger says so. The
jobs of the config file are applied at start: created if missing, updated if
changed, but an operator's pause or resume is kept.

Run as many schedulers as you like: one leads, through a lease in the
gantry_scheduler bucket (--leader-ttl); the others take over when it stops
(at once) or dies (within the TTL). Every fire carries the task id and
Nats-Msg-Id "<job>-<planned unix seconds>", so a fire is never doubled by a
failover. See docs/scheduler.md for the policies.

Started before its broker, the scheduler waits for it (--connect-timeout);
it logs every loss and return of the broker.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.scheduler(cmd.Context(), &cf, &sf) },
	}
	cf.register(cmd, "jobs section (applied at start)")
	sf.register(cmd)
	return cmd
}

func (a *app) scheduler(ctx context.Context, cf *componentFlags, sf *schedulerFlags) error {
	log, err := a.logger()
	if err != nil {
		return err
	}
	cfg, err := cf.load()
	var scfg scheduler.Config
	if err == nil {
		scfg, err = sf.config(cfg, log)
	}
	if err != nil {
		a.rejectConfig(ctx, log, "scheduler", err)
		return err
	}
	if err := a.checkComponentHTTP(cf.httpListen); err != nil {
		return err
	}
	logSections(log, cf.configPath, cfg, "jobs")
	nc, js, err := a.connectComponent(ctx, log, cf, "gantry-scheduler")
	if err != nil {
		return err
	}
	p := newProcess(log)
	p.conns = append(p.conns, nc)
	p.attrs = append(p.attrs, "nats", nc.ConnectedUrlRedacted(), "jobs", len(scfg.Jobs))

	// HTTP, when asked for: /healthz, /readyz (unready while cut off from
	// the broker) and the scheduler's /metrics.
	if err := a.addComponentHTTP(p, cf.httpListen, nc); err != nil {
		p.abort()
		return err
	}

	// Signals: SIGINT and SIGTERM stop the scheduler cleanly; a leader
	// resigns so another takes over at once.
	p.addSignals(ctx)

	// Scheduler: fires the jobs of gantry_jobs while it leads.
	s, err := newScheduler(scfg, js, p.reg)
	if err != nil {
		p.abort()
		return err
	}
	p.addActor("scheduler", s)
	return p.run()
}

// defaultSchedulerFlags are the scheduler settings of 'gantry run'.
func defaultSchedulerFlags() *schedulerFlags {
	return &schedulerFlags{leaderTTL: 10 * time.Second, misfireThreshold: time.Minute, runHistory: 72 * time.Hour}
}

// addScheduler adds the scheduler, with the config file's jobs and the
// default settings, to the process.
func (p *process) addScheduler(cfg *config.File, log *slog.Logger, js jetstream.JetStream) error {
	scfg, err := defaultSchedulerFlags().config(cfg, log)
	if err != nil {
		return err
	}
	s, err := newScheduler(scfg, js, p.reg)
	if err != nil {
		return err
	}
	p.addActor("scheduler", s)
	return nil
}

// rejectConfig records a config file component refused (an error matching
// config.ErrInvalid) as a CONFIG_REJECTED audit event, when the broker can
// be reached at once, so the refusal is visible beyond this terminal.
func (a *app) rejectConfig(ctx context.Context, log *slog.Logger, component string, cfgErr error) {
	if !errors.Is(cfgErr, config.ErrInvalid) {
		return
	}
	nc, js, err := a.client.connect("gantry-" + component)
	if err != nil {
		return
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, a.client.timeout)
	defer cancel()
	err = audit.NewEmitter(js, component, clock.Real{}).Emit(ctx, wire.Event{
		Type: wire.EventConfigRejected, Level: wire.LevelError, Message: cfgErr.Error(),
	})
	if err != nil {
		log.Warn("config rejection not recorded", "err", err)
	}
}
