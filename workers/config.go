package workers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/proctree"
	"github.com/gantry-dev/gantry/sqltask"
	"github.com/gantry-dev/gantry/tasks"
)

// Config configures the workers of one process.
type Config struct {
	// Name identifies this worker in task records, logs and resource
	// leases. Defaults to <host>-<pid>.
	Name string
	// Queues are the queues to consume. Defaults to one queue, "default".
	Queues []Queue
	// Policy is the retry and timeout policy of every queue, under the
	// queue's, the type's and the task's own settings. Zero fields take
	// the defaults of Policy.
	Policy Policy
	// MaxPayload bounds the size of a task message; a larger one is
	// rejected. Defaults to 1 MiB.
	MaxPayload int
	// MaxDelays bounds the delayed retries of one task (they do not use up
	// its attempts); past it the task goes to NEEDS_REVIEW. Defaults to
	// 1000.
	MaxDelays int
	// MaxDeliver is the consumers' MaxDeliver: a backstop for tasks whose
	// worker dies on every delivery. Defaults to 2000, above MaxDelays
	// plus the usual attempts.
	MaxDeliver int
	// TaskRetention is how long the record of a task that ended SUCCEEDED
	// or CANCELLED stays in gantry_tasks after its last write; the broker
	// then removes it, and the audit store keeps the task's history.
	// NEEDS_REVIEW records (the review queue) and live tasks' records never
	// expire. Whole seconds, at least 1 s. Defaults to 7 days
	// (tasks.DefaultRetention); tasks.KeepForever keeps every record.
	TaskRetention time.Duration
	// KeyTTL is how long a task's key deduplicates. Defaults to 24 hours,
	// the stream's Nats-Msg-Id window.
	KeyTTL time.Duration
	// StateDelay is how long a task runs before its RUNNING state is
	// written; a task that ends sooner writes only its final state.
	// Defaults to 250 ms. The TASK_STARTED event is emitted at once.
	StateDelay time.Duration
	// OutputTail bounds the output (stdout, stderr, response body) kept per
	// attempt. Defaults to 4 KiB.
	OutputTail int
	// OutputRate bounds the lines of one attempt published live on
	// gantry.output.<task id>, per second, in bursts of twice as many;
	// lines over it are dropped (the next line counts them), so a chatty
	// task is never slowed. Defaults to 100.
	OutputRate int
	// OutputLineMax bounds a live output line in bytes; a longer one is
	// cut. Defaults to 1 KiB.
	OutputLineMax int
	// HeartbeatWindow is how long a remote handler that has sent a
	// progress message (wire.HeaderProgress) may then stay silent before
	// its attempt fails as lost (a retry): a handler that dies mid-request
	// is noticed within it. It is sent to the handler in the request's
	// wire.HeaderHeartbeatWindow. A handler that sends no progress is
	// waited for until the task's timeout. Defaults to 5 s.
	HeartbeatWindow time.Duration
	// KillGrace is how long an exec'd process tree has between SIGTERM and
	// SIGKILL on timeout or cancel, and how long the output of a process
	// that escaped the tree is read after the task's process exits.
	// Defaults to 2 s, so that a stopping process ends within its 10 s.
	KillGrace time.Duration
	// CheckpointDir is where exec tasks' checkpoint files
	// (GANTRY_CHECKPOINT_FILE) are written: in a directory of each Workers'
	// own, removed when Run returns. Run first removes the directories of
	// worker processes that are gone (killed with SIGKILL), with what
	// they left. Defaults to gantry-checkpoints in the system's temporary
	// directory; cmd/gantry uses <data>/checkpoints.
	CheckpointDir string
	// ProcessTrees is how exec tasks' process trees are contained: see
	// proctree.Containment. Defaults to the strongest containment the
	// machine allows; a Subreaper needs a Shim (cmd/gantry names its own
	// executable), and without one Linux falls back from a cgroup to the
	// process group.
	ProcessTrees proctree.Config
	// ConsumerCheck is how often each consumer is checked for having been
	// deleted (it is recreated, as is a deleted tasks stream). Defaults to
	// durable.DefaultCheckInterval (5 s).
	ConsumerCheck time.Duration
	// DrainTimeout is how long running tasks may take to finish after Stop
	// before they are interrupted (exec trees get SIGTERM, then SIGKILL
	// after KillGrace) and handed back to the broker. Defaults to 5 s.
	DrainTimeout time.Duration
	// Routes gives http tasks with a route their transport. Nil makes such
	// tasks fail permanently.
	Routes RoutePicker
	// LeaseTTL is the TTL of the lease on a task's resource, renewed every
	// LeaseTTL/3 while the task runs. Defaults to 30 s.
	LeaseTTL time.Duration
	// BusyDelay is the delay before a task is tried again when its
	// resource could neither be leased nor waited for (the broker did not
	// answer). A busy, DISABLED or FAULT resource is waited for in its line
	// instead, holding the delivery. Defaults to 1 s.
	BusyDelay time.Duration
	// HTTPClient sends http tasks without a route. Defaults to a client
	// with Go's default transport.
	HTTPClient *http.Client
	// Databases are what sql tasks connect to: one pool each, bounded by
	// its MaxOpen, opened on first use and closed when Run returns. A sql
	// task naming another database fails permanently.
	Databases []sqltask.Database
	// Sorter are the timings of the sorters of prioritized queues. Each
	// defaults as SorterTimings says.
	Sorter SorterTimings
	// Clock tells the time of backoff and not_before decisions. Defaults to
	// the real clock.
	Clock clock.Clock
	// Logger receives the workers' logs. Defaults to a discarding logger.
	Logger *slog.Logger
	// Metrics registers the workers' Prometheus metrics (wait and run
	// times, outcomes, retries, errors, time to recover). Defaults to none:
	// the metrics are kept but not exported.
	Metrics prometheus.Registerer
	// Version is the version this worker reports in gantry_workers.
	// Defaults to "dev".
	Version string
	// PresenceInterval is how often the worker writes its presence (queues,
	// running tasks, last hour's counts) in gantry_workers; the entry
	// lapses 3 intervals (whole seconds) after the last write. Defaults to
	// 5 s.
	PresenceInterval time.Duration
}

