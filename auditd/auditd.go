package auditd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/durable"
	"github.com/gantry-dev/gantry/internal/lifecycle"
)

// Defaults of Config.
const (
	// DefaultRetention is how long events are kept unless told otherwise.
	DefaultRetention = 30 * 24 * time.Hour
	// KeepForever as Config.Retention turns retention off.
	KeepForever time.Duration = -1
	// DefaultConsumer is the durable consumer's name on GANTRY_AUDIT.
	DefaultConsumer = wire.AuditConsumer
)

// Config configures the audit sink.
type Config struct {
	// Dir is the Pebble store's directory. Required.
	Dir string
	// Retention is how long an event is kept, judged by its own time.
	// Defaults to DefaultRetention (30 days); KeepForever keeps every event.
	Retention time.Duration
	// RetentionInterval is how often retention runs. Defaults to an hour, or
	// a tenth of Retention when that is shorter (but at least a second).
	RetentionInterval time.Duration
	// Consumer names the durable consumer on GANTRY_AUDIT. Defaults to
	// DefaultConsumer.
	Consumer string
	// BatchSize is the most events written in one synced commit. Defaults
	// to 512.
	BatchSize int
	// AckWait is the consumer's ack deadline. Defaults to 30 s.
	AckWait time.Duration
	// RetryDelay is the first pause after a failed write; it doubles up to
	// MaxRetryDelay. Defaults to 100 ms.
	RetryDelay time.Duration
	// MaxRetryDelay caps RetryDelay. Defaults to 5 s.
	MaxRetryDelay time.Duration
	// MinFreeSpace is the room, in bytes, the store's file system must have
	// before a store that failed (a full disk) is reopened. Defaults to
	// DefaultMinFreeSpace (64 MiB).
	MinFreeSpace uint64
	// ConsumerCheck is how often the consumer is checked for having been
	// deleted (it is recreated, as is a deleted audit stream). Defaults to
	// durable.DefaultCheckInterval (5 s).
	ConsumerCheck time.Duration
	// FS is the file system the store writes through. Defaults to the
	// operating system's.
	FS vfs.FS
	// Logger logs the sink's work. Defaults to discarding it.
	Logger *slog.Logger
	// Clock drives retention and the pauses between write retries.
	// Defaults to the real clock.
	Clock clock.Clock
	// Metrics registers the sink's Prometheus counters (events stored,
	// malformed, expired, write errors). Defaults to none.
	Metrics prometheus.Registerer
}

// Service is the audit sink actor: ingest, query service and retention.
//
// It is an actor (lifecycle.Base): Run blocks until Stop or its context
// ends, and runs once; Ready is closed once the store is open, the consumer
// exists and the query service answers; Stop asks Run to finish the batch
// in hand and return, and is idempotent and safe before Run or after it
// returns.
type Service struct {
	lifecycle.Base
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	log *slog.Logger

	// store and stopping (closed by Stop) are set when Run starts.
	store    *Store
	stopping <-chan struct{}

	stored, malformed, writeErrors, expired atomic.Uint64

	// cons is the durable consumer, once Run has started it.
	cons atomic.Pointer[durable.Consumer]
}

// New validates cfg and returns a sink that consumes through nc.
func New(cfg Config, nc *nats.Conn) (*Service, error) {
	if cfg.Dir == "" {
		return nil, errors.New("auditd: no store directory")
	}
	if nc == nil {
		return nil, errors.New("auditd: no NATS connection")
	}
	if cfg.Retention < 0 && cfg.Retention != KeepForever {
		return nil, fmt.Errorf("auditd: retention %s is negative", cfg.Retention)
	}
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	if cfg.RetentionInterval == 0 {
		cfg.RetentionInterval = time.Hour
		if cfg.Retention > 0 {
			cfg.RetentionInterval = max(min(time.Hour, cfg.Retention/10), time.Second)
		}
	}
	cfg.Consumer = cmp.Or(cfg.Consumer, DefaultConsumer)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 512)
	cfg.AckWait = cmp.Or(cfg.AckWait, 30*time.Second)
	cfg.RetryDelay = cmp.Or(cfg.RetryDelay, 100*time.Millisecond)
	cfg.MaxRetryDelay = cmp.Or(cfg.MaxRetryDelay, 5*time.Second)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	if cfg.BatchSize < 0 || cfg.AckWait < time.Second {
		return nil, fmt.Errorf("auditd: batch size %d and ack wait %s: want a positive size and at least 1s", cfg.BatchSize, cfg.AckWait)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("auditd: jetstream: %w", err)
	}
	s := &Service{cfg: cfg, nc: nc, js: js, log: cfg.Logger}
	if err := s.registerMetrics(cfg.Metrics); err != nil {
		return nil, err
	}
	return s, nil
}

