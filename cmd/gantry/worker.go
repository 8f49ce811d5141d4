package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/egress"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/internal/lifecycle"
	"github.com/gantry-dev/gantry/internal/proctree"
	"github.com/gantry-dev/gantry/sqltask"
	"github.com/gantry-dev/gantry/tasks"
	"github.com/gantry-dev/gantry/workers"
)

// workerFlags are the settings of the workers, in 'gantry worker' and
// 'gantry run'.
type workerFlags struct {
	name        string
	queues      []string
	concurrency int
	typeLimits  []string
	typePolicy  []string
	prioritize  []string
	window      int
	ackWait     time.Duration
	maxAttempts int
	backoffBase time.Duration
	backoffMax  time.Duration
	delay       time.Duration
	noHandler   time.Duration
	maxDelays   int
	hbWindow    time.Duration
	timeout     time.Duration
	maxPayload  int
	killGrace   time.Duration
	containment string
	retention   retentionValue
	// databases come from the config file's databases section.
	databases []sqltask.Database
	// dataDir is the data directory: 'gantry run' sets it from its --data,
	// 'gantry worker' has a --data of its own.
	dataDir string
	// presence is how often the workers write their presence entry.
	presence time.Duration
}

func (f *workerFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.name, "worker-name", "", "this worker's name in task records and resource leases (default <host>-<pid>)")
	fl.StringSliceVar(&f.queues, "queue", []string{wire.DefaultQueue}, "queue to run tasks of, as NAME or NAME=CONCURRENCY (repeatable)")
	fl.IntVar(&f.concurrency, "concurrency", 64, "tasks of a queue running at once, across all workers (the consumer's MaxAckPending)")
	fl.StringSliceVar(&f.typeLimits, "type-limit", nil, "TYPE=N: at most N tasks of TYPE at once; a queue with type limits runs only the types listed (repeatable)")
	fl.StringArrayVar(&f.typePolicy, "type-policy", nil, "TYPE:KEY=VALUE,...: the retry policy of one type, keys max_attempts, backoff_base, backoff_max, delay, no_handler_delay, timeout (repeatable)")
	fl.StringSliceVar(&f.prioritize, "prioritize", nil, "QUEUE: its waiting tasks start highest priority first, not in publish order (repeatable; every worker of the queue must agree)")
	fl.IntVar(&f.window, "priority-window", 1000, "waiting tasks a prioritized queue holds and orders; later ones wait in publish order behind them")
	fl.DurationVar(&f.ackWait, "ack-wait", 30*time.Second, "ack deadline: a dead worker's task is redelivered after it; running tasks heartbeat every third of it")
	fl.IntVar(&f.maxAttempts, "max-attempts", 5, "default attempts of a task before NEEDS_REVIEW (a task's max_attempts wins)")
	fl.DurationVar(&f.backoffBase, "backoff-base", time.Second, "retry n waits min(base*2^(n-1), max) with ±20% jitter")
	fl.DurationVar(&f.backoffMax, "backoff-max", 5*time.Minute, "longest wait between retries")
	fl.DurationVar(&f.delay, "delay", 30*time.Second, "wait of a delayed retry without a hint (delay exit code)")
	fl.DurationVar(&f.noHandler, "no-handler-delay", 5*time.Second, "wait before a task no handler answered on gantry.handlers.<type> is tried again; not an attempt, bounded by --max-delays")
	fl.IntVar(&f.maxDelays, "max-delays", 1000, "delayed retries of one task (rate limit, no handler...) before NEEDS_REVIEW")
	fl.DurationVar(&f.hbWindow, "handler-heartbeat-window", 5*time.Second, "a remote handler that sent a progress heartbeat and then stays silent this long has lost its attempt")
	fl.DurationVar(&f.timeout, "task-timeout", 10*time.Minute, "default timeout of one attempt (a task's timeout wins)")
	fl.IntVar(&f.maxPayload, "max-payload", 1<<20, "largest task message in bytes; a larger one is rejected")
	fl.DurationVar(&f.killGrace, "kill-grace", 2*time.Second, "time between SIGTERM and SIGKILL of an exec task's process tree on timeout or cancel")
	fl.StringVar(&f.containment, "exec-containment", string(proctree.Auto), "how an exec task's process tree is held together (Linux): auto (a cgroup v2 where delegated, else a subreaper), cgroup, subreaper or group")
	f.retention = retentionValue(tasks.DefaultRetention)
	fl.DurationVar(&f.presence, "presence-interval", 5*time.Second, "how often this worker writes its entry in gantry_workers ('gantry worker ls'); it lapses after 3 intervals")
	fl.Var(&f.retention, "task-retention", "how long the record of a task that ended SUCCEEDED or CANCELLED is kept, in whole seconds (e.g. 30d, 36h); 0 keeps every record")
}

