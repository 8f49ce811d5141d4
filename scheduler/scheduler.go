package scheduler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/lifecycle"
	"github.com/gantry-dev/gantry/jobs"
)

// Config configures a Scheduler.
type Config struct {
	// ID names this scheduler in the leader key. Defaults to
	// "<host>-<ULID>".
	ID string
	// LeaderTTL is the life of the leader lease without renewal: the time a
	// killed leader's successor waits at most. Whole seconds, at least 1 s.
	// Defaults to 10s.
	LeaderTTL time.Duration
	// MisfireThreshold is how late a planned time may be fired as usual;
	// an older one is a misfire, handled by the job's misfire policy.
	// Defaults to 1m.
	MisfireThreshold time.Duration
	// MaxConcurrent caps the tasks in the tasks stream (waiting or running,
	// counted by the broker) at which a job's fire is skipped (reason
	// concurrency). Defaults to 0: no cap.
	MaxConcurrent int
	// MaxPerType caps the tasks of one type in the tasks stream, as
	// MaxConcurrent does for all. Defaults to none.
	MaxPerType map[string]int
	// RunHistoryTTL is how long a run stays in the history. Defaults to 72h.
	RunHistoryTTL time.Duration
	// ReconcileInterval is how often the leader checks gantry_tasks for
	// unfinished runs whose end event it missed. Defaults to 30s.
	ReconcileInterval time.Duration
	// Jobs are applied to gantry_jobs when Run starts (see jobs.Apply).
	// Defaults to none.
	Jobs []wire.Job
	// Clock tells the time of every scheduling decision. Defaults to
	// clock.Real. The leader lease runs on the broker's real-time TTL.
	Clock clock.Clock
	// Logger receives the scheduler's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Metrics registers the scheduler's Prometheus metrics (fires, skips,
	// misses, fire lag, leadership). Defaults to none.
	Metrics prometheus.Registerer
}

// Scheduler fires the jobs of gantry_jobs as tasks. Any number may run; the
// one holding the leader lease fires, the others stand by with the jobs
// loaded, ready to take over.
//
// It is an actor (lifecycle.Base): Run blocks until Stop or its context
// ends, and runs once; Ready is closed once the scheduler has applied the
// config's jobs and loaded every job of the bucket; Stop asks Run to
// resign leadership and return, and is idempotent and safe before Run or
// after it returns.
type Scheduler struct {
	lifecycle.Base
	cfg   Config
	js    jetstream.JetStream
	log   *slog.Logger
	clock clock.Clock
	audit *audit.Emitter
	host  string
	m     *metrics

	leading atomic.Bool
	term    atomic.Uint64
	// validUntil (unix ns, real time) is when the leader lease lapses
	// unless renewed.
	validUntil atomic.Int64
}

// New checks cfg, fills its defaults and returns a scheduler using js.
func New(cfg Config, js jetstream.JetStream) (*Scheduler, error) {
	if js == nil {
		return nil, errors.New("scheduler: nil jetstream")
	}
	host, _ := os.Hostname()
	host = cmp.Or(host, "unknown")
	cfg.ID = cmp.Or(cfg.ID, host+"-"+ulid.Make().String())
	cfg.LeaderTTL = cmp.Or(cfg.LeaderTTL, 10*time.Second)
	if cfg.LeaderTTL < time.Second || cfg.LeaderTTL%time.Second != 0 {
		return nil, fmt.Errorf("scheduler: leader TTL %s must be whole seconds, at least 1s", cfg.LeaderTTL)
	}
	cfg.MisfireThreshold = cmp.Or(cfg.MisfireThreshold, time.Minute)
	cfg.RunHistoryTTL = cmp.Or(cfg.RunHistoryTTL, 72*time.Hour)
	cfg.ReconcileInterval = cmp.Or(cfg.ReconcileInterval, 30*time.Second)
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	if cfg.MaxConcurrent < 0 {
		return nil, fmt.Errorf("scheduler: max concurrent %d must not be negative", cfg.MaxConcurrent)
	}
	for typ, n := range cfg.MaxPerType {
		if n <= 0 || !wire.ValidToken(typ) {
			return nil, fmt.Errorf("scheduler: max per type %q=%d: want a task type and a positive cap", typ, n)
		}
	}
	defs := make([]wire.Job, len(cfg.Jobs))
	for i, j := range cfg.Jobs {
		n, err := jobs.Normalize(j)
		if err != nil {
			return nil, fmt.Errorf("scheduler: jobs[%d]: %w", i, err)
		}
		n.Source = wire.JobSourceConfig
		defs[i] = n
	}
	cfg.Jobs = defs
	s := &Scheduler{
		cfg:   cfg,
		js:    js,
		log:   cfg.Logger.With("component", "scheduler", "scheduler_id", cfg.ID),
		clock: cfg.Clock,
		audit: audit.NewEmitter(js, "scheduler", cfg.Clock),
		host:  host,
	}
	var err error
	if s.m, err = newMetrics(cfg.Metrics, s); err != nil {
		return nil, err
	}
	return s, nil
}

// ID returns the scheduler's id, as written in the leader key.
func (s *Scheduler) ID() string { return s.cfg.ID }

// Leading reports whether the scheduler holds the leader lease, and its
// fencing term.
func (s *Scheduler) Leading() (bool, uint64) { return s.leading.Load(), s.term.Load() }

// Run watches the jobs, takes part in the leader election and, while it
// leads, fires jobs. It returns nil after Stop or when ctx ends, and
// lifecycle.ErrAlreadyRun when called again.
func (s *Scheduler) Run(ctx context.Context) error {
	return lifecycle.Run(ctx, &s.Base, func(ctx context.Context, lc *lifecycle.Runner) error {
		r, err := s.newRunner(ctx, lc.Stopping())
		if err != nil {
			return err
		}
		if err := r.start(ctx); err != nil {
			return err
		}
		lc.MarkReady()
		return r.loop(ctx)
	})
}
