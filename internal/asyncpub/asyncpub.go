// Package asyncpub publishes into JetStream streams without waiting for
// each acknowledgement, and checks every one later. It is how the
// components keep round trips off their hot paths (audit events, task
// records, job states, fired tasks) without losing a write: a publish that
// failed (an error answer, no answer in time) is published again,
// synchronously, under its Nats-Msg-Id, so the stream stores it once; one
// that cannot be is logged. Flush waits for all of them.
//
// A write without a Nats-Msg-Id (a KV put) is published again only by
// Settle, whose caller waits for it: repeated later, unseen, it could land
// after a newer write of the same key.
//
// # Why not jetstream's PublishMsgAsync
//
// nats.go's jetstream does the same with futures (PublishMsgAsync,
// WithPublishAsyncMaxPending, WithPublishAsyncTimeout,
// PublishAsyncComplete), and the first version of this package was built
// on them, with the same API. On the workers' hot path (four writes per
// noop task) it was clearly slower. BenchmarkRatio (./workers/,
// -benchtime 1x -count 3, builds alternating for four rounds, 2026-12-01,
// load 4-9), gantry noop tasks as a share of raw JetStream, median (range):
//
//	                                      run 1               run 2
//	jetstream futures                     16.8 % (14.9-21.3)  19.0 % (16.2-22.2)
//	the workers' own pipeline, before     20.3 % (14.9-27.2)  22.3 % (17.9-25.3)
//	this package (the pipeline, shared)   -                   22.0 % (15.9-30.0)
//
// The library's CPU profile shows why: it decodes every acknowledgement as
// JSON (4.2 % of all the CPU of the run, the brokers' included), registers
// a future per publish with a random reply token and a timer (2.3 %), and
// each future is then checked (1.1 %).
//
// So a Publisher takes the answers itself: acknowledgements come to a
// reply subject of its own, a positive one is recognised by its bytes
// (only an error answer is decoded; Future.Ack decodes on demand), and one
// timer sweeps out those not answered in time. It keeps the library's
// errors (jetstream.APIError, ErrNoStreamResponse, ErrAsyncPublishTimeout)
// and PubAck, and republishes with the library's synchronous PublishMsg.
package asyncpub

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/kv"
)

// Defaults of Config.
const (
	DefaultMaxPending = 4000
	DefaultTimeout    = 10 * time.Second
	DefaultRetries    = 1
)

// Config configures a Publisher.
type Config struct {
	// MaxPending bounds the publishes waiting for their acknowledgement; a
	// publish past it waits for room. Defaults to 4000.
	MaxPending int
	// Timeout bounds the wait for an acknowledgement, and each synchronous
	// republish. Defaults to 10 s.
	Timeout time.Duration
	// Retries is how many times a failed publish is published again,
	// synchronously, before it is logged as lost. Defaults to 1.
	Retries int
	// Patience is how long a republish waits for a stream that does not
	// answer now (a cluster electing the stream's new leader, a reply lost
	// with a broker that died), trying again, before it counts as a
	// failed retry. Defaults to 0: it is not waited for.
	Patience time.Duration
	// Logger receives the publishes that failed for good. Defaults to
	// discarding them.
	Logger *slog.Logger
}

// Publisher publishes messages without waiting and checks their
// acknowledgements. It is safe for concurrent use.
type Publisher struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	cfg Config
	// prefix is the reply subject of the acknowledgements, before the
	// publish's sequence number.
	prefix string

	subOnce sync.Once
	subErr  error

	mu      sync.Mutex
	room    *sync.Cond // signalled when a publish leaves pending
	seq     uint64
	pending map[uint64]*pub
	// sweep times out unanswered publishes; armed while pending is not
	// empty.
	sweep *time.Timer
	armed bool
	// failed are the failed publishes waiting for their republish, which
	// one goroutine makes while retrying is set.
	failed   []*pub
	retrying bool
	// idle, when a Flush waits, is closed once nothing is pending or
	// being retried.
	idle chan struct{}
}

// pub is one publish waiting for its acknowledgement.
type pub struct {
	msg *nats.Msg
	// id is the Nats-Msg-Id a republish carries; empty means the
	// message's own.
	id   string
	sent time.Time
	// done, set for Async, receives the outcome instead of the checks.
	done chan outcome
	// err is the failure of a publish in failed.
	err error
}

type outcome struct {
	ack []byte
	err error
}

// Future is a publish made with Async, for Settle.
type Future struct {
	msg  *nats.Msg
	done chan outcome
	// err is why the publish could not be sent at all.
	err error
	// raw is the stream's acknowledgement, as it came; ack is it decoded,
	// or that of a republish.
	raw []byte
	ack *jetstream.PubAck
}