// Healthy returns nil while the sink consumes the audit stream into its
// store, and why not otherwise: before Run has started its consumer, while
// the consumer (or the stream) is being recreated after it was deleted, or
// while the store is failed (a full disk) and not reopened yet.
func (s *Service) Healthy() error {
	c := s.cons.Load()
	if c == nil {
		return errors.New("auditd not consuming yet")
	}
	return errors.Join(c.Healthy(), s.store.Err())
}

// Stats returns the sink's counters.
func (s *Service) Stats() wire.AuditStats {
	ret := "0s"
	if s.cfg.Retention > 0 {
		ret = s.cfg.Retention.String()
	}
	return wire.AuditStats{
		Stored: s.stored.Load(), Malformed: s.malformed.Load(),
		WriteErrors: s.writeErrors.Load(), Expired: s.expired.Load(), Retention: ret,
	}
}

// Run opens the store, consumes the audit stream into it, answers the
// query service and applies retention until Stop (clean, nil) or ctx ends.
// It returns lifecycle.ErrAlreadyRun when called again.
func (s *Service) Run(ctx context.Context) error {
	return lifecycle.Run(ctx, &s.Base, s.run)
}

// run is Run's body.
func (s *Service) run(ctx context.Context, lc *lifecycle.Runner) error {
	s.stopping = lc.Stopping()
	s.removeStaleBackups()
	// A page's reply must fit the broker's message limit, with room for
	// its envelope.
	pageBytes := min(DefaultPageBytes, int(s.nc.MaxPayload())-16<<10)
	store, err := OpenStore(s.cfg.Dir, StoreOptions{Logger: s.log, FS: s.cfg.FS, PageBytes: pageBytes, MinFreeSpace: s.cfg.MinFreeSpace})
	if err != nil {
		return err
	}
	s.store = store
	defer func() {
		if err := store.Close(); err != nil {
			s.log.Warn("close audit store", "err", err)
		}
	}()

	in := make(chan jetstream.Msg, s.cfg.BatchSize)
	cc, err := s.consume(ctx, func(m jetstream.Msg) {
		select {
		case in <- m:
		case <-s.stopping:
		case <-ctx.Done():
		}
	})
	if err != nil || cc == nil {
		return err
	}
	defer cc.Stop()
	s.cons.Store(cc)
	svc, err := s.addService()
	if err != nil {
		return err
	}
	defer func() { _ = svc.Stop() }()

	var wg sync.WaitGroup
	rctx, cancelRetention := context.WithCancel(ctx)
	defer func() { cancelRetention(); wg.Wait() }()
	if s.cfg.Retention > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); s.retentionLoop(rctx) }()
	}

	lc.MarkReady()
	s.log.Info("audit store open", "dir", s.cfg.Dir, "retention", s.Stats().Retention)
	return s.ingest(ctx, in)
}

// consume creates or updates the durable consumer and consumes it into
// handler, retrying while the stream is not there yet. It returns no
// consumer and no error on Stop. The consumer, or the stream, deleted later
// is recreated as provisioned (internal/durable).
func (s *Service) consume(ctx context.Context, handler jetstream.MessageHandler) (*durable.Consumer, error) {
	cc := jetstream.ConsumerConfig{
		Durable:       s.cfg.Consumer,
		Description:   "auditd: every audit event into the Pebble store",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: 4 * s.cfg.BatchSize,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var cons *durable.Consumer
		stream, err := s.js.Stream(tctx, wire.StreamAudit)
		if err == nil {
			cons, err = durable.Start(tctx, s.js, durable.Config{
				Stream: stream.CachedInfo().Config, Consumer: cc, Handler: handler,
				Options:       []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(s.cfg.BatchSize)},
				CheckInterval: s.cfg.ConsumerCheck, Logger: s.log,
			})
		}
		cancel()
		if err == nil {
			return cons, nil
		}
		s.log.Warn("create audit consumer", "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("create consumer %s on %s: %w", s.cfg.Consumer, wire.StreamAudit, err)
		case <-s.stopping:
			return nil, nil
		case <-time.After(time.Second):
		}
	}
}