// The range of Queue.AckWait. The consumer's BackOff doubles it four times,
// which must not overflow.
const (
	MinAckWait = 100 * time.Millisecond
	MaxAckWait = 24 * time.Hour
)

// Queue is one queue workers consume.
type Queue struct {
	// Name is the queue's subject token: tasks are on
	// gantry.tasks.<name>.<type>.
	Name string
	// Concurrency is the queue consumer's MaxAckPending: how many of its
	// tasks run at once across every worker. Defaults to 64.
	Concurrency int
	// AckWait is the ack deadline of a delivery; a running task heartbeats
	// every AckWait/3. From MinAckWait to MaxAckWait; defaults to 30 s.
	AckWait time.Duration
	// Policy overrides Config.Policy for this queue.
	Policy Policy
	// Types sets per-type concurrency and policy. A queue where any type
	// has a Concurrency gets one consumer per listed type instead of one
	// for the whole queue, and then runs only the types listed.
	Types map[string]Type
	// Prioritized makes waiting tasks start highest priority first (equal
	// priorities in the order published) instead of in the order
	// published. A sorter moves the queue's tasks from
	// gantry.tasks.<queue>.> to gantry.ready.<queue>.<type>, keeping just a
	// few ahead of the workers; it costs one more stored message per task.
	// Every worker of a queue must agree on it.
	Prioritized bool
	// PriorityWindow bounds the waiting tasks a prioritized queue sorts:
	// the oldest PriorityWindow are held and ordered, later ones wait in
	// publish order behind them. Defaults to 1000.
	PriorityWindow int
}