// Ack returns the stream's acknowledgement of f, once Settle returned nil.
// It is decoded on demand: Settle recognises a positive one by its bytes.
func (f *Future) Ack() (*jetstream.PubAck, error) {
	if f.ack == nil {
		var ack jetstream.PubAck
		if err := json.Unmarshal(f.raw, &ack); err != nil {
			return nil, fmt.Errorf("bad acknowledgement %q: %w", f.raw, err)
		}
		f.ack = &ack
	}
	return f.ack, nil
}

// New returns a publisher on nc. It subscribes to its acknowledgements at
// its first publish.
func New(nc *nats.Conn, cfg Config) (*Publisher, error) {
	cfg.MaxPending = cmp.Or(cfg.MaxPending, DefaultMaxPending)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.Retries = cmp.Or(cfg.Retries, DefaultRetries)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("async publisher: %w", err)
	}
	p := &Publisher{nc: nc, js: js, cfg: cfg, prefix: nc.NewInbox() + ".", pending: map[uint64]*pub{}}
	p.room = sync.NewCond(&p.mu)
	return p, nil
}

// Publish publishes m without waiting for its acknowledgement; it waits
// only while MaxPending publishes are. A failed publish is published
// again, synchronously, with the Nats-Msg-Id id, or m's own when id is
// empty; one with neither is logged. Publish sets m.Reply.
func (p *Publisher) Publish(m *nats.Msg, id string) {
	if err := p.send(&pub{msg: m, id: id}); err != nil {
		_, _ = p.republish(context.Background(), m, id, err, false)
	}
}

// Async publishes m as Publish does and returns the publish for Settle,
// for a caller that needs its outcome. Flush waits for it too.
func (p *Publisher) Async(m *nats.Msg) *Future {
	f := &Future{msg: m, done: make(chan outcome, 1)}
	f.err = p.send(&pub{msg: m, done: f.done})
	return f
}