// ingest writes batches until Stop or ctx ends.
func (s *Service) ingest(ctx context.Context, in <-chan jetstream.Msg) error {
	batch := make([]jetstream.Msg, 0, s.cfg.BatchSize)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return nil
		case <-s.stopping:
			// Write what has arrived; the rest stays unacknowledged and
			// is redelivered to the next run.
			if batch = fill(in, batch); len(batch) > 0 {
				s.write(ctx, batch)
			}
			return nil
		case m := <-in:
			batch = fill(in, append(batch, m))
		}
		s.write(ctx, batch)
	}
}

// fill adds the messages waiting in in to batch, up to its capacity.
func fill(in <-chan jetstream.Msg, batch []jetstream.Msg) []jetstream.Msg {
	for len(batch) < cap(batch) {
		select {
		case m := <-in:
			batch = append(batch, m)
		default:
			return batch
		}
	}
	return batch
}

// write stores one batch and acknowledges it, retrying a failed store
// (reopening it) until the write succeeds, Stop, or ctx ends. Messages not
// written are never acknowledged.
func (s *Service) write(ctx context.Context, msgs []jetstream.Msg) {
	events := make([]wire.Event, 0, len(msgs))
	for _, m := range msgs {
		ev, err := decode(m, s.cfg.Clock)
		if err != nil {
			s.malformed.Add(1)
			s.log.Warn("malformed audit event", "subject", m.Subject(), "err", err)
		}
		events = append(events, ev)
	}
	delay := s.cfg.RetryDelay
	for {
		err := s.store.Recover()
		var added int
		if err == nil {
			added, err = s.store.Write(events)
		}
		if err == nil {
			s.stored.Add(uint64(added))
			for _, m := range msgs {
				if err := m.Ack(); err != nil {
					s.log.Debug("ack audit event", "err", err)
				}
			}
			return
		}
		s.writeErrors.Add(1)
		s.log.Error("write audit batch; retrying, nothing acknowledged", "events", len(events), "err", err, "retry_in", delay)
		for _, m := range msgs {
			_ = m.InProgress()
		}
		if !s.pause(ctx, delay) {
			return
		}
		delay = min(2*delay, s.cfg.MaxRetryDelay)
	}
}

// pause waits d on the service's clock. It reports false if Stop or ctx
// ended the wait.
func (s *Service) pause(ctx context.Context, d time.Duration) bool {
	t := s.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-s.stopping:
		return false
	case <-t.C():
		return true
	}
}

// decode turns a message into the event to store: the event itself, or an
// AUDIT_MALFORMED record describing it (and the error) when it is not a
// valid event. The record's id derives from the stream sequence, so a
// redelivery stores it once.
func decode(m jetstream.Msg, clk clock.Clock) (wire.Event, error) {
	ev, err := parseEvent(m.Data())
	if err == nil {
		return ev, nil
	}
	var seq uint64
	at := clk.Now().UTC()
	if md, merr := m.Metadata(); merr == nil {
		seq, at = md.Sequence.Stream, md.Timestamp.UTC()
	}
	payload, _ := json.Marshal(map[string]any{
		"subject": m.Subject(), "stream_seq": seq, "error": err.Error(), "size": len(m.Data()),
	})
	return wire.Event{
		ID:        fmt.Sprintf("malformed-%d", seq),
		Time:      at,
		Type:      wire.EventAuditMalformed,
		Level:     wire.LevelWarn,
		Component: "auditd",
		Message:   "a message on the audit stream is not a valid event; skipped",
		Payload:   payload,
	}, err
}

// parseEvent decodes and validates the data of a message on the audit
// stream.
func parseEvent(data []byte) (wire.Event, error) {
	var ev wire.Event
	err := json.Unmarshal(data, &ev)
	if err == nil {
		err = Validate(&ev)
	}
	return ev, err
}

// retentionLoop deletes expired events now and every RetentionInterval.
func (s *Service) retentionLoop(ctx context.Context) {
	for {
		cutoff := s.cfg.Clock.Now().Add(-s.cfg.Retention)
		n, err := s.store.DeleteBefore(ctx, cutoff)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Warn("audit retention", "err", err)
		case n > 0:
			s.expired.Add(uint64(n))
			s.log.Info("audit retention", "removed", n, "before", cutoff)
		}
		if !clock.Sleep(ctx, s.cfg.Clock, s.cfg.RetentionInterval) {
			return
		}
	}
}