// taskRetention turns a --task-retention into the task store's setting:
// 0 keeps every record.
func taskRetention(r retentionValue) (tasks.StoreConfig, error) {
	d := time.Duration(r)
	if d == 0 {
		d = tasks.KeepForever
	}
	if err := tasks.CheckRetention(d); err != nil {
		return tasks.StoreConfig{}, usageError("--task-retention %v: want whole seconds, at least 1s, or 0 to keep every record", time.Duration(r))
	}
	return tasks.StoreConfig{Retention: d}, nil
}

// config turns the flags into the workers' Config.
func (f *workerFlags) config(log *slog.Logger) (workers.Config, error) {
	types := map[string]workers.Type{}
	for _, tl := range f.typeLimits {
		typ, n, ok := strings.Cut(tl, "=")
		v, err := strconv.Atoi(n)
		if !ok || err != nil || v < 1 || !wire.ValidToken(typ) {
			return workers.Config{}, usageError("--type-limit %q: want TYPE=N with N > 0", tl)
		}
		types[typ] = workers.Type{Concurrency: v}
	}
	for _, tp := range f.typePolicy {
		typ, pol, err := parseTypePolicy(tp)
		if err != nil {
			return workers.Config{}, err
		}
		t := types[typ]
		t.Policy = pol
		types[typ] = t
	}
	var queues []workers.Queue
	for _, q := range f.queues {
		name, n, hasN := strings.Cut(q, "=")
		conc := f.concurrency
		if hasN {
			v, err := strconv.Atoi(n)
			if err != nil || v < 1 {
				return workers.Config{}, usageError("--queue %q: want NAME or NAME=CONCURRENCY with CONCURRENCY > 0", q)
			}
			conc = v
		}
		if !wire.ValidToken(name) {
			return workers.Config{}, usageError("--queue %q: a queue name has no spaces, '.', '*' or '>'", q)
		}
		queues = append(queues, workers.Queue{Name: name, Concurrency: conc, AckWait: f.ackWait, Types: types,
			Prioritized: slices.Contains(f.prioritize, name), PriorityWindow: f.window})
	}
	for _, p := range f.prioritize {
		if !slices.ContainsFunc(queues, func(q workers.Queue) bool { return q.Name == p }) {
			return workers.Config{}, usageError("--prioritize %q: not one of the --queue queues", p)
		}
	}
	if f.concurrency < 1 || f.window < 1 || f.maxAttempts < 1 || f.ackWait < 100*time.Millisecond || f.backoffBase <= 0 ||
		f.backoffMax < f.backoffBase || f.timeout <= 0 || f.maxPayload < 1 || f.noHandler <= 0 || f.hbWindow <= 0 || f.maxDelays < 1 {
		return workers.Config{}, usageError("worker flags: want --concurrency ≥ 1, --priority-window ≥ 1, --max-attempts ≥ 1, --ack-wait ≥ 100ms, 0 < --backoff-base ≤ --backoff-max, --task-timeout > 0, --max-payload ≥ 1, --no-handler-delay > 0, --handler-heartbeat-window > 0, --max-delays ≥ 1")
	}
	tc, err := taskRetention(f.retention)
	if err != nil {
		return workers.Config{}, err
	}
	containment, err := proctree.ParseContainment(f.containment)
	if err != nil {
		return workers.Config{}, usageError("--exec-containment %q: want auto, cgroup, subreaper or group", f.containment)
	}
	return workers.Config{
		Name:   f.name,
		Queues: queues,
		Policy: workers.Policy{MaxAttempts: f.maxAttempts, BackoffBase: f.backoffBase, BackoffMax: f.backoffMax,
			Delay: f.delay, NoHandlerDelay: f.noHandler, Timeout: f.timeout},
		MaxPayload:       f.maxPayload,
		HeartbeatWindow:  f.hbWindow,
		MaxDelays:        f.maxDelays,
		KillGrace:        f.killGrace,
		CheckpointDir:    filepath.Join(f.dataDir, "checkpoints"),
		ProcessTrees:     proctree.Config{Containment: containment, Shim: shimPath()},
		TaskRetention:    tc.Retention,
		Databases:        f.databases,
		Logger:           log.With("component", "workers"),
		PresenceInterval: f.presence,
	}, nil
}