// Settle waits for the acknowledgement of f; if the publish failed, it
// publishes the message again, synchronously (with the Nats-Msg-Id id, or
// its own; with none if it has none). It returns nil once the stream has
// the message (f.Ack tells how), the failure otherwise.
func (p *Publisher) Settle(ctx context.Context, f *Future, id string) error {
	cause := f.err
	if cause == nil {
		select {
		case o := <-f.done:
			if cause = o.err; cause == nil {
				f.raw = o.ack
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ack, err := p.republish(ctx, f.msg, id, cause, true)
	f.ack = ack
	return err
}

// Flush waits until every publish has its outcome and the failed ones
// their republish, or until ctx ends.
func (p *Publisher) Flush(ctx context.Context) error {
	for {
		p.mu.Lock()
		if len(p.pending) == 0 && !p.retrying {
			p.mu.Unlock()
			return nil
		}
		if p.idle == nil {
			p.idle = make(chan struct{})
		}
		idle, n := p.idle, len(p.pending)+len(p.failed)
		p.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return fmt.Errorf("wait for %d acknowledgements: %w", n, ctx.Err())
		}
	}
}

// send publishes pb's message with a reply subject of the publisher's.
func (p *Publisher) send(pb *pub) error {
	p.subOnce.Do(p.subscribe)
	if p.subErr != nil {
		return p.subErr
	}
	p.mu.Lock()
	for len(p.pending) >= p.cfg.MaxPending {
		p.room.Wait()
	}
	p.seq++
	seq := p.seq
	pb.sent = time.Now()
	p.pending[seq] = pb
	if !p.armed {
		p.armed = true
		p.sweep.Reset(p.cfg.Timeout / 10)
	}
	p.mu.Unlock()
	pb.msg.Reply = p.prefix + strconv.FormatUint(seq, 10)
	if err := p.nc.PublishMsg(pb.msg); err != nil {
		p.mu.Lock()
		delete(p.pending, seq)
		p.room.Signal()
		p.idleLocked()
		p.mu.Unlock()
		return err
	}
	return nil
}

// subscribe subscribes to the acknowledgements and makes the sweep timer.
func (p *Publisher) subscribe() {
	sub, err := p.nc.Subscribe(p.prefix+"*", p.acknowledged)
	if err == nil {
		err = sub.SetPendingLimits(-1, -1)
	}
	if err != nil {
		p.subErr = fmt.Errorf("subscribe to acknowledgements: %w", err)
		return
	}
	p.sweep = time.AfterFunc(time.Hour, p.expire)
	p.sweep.Stop()
}

// acknowledged handles a stream's answer to one publish.
func (p *Publisher) acknowledged(m *nats.Msg) {
	seq, err := strconv.ParseUint(m.Subject[len(p.prefix):], 10, 64)
	if err != nil {
		return
	}
	ackErr := ackError(m)
	p.mu.Lock()
	pb := p.pending[seq]
	if pb == nil {
		p.mu.Unlock()
		return
	}
	delete(p.pending, seq)
	p.room.Signal()
	p.settleLocked(pb, ackErr)
	p.mu.Unlock()
	if pb.done != nil {
		pb.done <- outcome{ack: m.Data, err: ackErr}
	}
}

// expire fails the publishes not answered within the timeout.
func (p *Publisher) expire() {
	var late []*pub
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for seq, pb := range p.pending {
		if now.Sub(pb.sent) >= p.cfg.Timeout {
			delete(p.pending, seq)
			late = append(late, pb)
		}
	}
	p.room.Broadcast()
	for _, pb := range late {
		p.settleLocked(pb, jetstream.ErrAsyncPublishTimeout)
		if pb.done != nil {
			pb.done <- outcome{err: jetstream.ErrAsyncPublishTimeout}
		}
	}
	if len(p.pending) > 0 {
		p.sweep.Reset(p.cfg.Timeout / 10)
	} else {
		p.armed = false
	}
}

// settleLocked queues a failed publish that nobody waits for to be
// published again, and wakes a waiting Flush when nothing is left.
func (p *Publisher) settleLocked(pb *pub, err error) {
	if pb.done == nil && err != nil {
		pb.err = err
		p.failed = append(p.failed, pb)
		if !p.retrying {
			p.retrying = true
			go p.retryFailed()
		}
	}
	p.idleLocked()
}

// idleLocked closes idle once nothing is pending or being retried.
func (p *Publisher) idleLocked() {
	if p.idle != nil && len(p.pending) == 0 && !p.retrying {
		close(p.idle)
		p.idle = nil
	}
}

// retryFailed publishes the failed publishes again, one at a time, until
// none is left.
func (p *Publisher) retryFailed() {
	for {
		p.mu.Lock()
		if len(p.failed) == 0 {
			p.retrying = false
			p.idleLocked()
			p.mu.Unlock()
			return
		}
		pb := p.failed[0]
		p.failed[0] = nil
		p.failed = p.failed[1:]
		p.mu.Unlock()
		_, _ = p.republish(context.Background(), pb.msg, pb.id, pb.err, false)
	}
}

// republish publishes m again, synchronously, under the Nats-Msg-Id id (or
// m's own), up to Retries times, after its publish failed with cause. A
// message with no id is published again only if always is set; otherwise
// it is logged.
func (p *Publisher) republish(ctx context.Context, m *nats.Msg, id string, cause error, always bool) (*jetstream.PubAck, error) {
	id = cmp.Or(id, m.Header.Get(jetstream.MsgIDHeader))
	if id == "" && !always {
		p.cfg.Logger.Warn("publish failed", "subject", m.Subject, "err", cause)
		return nil, cause
	}
	c := withMsgID(m, id)
	err := cause
	for range p.cfg.Retries {
		ack, perr := p.publishPatiently(ctx, c)
		if perr == nil {
			return ack, nil
		}
		err = errors.Join(cause, perr)
		if ctx.Err() != nil {
			break
		}
	}
	p.cfg.Logger.Error("message lost", "subject", m.Subject, "err", err)
	return nil, err
}

// publishPatiently publishes m, waiting up to Patience for a stream that
// does not answer now.
func (p *Publisher) publishPatiently(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
	var ack *jetstream.PubAck
	publish := func(ctx context.Context) error {
		var err error
		ack, err = p.js.PublishMsg(ctx, m)
		return err
	}
	var err error
	if p.cfg.Patience <= 0 {
		rctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
		defer cancel()
		err = publish(rctx)
	} else {
		pctx, cancel := context.WithTimeout(ctx, p.cfg.Patience)
		defer cancel()
		err = kv.Retry(pctx, p.cfg.Timeout, publish)
	}
	return ack, err
}

// withMsgID is a copy of m without its reply subject, its headers
// included, with the Nats-Msg-Id id (none when id is empty).
func withMsgID(m *nats.Msg, id string) *nats.Msg {
	c := nats.NewMsg(m.Subject)
	c.Data = m.Data
	for k, v := range m.Header {
		c.Header[k] = v
	}
	if id != "" {
		c.Header.Set(jetstream.MsgIDHeader, id)
	}
	return c
}

// ackError returns nil for a stream's positive acknowledgement, else what
// the answer says. A positive one has no "error" key: only an error answer
// is decoded.
func ackError(m *nats.Msg) error {
	if len(m.Data) == 0 {
		if status := m.Header.Get("Status"); status != "503" {
			return fmt.Errorf("no acknowledgement (status %s)", status)
		}
		return jetstream.ErrNoStreamResponse
	}
	if !bytes.Contains(m.Data, []byte(`"error":`)) {
		return nil
	}
	var r struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil || r.Error == nil {
		return fmt.Errorf("bad acknowledgement %q", m.Data)
	}
	return r.Error
}