// Type is the setting of one task type in a queue.
type Type struct {
	// Concurrency is this type's MaxAckPending. Zero means the queue's.
	Concurrency int
	// Policy overrides the queue's policy for this type.
	Policy Policy
}

// Policy is how a task is retried and bounded. A task's own max_attempts
// and timeout override it.
type Policy struct {
	// MaxAttempts bounds the runs of a task. Defaults to 5.
	MaxAttempts int
	// BackoffBase and BackoffMax give the delay before retry n (n ≥ 1):
	// min(base·2^(n-1), max), with ±20% jitter. Default to 1 s and 5 min.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// Delay is the wait of a delayed retry that carries no hint (an exec
	// delay exit code). Defaults to 30 s.
	Delay time.Duration
	// NoHandlerDelay is the wait of a delayed retry when no handler
	// answers on gantry.handlers.<type> (a handler restarting). Like every
	// delay it does not use up an attempt; Config.MaxDelays bounds it.
	// Defaults to 5 s.
	NoHandlerDelay time.Duration
	// Timeout bounds one attempt. Defaults to 10 min.
	Timeout time.Duration
	// MaxRuntime is the hard maximum of one attempt, whatever the task
	// asks. Defaults to 24 h.
	MaxRuntime time.Duration
}

// RoutePicker gives http tasks the transport of an egress route. The
// healthd side implements it.
type RoutePicker interface {
	// Transport returns a round tripper going out through route ("auto":
	// the best available route) and the id of the route chosen. An error
	// with a RetryAfter() time.Duration method (a route in cooldown) is a
	// delayed retry.
	Transport(ctx context.Context, route string) (rt http.RoundTripper, routeID string, err error)
	// Report tells how a request through routeID went (err nil: fine).
	Report(ctx context.Context, routeID string, err error)
}

func (p Policy) or(q Policy) Policy {
	return Policy{
		MaxAttempts:    cmp.Or(p.MaxAttempts, q.MaxAttempts),
		BackoffBase:    cmp.Or(p.BackoffBase, q.BackoffBase),
		BackoffMax:     cmp.Or(p.BackoffMax, q.BackoffMax),
		Delay:          cmp.Or(p.Delay, q.Delay),
		NoHandlerDelay: cmp.Or(p.NoHandlerDelay, q.NoHandlerDelay),
		Timeout:        cmp.Or(p.Timeout, q.Timeout),
		MaxRuntime:     cmp.Or(p.MaxRuntime, q.MaxRuntime),
	}
}

// defaultPolicy holds the documented defaults.
var defaultPolicy = Policy{
	MaxAttempts:    5,
	BackoffBase:    time.Second,
	BackoffMax:     5 * time.Minute,
	Delay:          30 * time.Second,
	NoHandlerDelay: 5 * time.Second,
	Timeout:        10 * time.Minute,
	MaxRuntime:     24 * time.Hour,
}