// parseTypePolicy reads TYPE:max_attempts=N,backoff_base=D,... .
func parseTypePolicy(s string) (string, workers.Policy, error) {
	var p workers.Policy
	bad := func(why string) (string, workers.Policy, error) {
		return "", p, usageError("--type-policy %q: %s (want TYPE:max_attempts=N,backoff_base=D,backoff_max=D,delay=D,no_handler_delay=D,timeout=D)", s, why)
	}
	typ, rest, ok := strings.Cut(s, ":")
	if !ok || !wire.ValidToken(typ) || rest == "" {
		return bad("no TYPE: or no settings")
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return bad(fmt.Sprintf("%q is not KEY=VALUE", kv))
		}
		if k == "max_attempts" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return bad("max_attempts wants a number ≥ 1")
			}
			p.MaxAttempts = n
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > year {
			return bad(fmt.Sprintf("%s wants a positive duration, at most %v", k, year))
		}
		switch k {
		case "backoff_base":
			p.BackoffBase = d
		case "backoff_max":
			p.BackoffMax = d
		case "delay":
			p.Delay = d
		case "no_handler_delay":
			p.NoHandlerDelay = d
		case "timeout":
			p.Timeout = d
		default:
			return bad(fmt.Sprintf("unknown key %q", k))
		}
	}
	return typ, p, nil
}

// fromConfig fills the settings the command line left alone from the
// config file's workers section ('gantry run', 'gantry worker'), and takes
// its databases, reading each DSN from where the file says.
func (f *workerFlags) fromConfig(cfg *config.File, changed func(name string) bool) error {
	if r := cfg.Workers.TaskRetention; r != nil && !changed("task-retention") {
		f.retention = retentionValue(*r)
	}
	f.databases = nil
	for _, d := range cfg.Databases {
		dsn, err := d.ResolveDSN()
		if err != nil {
			return err
		}
		f.databases = append(f.databases, sqltask.Database{Name: d.Name, Driver: d.Driver, DSN: dsn, MaxOpen: d.MaxOpen})
	}
	// A DSN its driver cannot parse is the config's fault: exit 2. New
	// connects to nothing.
	if _, err := sqltask.New(f.databases); err != nil {
		return fmt.Errorf("%w: %w", config.ErrInvalid, err)
	}
	return nil
}

// workerActor runs the workers with the egress route picker they use.
type workerActor struct {
	w      *workers.Workers
	picker *egress.Picker
}

// Run runs the workers, then closes the picker; a second Run
// (lifecycle.ErrAlreadyRun) leaves it to the first.
func (a *workerActor) Run(ctx context.Context) error {
	err := a.w.Run(ctx)
	if !errors.Is(err, lifecycle.ErrAlreadyRun) {
		a.picker.Close()
	}
	return err
}

func (a *workerActor) Stop()                  { a.w.Stop() }
func (a *workerActor) Ready() <-chan struct{} { return a.w.Ready() }
func (a *workerActor) Healthy() error         { return a.w.Healthy() }

// addWorkers adds the workers, going out through the egress routes of
// gantry_routes, to the process.
func (p *process) addWorkers(ctx context.Context, f *workerFlags, log *slog.Logger, nc *nats.Conn, js jetstream.JetStream) error {
	cfg, err := f.config(log)
	if err != nil {
		return err
	}
	picker, err := egress.NewPicker(ctx, egress.PickerConfig{Logger: log.With("component", "routes")}, nc, js)
	if err != nil {
		return err
	}
	cfg.Routes = picker
	cfg.Metrics = p.reg
	cfg.Version = readVersion().Gantry
	w, err := workers.New(cfg, nc)
	if err != nil {
		picker.Close()
		return err
	}
	p.addActor("workers", &workerActor{w: w, picker: picker})
	return nil
}

