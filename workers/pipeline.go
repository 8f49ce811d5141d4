package workers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pipeline publishes into streams without waiting for each
// acknowledgement, as jetstream's PublishAsync does, with less work per
// message: the acknowledgements come to a reply subject of its own, a
// positive one is recognised by its bytes instead of a JSON decode, and one
// sweep times them all out instead of a future and a select per message.
// At four writes per noop task, jetstream's futures (decoding every PubAck,
// registering a future, checking it) took ~9 % of the CPU of
// BenchmarkRatio.
type pipeline struct {
	nc      *nats.Conn
	prefix  string
	timeout time.Duration
	max     int
	// failed handles a publish that failed or timed out and that nobody
	// waits for; it runs on the goroutine of run, one at a time.
	failed func(p *pub, err error)

	sub *nats.Subscription

	mu      sync.Mutex
	room    *sync.Cond // signalled when a publish leaves pending
	seq     uint64
	pending map[uint64]*pub
	closed  bool
	// errs are the failures waiting for failed.
	errs []pubFailure
	kick chan struct{}
}

// pub is one publish waiting for its acknowledgement.
type pub struct {
	msg *nats.Msg
	// eventID is set for an audit event: failed republishes it under it.
	eventID string
	sent    time.Time
	// done, when set, receives the outcome instead of failed.
	done chan error
}

type pubFailure struct {
	p   *pub
	err error
}

// errNotAcknowledged is the failure of a publish not acknowledged within
// the pipeline's timeout.
var errNotAcknowledged = errors.New("not acknowledged")

// errPipelineClosed is returned for a publish after the pipeline stopped.
var errPipelineClosed = errors.New("publish pipeline closed")

func newPipeline(nc *nats.Conn, timeout time.Duration, max int, failed func(*pub, error)) *pipeline {
	p := &pipeline{nc: nc, prefix: nc.NewInbox() + ".", timeout: timeout, max: max, failed: failed,
		pending: map[uint64]*pub{}, kick: make(chan struct{}, 1)}
	p.room = sync.NewCond(&p.mu)
	return p
}

// start subscribes to the acknowledgements; run then handles them.
func (p *pipeline) start() error {
	sub, err := p.nc.Subscribe(p.prefix+"*", p.acknowledged)
	if err != nil {
		return fmt.Errorf("subscribe to acknowledgements: %w", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("subscribe to acknowledgements: %w", err)
	}
	p.sub = sub
	return nil
}

// run times the acknowledgements out and hands failures to failed until
// stop is closed and every publish made before has its outcome; those
// still unacknowledged flushTimeout after stop fail. Publishes made after
// stop fail with errPipelineClosed.
func (p *pipeline) run(stop <-chan struct{}, flushTimeout time.Duration) {
	defer func() { _ = p.sub.Unsubscribe() }()
	tick := time.NewTicker(p.timeout / 10)
	defer tick.Stop()
	var flushed <-chan time.Time
	stopping := false
	for {
		select {
		case <-p.kick:
		case <-tick.C:
			p.expire(time.Now())
		case <-flushed:
			p.expire(time.Now().Add(p.timeout))
		case <-stop:
			stopping = true
			stop = nil
			p.mu.Lock()
			p.closed = true
			p.room.Broadcast()
			p.mu.Unlock()
			timer := time.NewTimer(flushTimeout)
			defer timer.Stop()
			flushed = timer.C
		}
		p.mu.Lock()
		errs := p.errs
		p.errs = nil
		done := stopping && len(p.pending) == 0
		p.mu.Unlock()
		for _, f := range errs {
			p.failed(f.p, f.err)
		}
		if done {
			return
		}
	}
}

// publish sends m with a reply subject of the pipeline's, waiting only
// while max publishes are pending. With done set, done receives the
// outcome; otherwise a failure goes to the pipeline's failed.
func (p *pipeline) publish(m *nats.Msg, eventID string, done chan error) error {
	p.mu.Lock()
	for len(p.pending) >= p.max && !p.closed {
		p.room.Wait()
	}
	if p.closed {
		p.mu.Unlock()
		return errPipelineClosed
	}
	p.seq++
	id := p.seq
	p.pending[id] = &pub{msg: m, eventID: eventID, sent: time.Now(), done: done}
	p.mu.Unlock()
	m.Reply = p.prefix + strconv.FormatUint(id, 10)
	if err := p.nc.PublishMsg(m); err != nil {
		p.mu.Lock()
		delete(p.pending, id)
		p.room.Signal()
		p.mu.Unlock()
		return err
	}
	return nil
}

// acknowledged handles a stream's answer to one publish.
func (p *pipeline) acknowledged(m *nats.Msg) {
	id, err := strconv.ParseUint(m.Subject[len(p.prefix):], 10, 64)
	if err != nil {
		return
	}
	p.mu.Lock()
	pb := p.pending[id]
	if pb == nil {
		p.mu.Unlock()
		return
	}
	delete(p.pending, id)
	p.room.Signal()
	p.mu.Unlock()
	p.settle(pb, ackError(m))
}

// settle hands the outcome of pb to its waiter, or a failure to failed.
func (p *pipeline) settle(pb *pub, err error) {
	if pb.done != nil {
		pb.done <- err
		return
	}
	if err == nil {
		return
	}
	p.mu.Lock()
	p.errs = append(p.errs, pubFailure{pb, err})
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// expire fails the publishes sent more than the timeout before now.
func (p *pipeline) expire(now time.Time) {
	var late []*pub
	p.mu.Lock()
	for id, pb := range p.pending {
		if now.Sub(pb.sent) >= p.timeout {
			delete(p.pending, id)
			late = append(late, pb)
		}
	}
	p.room.Broadcast()
	p.mu.Unlock()
	for _, pb := range late {
		p.settle(pb, errNotAcknowledged)
	}
}

// ackError returns nil for a stream's positive acknowledgement, else what
// the answer says. A positive one has no "error" key: only an error answer
// is decoded.
func ackError(m *nats.Msg) error {
	if len(m.Data) == 0 {
		return fmt.Errorf("no stream answered (status %s)", m.Header.Get("Status"))
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
