package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
)

// Config is what every scenario needs.
type Config struct {
	// Conn connects to the system's broker.
	Conn *nats.Conn
	// Client is the gantry client on Conn.
	Client *client.Client
	// Metrics is the URL of the /metrics of the gantry process to sample
	// (RSS, goroutines, open files); "" leaves those out.
	Metrics string
	// Queue is the queue the tasks go to. Defaults to "default".
	Queue string
	// Progress, when set, is told how far the current phase is.
	Progress func(Progress)
	// Timeout bounds each wait for the system (every task finished, the
	// audit backlog drained). Defaults to 5 minutes.
	Timeout time.Duration
	// Log receives what the scenario does. Defaults to discarding.
	Log *slog.Logger
}

// Progress is how far a scenario's current phase is.
type Progress struct {
	Phase string
	Done  int
	Total int
}

// Run is one scenario run against one system.
type Run struct {
	cfg Config
	js  jetstream.JetStream
	// id names this run's task ids, scratch stream and bucket.
	id string
}

// New checks cfg, fills its defaults and returns a run.
func New(cfg Config) (*Run, error) {
	if cfg.Conn == nil || cfg.Client == nil {
		return nil, errors.New("bench: a connection and a client are required")
	}
	cfg.Queue = cmp.Or(cfg.Queue, wire.DefaultQueue)
	cfg.Timeout = cmp.Or(cfg.Timeout, 5*time.Minute)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = func(Progress) {}
	}
	js, err := jetstream.New(cfg.Conn, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	return &Run{cfg: cfg, js: js, id: hex.EncodeToString(b)}, nil
}

// Rate is a count over a time.
type Rate struct {
	Count   int     `json:"count"`
	Seconds float64 `json:"seconds"`
	PerSec  float64 `json:"per_sec"`
}

func rate(n int, d time.Duration) Rate {
	return Rate{Count: n, Seconds: round(d.Seconds(), 3), PerSec: round(float64(n)/d.Seconds(), 1)}
}

// Quantiles summarises latencies, in milliseconds.
type Quantiles struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
}

func quantiles(ds []time.Duration) Quantiles {
	if len(ds) == 0 {
		return Quantiles{}
	}
	slices.Sort(ds)
	at := func(q float64) float64 {
		i := min(int(math.Ceil(q*float64(len(ds))))-1, len(ds)-1)
		return ms(ds[max(i, 0)])
	}
	return Quantiles{Count: len(ds), P50: at(0.50), P99: at(0.99), P999: at(0.999), Max: ms(ds[len(ds)-1])}
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 3) }

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round(a/b, 3)
}

// taskID names task i of this run.
func (r *Run) taskID(i int) string { return "bench-" + r.id + "-" + strconv.Itoa(i) }

// taskIndex is the i of taskID(i), or -1 for another task.
func (r *Run) taskIndex(id string) int {
	s, ok := strings.CutPrefix(id, "bench-"+r.id+"-")
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return i
}

// publishTask publishes task i (a noop) with a JetStream publish whose
// acknowledgement is awaited later.
func (r *Run) publishTask(i int) (jetstream.PubAckFuture, error) {
	body, err := json.Marshal(wire.Task{ID: r.taskID(i)})
	if err != nil {
		return nil, err
	}
	return r.publishAsync(wire.TaskSubject(r.cfg.Queue, "noop"), body)
}