func (a *app) workerCommand() *cobra.Command {
	var (
		f  workerFlags
		cf componentFlags
	)
	cmd := &cobra.Command{
		Use:   "worker [--config FILE] [--queue Q[=N]]... [flags]",
		Short: "Run task workers alone, connected to a broker with --server",
		Long: `Worker runs only the task workers, connected to a broker with --server, for
a system split across machines ('gantry run' includes them).

Each queue is a durable pull consumer on gantry.tasks.<queue>.> shared by
every worker of that queue: --concurrency (the consumer's MaxAckPending) caps
the tasks running at once across all of them, and the broker enforces it.
A running task heartbeats every --ack-wait/3; a worker that dies loses its
tasks to another after --ack-wait (then 2x, 4x... as the consumer's BackOff).

Tasks start in the order published. A queue named with --prioritize starts
its waiting tasks highest "priority" first instead: a sorter holds up to
--priority-window of them and moves the best to gantry.ready.<queue>.<type>
whenever the workers are about to run out.

Failures are classified: retryable ones (non-zero exit, timeout, 5xx, reset)
wait min(base*2^(n-1), max) with jitter; delayed ones (429/503 Retry-After,
route cooldown, delay exit codes) wait for the hint without using up an
attempt; permanent ones (bad input, 4xx, fail exit codes, unknown
type) go to NEEDS_REVIEW at once, as does a task out of attempts. A task
whose resource is busy, DISABLED or FAULT waits in the resource's line,
keeping its delivery, and starts the moment its turn comes.

Built-in types: noop, exec, http, sql (on the databases of --config). Any
other type is sent as a request to gantry.handlers.<type>. See
docs/tasks.md and docs/sql.md. An exec task's checkpoint file is under
<data>/checkpoints; a worker removes the files a killed worker left there
when it starts.

Every worker also runs a keeper: it registers the resources of the config
file (an existing one keeps its state), records lease expiries and
reclaims resources whose holder is gone. Several keepers are safe.

Started before its broker, a worker waits for it (--connect-timeout); it
logs every loss and return of the broker.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.worker(cmd.Context(), &f, &cf, cmd.Flags().Changed)
		},
	}
	f.register(cmd)
	cmd.AddCommand(a.workerLsCommand())
	cf.register(cmd, "workers, resources and databases (for sql tasks) sections")
	cmd.Flags().StringVar(&f.dataDir, "data", defaultDataDir(), "data directory; exec tasks' checkpoint files are under <data>/checkpoints")
	return cmd
}

func (a *app) worker(ctx context.Context, f *workerFlags, cf *componentFlags, changed func(string) bool) error {
	log, err := a.logger()
	if err != nil {
		return err
	}
	cfg, err := cf.load()
	if err != nil {
		return err
	}
	if err := f.fromConfig(cfg, changed); err != nil {
		return err
	}
	if _, err := f.config(log); err != nil {
		return err
	}
	if err := a.checkComponentHTTP(cf.httpListen); err != nil {
		return err
	}
	logSections(log, cf.configPath, cfg, "workers", "resources", "databases")
	nc, js, err := a.connectComponent(ctx, log, cf, "gantry-worker")
	if err != nil {
		return err
	}
	p := newProcess(log)
	p.conns = append(p.conns, nc)
	p.attrs = append(p.attrs, "nats", nc.ConnectedUrlRedacted(), "queues", strings.Join(f.queues, ","))

	// HTTP, when asked for: /healthz, /readyz (unready while cut off from
	// the broker) and the workers' /metrics.
	if err := a.addComponentHTTP(p, cf.httpListen, nc); err != nil {
		p.abort()
		return err
	}

	// Signals: SIGINT and SIGTERM stop taking tasks; running ones get 5 s
	// to finish, then are interrupted and handed back to the broker.
	p.addSignals(ctx)

	// Workers: run the tasks of the queues.
	if err := p.addWorkers(ctx, f, log, nc, js); err != nil {
		nc.Close()
		return fmt.Errorf("workers: %w", err)
	}

	// Keeper: registers the config's resources, records lease expiries and
	// reclaims resources whose holder is gone, so a system without 'gantry
	// run' still has one (several are safe: each expiry is recorded once).
	if err := p.addKeeper(js, log, resourceSpecs(cfg)); err != nil {
		nc.Close()
		return fmt.Errorf("keeper: %w", err)
	}
	return p.run()
}
