// Package durable keeps a component's durable JetStream consumer
// consuming. Anyone with the rights can delete a consumer or its stream
// (`nats consumer rm`, `nats stream rm`); the pull subscription then stops,
// or waits on nothing, without an error a component would see. A Consumer
// checks its consumer every CheckInterval, and at once when a consume error
// hints at it; when the consumer or the stream is gone it recreates them as
// they were provisioned, logs that at WARN, and reports itself unhealthy
// (Healthy, which /readyz reads) until it consumes again.
package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultCheckInterval is Config.CheckInterval unless set.
const DefaultCheckInterval = 5 * time.Second

// Config configures a Consumer.
type Config struct {
	// Stream is the stream's configuration, recreated as it is when the
	// stream is gone. Required: take it from the stream as provisioned.
	Stream jetstream.StreamConfig
	// Consumer is the durable consumer's configuration. Required.
	Consumer jetstream.ConsumerConfig
	// Handler gets every message. Required.
	Handler jetstream.MessageHandler
	// Options tune the consume (jetstream.PullMaxMessages...); the
	// Consumer sets its own error handler.
	Options []jetstream.PullConsumeOpt
	// CheckInterval is how often the consumer is checked. Defaults to
	// DefaultCheckInterval.
	CheckInterval time.Duration
	// Logger receives the warnings. Defaults to discarding them.
	Logger *slog.Logger
}

// Consumer is a durable consumer kept consuming. Start it with Start, end
// it with Stop.
type Consumer struct {
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	once sync.Once

	// goneAt is when the watch found the consumer gone (zero while it
	// consumes).
	goneAt time.Time

	mu     sync.Mutex
	cons   jetstream.Consumer
	cc     jetstream.ConsumeContext
	broken error
}

// Start creates (or updates) the consumer and starts consuming; the stream
// must exist. It returns once the consumer consumes.
func Start(ctx context.Context, js jetstream.JetStream, cfg Config) (*Consumer, error) {
	cfg.CheckInterval = cmp.Or(cfg.CheckInterval, DefaultCheckInterval)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	c := &Consumer{
		js: js, cfg: cfg, log: cfg.Logger,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	if err := c.consume(ctx); err != nil {
		return nil, err
	}
	go c.watch()
	return c, nil
}

// Consumer returns the consumer as last created.
func (c *Consumer) Consumer() jetstream.Consumer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cons
}

// Healthy returns nil while the consumer consumes, and why not otherwise.
func (c *Consumer) Healthy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

// Stop stops consuming and watching, and waits for the watch to end. It is
// idempotent. Messages delivered before may still be in the handler.
func (c *Consumer) Stop() {
	c.once.Do(func() { close(c.stop) })
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cc != nil {
		c.cc.Stop()
	}
}

// consume creates the consumer and consumes it.
func (c *Consumer) consume(ctx context.Context) error {
	name := c.cfg.Consumer.Durable
	cons, err := c.js.CreateOrUpdateConsumer(ctx, c.cfg.Stream.Name, c.cfg.Consumer)
	if err != nil {
		return fmt.Errorf("consumer %s on %s: %w", name, c.cfg.Stream.Name, err)
	}
	opts := append(c.cfg.Options[:len(c.cfg.Options):len(c.cfg.Options)], jetstream.ConsumeErrHandler(c.consumeError))
	cc, err := cons.Consume(c.cfg.Handler, opts...)
	if err != nil {
		return fmt.Errorf("consume %s on %s: %w", name, c.cfg.Stream.Name, err)
	}
	c.mu.Lock()
	c.cons, c.cc, c.broken = cons, cc, nil
	c.mu.Unlock()
	return nil
}

// consumeError handles an error of the pull subscription: one that hints
// that the consumer or its stream is gone has it checked at once.
func (c *Consumer) consumeError(_ jetstream.ConsumeContext, err error) {
	switch {
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound),
		errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, nats.ErrNoResponders):
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	if !errors.Is(err, jetstream.ErrNoHeartbeat) {
		c.log.Debug("consume", "consumer", c.cfg.Consumer.Durable, "err", err)
	}
}

// watch checks the consumer every CheckInterval, and when kicked, until
// Stop.
func (c *Consumer) watch() {
	defer close(c.done)
	t := time.NewTicker(c.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-c.kick:
		}
		c.check()
	}
}

// check finds out whether the consumer is gone, and recreates what is:
// the stream, as provisioned, and the consumer. It waits a CheckInterval
// after it found them gone: nats-server may still be removing a deleted
// stream's files (a stream recreated at once can lose its own to that, a
// write error that sticks), and a worker started with other settings for
// the queue removes the consumers of the former ones to create its own,
// which must win. A consumer whose subjects another consumer of the work
// queue now takes is not recreated while that one is there.
func (c *Consumer) check() {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CheckInterval)
	defer cancel()
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	c.mu.Lock()
	cons, cc := c.cons, c.cc
	c.mu.Unlock()
	name, stream := c.cfg.Consumer.Durable, c.cfg.Stream.Name
	var gone error
	select {
	case <-cc.Closed():
		gone = errors.New("its pull subscription ended")
	default:
		if _, err := cons.Info(ctx); errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			gone = err
		}
	}
	if gone == nil {
		return
	}
	if c.goneAt.IsZero() {
		c.goneAt = time.Now()
		c.mu.Lock()
		c.broken = fmt.Errorf("consumer %s on %s is gone (%v); recreating it", name, stream, gone)
		c.mu.Unlock()
		c.log.Warn("consumer gone: nothing is consumed until it is recreated", "consumer", name, "stream", stream, "err", gone)
		cc.Stop()
		return
	}
	if time.Since(c.goneAt) < c.cfg.CheckInterval {
		return
	}
	if _, err := c.js.Stream(ctx, stream); errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = c.js.CreateStream(ctx, c.cfg.Stream)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			c.log.Warn("recreate stream; retrying", "stream", stream, "err", err)
			return
		}
		c.log.Warn("stream was gone: recreated as provisioned (what it held is lost)", "stream", stream)
	}
	err := c.consume(ctx)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeNotUnique {
		c.mu.Lock()
		c.broken = fmt.Errorf("consumer %s on %s is gone and another consumer takes its subjects (a worker with other settings for the queue?)", name, stream)
		c.mu.Unlock()
		return
	}
	if err != nil {
		c.log.Warn("recreate consumer; retrying", "consumer", name, "stream", stream, "err", err)
		return
	}
	c.goneAt = time.Time{}
	c.log.Warn("consumer recreated", "consumer", name, "stream", stream)
}

// errCodeNotUnique is nats-server's error for a consumer whose filter
// overlaps another's on a work-queue stream.
const errCodeNotUnique jetstream.ErrorCode = 10100