// awaitAcks waits until every asynchronous publish is acknowledged and
// returns the first error among futures.
func (r *Run) awaitAcks(ctx context.Context, futures []jetstream.PubAckFuture) error {
	select {
	case <-r.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, f := range futures {
		select {
		case err := <-f.Err():
			return fmt.Errorf("publish: %w", err)
		default:
		}
	}
	return nil
}

// tracker follows this run's tasks on the audit subjects: when each was
// started and finished (the events' own times) and how many distinct tasks
// did.
type tracker struct {
	r    *Run
	subs []*nats.Subscription

	mu       sync.Mutex
	started  []time.Time
	finished []time.Time
	nStarted int
	nDone    int
	dupes    int
	want     int
	all      chan struct{}
}

// track subscribes to TASK_FINISHED (and TASK_STARTED when starts is set)
// for n tasks of this run.
func (r *Run) track(n int, starts bool) (*tracker, error) {
	t := &tracker{r: r, finished: make([]time.Time, n), want: n, all: make(chan struct{})}
	types := []wire.EventType{wire.EventTaskFinished}
	if starts {
		t.started = make([]time.Time, n)
		types = append(types, wire.EventTaskStarted)
	}
	if n == 0 {
		close(t.all)
	}
	for _, typ := range types {
		sub, err := r.cfg.Conn.Subscribe(typ.Subject(), t.handle)
		if err != nil {
			t.close()
			return nil, fmt.Errorf("subscribe %s: %w", typ.Subject(), err)
		}
		if err := sub.SetPendingLimits(-1, -1); err != nil {
			t.close()
			return nil, err
		}
		t.subs = append(t.subs, sub)
	}
	// The subscriptions are in place on the server before any task goes.
	if err := r.cfg.Conn.Flush(); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *tracker) handle(m *nats.Msg) {
	var ev struct {
		Type   wire.EventType `json:"type"`
		Time   time.Time      `json:"time"`
		TaskID string         `json:"task_id"`
	}
	if json.Unmarshal(m.Data, &ev) != nil {
		return
	}
	i := t.r.taskIndex(ev.TaskID)
	if i < 0 || i >= t.want {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch ev.Type {
	case wire.EventTaskStarted:
		if t.started != nil && t.started[i].IsZero() {
			t.started[i] = ev.Time
			t.nStarted++
		}
	case wire.EventTaskFinished:
		if !t.finished[i].IsZero() {
			t.dupes++
			return
		}
		t.finished[i] = ev.Time
		t.nDone++
		if t.nDone == t.want {
			close(t.all)
		}
	}
}

// done returns how many distinct tasks finished.
func (t *tracker) done() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nDone
}

// wait waits until every task finished, reporting progress under phase.
func (t *tracker) wait(ctx context.Context, phase string) error {
	return t.r.waitFor(ctx, t.all, phase, t.done, t.want)
}

func (t *tracker) close() {
	for _, s := range t.subs {
		_ = s.Unsubscribe()
	}
}

// scratch is a stream of this run's own, deleted when the run ends.
type scratch struct {
	stream  jetstream.Stream
	subject string
}

// scratchStream creates the raw baseline's stream: file storage and
// work-queue retention, as GANTRY_TASKS.
func (r *Run) scratchStream(ctx context.Context, retention jetstream.RetentionPolicy) (*scratch, error) {
	name := "GANTRY_BENCH_" + strings.ToUpper(r.id)
	subject := "gantry.bench." + r.id
	s, err := r.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage, Retention: retention,
	})
	if err != nil {
		return nil, fmt.Errorf("create scratch stream %s: %w", name, err)
	}
	return &scratch{stream: s, subject: subject}, nil
}

// remove deletes the scratch stream (with a context of its own: the run's
// may have ended).
func (r *Run) remove(s *scratch) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := s.stream.CachedInfo().Config.Name
	if err := r.js.DeleteStream(ctx, name); err != nil {
		r.cfg.Log.Warn("delete scratch stream", "stream", name, "err", err)
	}
}

// rawConsumer consumes s with a durable pull consumer (explicit acks, as
// the workers' consumer), acknowledging each message and calling got.
func (r *Run) rawConsumer(ctx context.Context, s *scratch, got func(jetstream.Msg)) (jetstream.ConsumeContext, error) {
	cons, err := s.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 4096,
	})
	if err != nil {
		return nil, fmt.Errorf("create scratch consumer: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		got(m)
	})
	if err != nil {
		return nil, fmt.Errorf("consume scratch stream: %w", err)
	}
	return cc, nil
}

// publishAsync publishes with a JetStream acknowledgement awaited later;
// when 4096 are outstanding it waits (up to a minute, a loaded broker)
// for room instead of failing at once.
func (r *Run) publishAsync(subject string, body []byte) (jetstream.PubAckFuture, error) {
	return r.js.PublishAsync(subject, body, jetstream.WithStallWait(time.Minute))
}

// poll checks cond every 10 ms until it holds (true) or d runs out (false).
func (r *Run) poll(ctx context.Context, d time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return cond()
		case <-tick.C:
		}
	}
	return true
}