func (c Config) withDefaults() (Config, error) {
	host, _ := os.Hostname()
	c.Name = cmp.Or(c.Name, cmp.Or(host, "worker")+"-"+strconv.Itoa(os.Getpid()))
	c.Queues = slices.Clone(c.Queues)
	if len(c.Queues) == 0 {
		c.Queues = []Queue{{Name: wire.DefaultQueue}}
	}
	c.Policy = c.Policy.or(defaultPolicy)
	c.MaxPayload = cmp.Or(c.MaxPayload, 1<<20)
	c.MaxDelays = cmp.Or(c.MaxDelays, 1000)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, 30*time.Second)
	c.BusyDelay = cmp.Or(c.BusyDelay, time.Second)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, 2000)
	c.KeyTTL = cmp.Or(c.KeyTTL, 24*time.Hour)
	c.TaskRetention = cmp.Or(c.TaskRetention, tasks.DefaultRetention)
	c.StateDelay = cmp.Or(c.StateDelay, 250*time.Millisecond)
	c.OutputTail = cmp.Or(c.OutputTail, 4096)
	c.OutputRate = cmp.Or(c.OutputRate, 100)
	c.OutputLineMax = cmp.Or(c.OutputLineMax, 1024)
	c.HeartbeatWindow = cmp.Or(c.HeartbeatWindow, 5*time.Second)
	c.KillGrace = cmp.Or(c.KillGrace, 2*time.Second)
	c.CheckpointDir = cmp.Or(c.CheckpointDir, filepath.Join(os.TempDir(), "gantry-checkpoints"))
	c.DrainTimeout = cmp.Or(c.DrainTimeout, 5*time.Second)
	c.Sorter = c.Sorter.withDefaults()
	if c.Sorter.PullExpiry < time.Second || c.Sorter.PullExpiry >= c.Sorter.PinnedTTL {
		return c, fmt.Errorf("workers: sorter pull expiry %v must be at least 1s and shorter than its pinned TTL %v", c.Sorter.PullExpiry, c.Sorter.PinnedTTL)
	}
	c.Version = cmp.Or(c.Version, "dev")
	c.PresenceInterval = cmp.Or(c.PresenceInterval, 5*time.Second)
	if c.PresenceInterval < 100*time.Millisecond {
		return c, fmt.Errorf("presence interval %v: want at least 100ms", c.PresenceInterval)
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	c.Clock = cmp.Or[clock.Clock](c.Clock, clock.Real{})
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.LeaseTTL < time.Second {
		return c, fmt.Errorf("lease ttl %v: want at least 1s", c.LeaseTTL)
	}
	if c.OutputRate < 1 || c.OutputLineMax < 1 || c.HeartbeatWindow < 0 {
		return c, fmt.Errorf("output rate %d, output line max %d, heartbeat window %v: want positive values", c.OutputRate, c.OutputLineMax, c.HeartbeatWindow)
	}
	if c.KeyTTL < time.Second {
		return c, fmt.Errorf("key ttl %v: want at least 1s", c.KeyTTL)
	}
	if err := tasks.CheckRetention(c.TaskRetention); err != nil {
		return c, err
	}
	seen := map[string]bool{}
	for i := range c.Queues {
		q := &c.Queues[i]
		if !wire.ValidToken(q.Name) {
			return c, fmt.Errorf("queue %q: want a non-empty name without spaces, '.', '*' or '>'", q.Name)
		}
		if seen[q.Name] {
			return c, fmt.Errorf("queue %q listed twice", q.Name)
		}
		seen[q.Name] = true
		q.Concurrency = cmp.Or(q.Concurrency, 64)
		q.AckWait = cmp.Or(q.AckWait, 30*time.Second)
		if q.AckWait < MinAckWait || q.AckWait > MaxAckWait {
			return c, fmt.Errorf("queue %s: ack wait %v: want %v to %v", q.Name, q.AckWait, MinAckWait, MaxAckWait)
		}
		if q.Concurrency < 1 {
			return c, fmt.Errorf("queue %s: concurrency %d: want at least 1", q.Name, q.Concurrency)
		}
		q.PriorityWindow = cmp.Or(q.PriorityWindow, 1000)
		if q.PriorityWindow < 1 {
			return c, fmt.Errorf("queue %s: priority window %d: want at least 1", q.Name, q.PriorityWindow)
		}
		for typ, t := range q.Types {
			if !wire.ValidToken(typ) {
				return c, fmt.Errorf("queue %s: type %q: want a name without spaces, '.', '*' or '>'", q.Name, typ)
			}
			if t.Concurrency < 0 {
				return c, fmt.Errorf("queue %s: type %s: concurrency %d: want at least 0", q.Name, typ, t.Concurrency)
			}
		}
	}
	if c.Policy.MaxAttempts < 1 {
		return c, errors.New("max attempts: want at least 1")
	}
	return c, nil
}

// policy returns the policy of typ in queue q.
func (c Config) policy(q *Queue, typ string) Policy {
	return q.Types[typ].Policy.or(q.Policy).or(c.Policy)
}
