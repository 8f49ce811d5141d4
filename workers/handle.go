package workers

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/asyncpub"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/lease"
	"github.com/gantry-dev/gantry/tasks"
)

// taskID is a task's id: its own, else its Nats-Msg-Id when that can name a
// task, else a ULID derived from the message's time and stream sequence,
// the same on every delivery.
func taskID(t wire.Task, msgID string, ts time.Time, seq uint64) string {
	if t.ID != "" {
		return t.ID
	}
	if wire.ValidTaskID(msgID) {
		return msgID
	}
	var entropy [10]byte
	binary.BigEndian.PutUint64(entropy[2:], seq)
	var u ulid.ULID
	_ = u.SetTime(ulid.Timestamp(ts))
	_ = u.SetEntropy(entropy[:])
	return u.String()
}

// origin is what a task message tells of where the task came from: the
// header that may name it, when it was first stored and at which stream
// sequence. A message a prioritized queue's sorter moved to gantry.ready
// carries those of the original on gantry.tasks.
func origin(subject string, h nats.Header, ts time.Time, seq uint64) (msgID string, created time.Time, intakeSeq uint64, sorted bool) {
	if !strings.HasPrefix(subject, wire.SubjectReadyPrefix+".") || h.Get(wire.HeaderTaskID) == "" {
		return h.Get(jetstream.MsgIDHeader), ts, seq, false
	}
	created, err := time.Parse(time.RFC3339Nano, h.Get(wire.HeaderIntakeTime))
	if err != nil {
		created = ts
	}
	intakeSeq, _ = strconv.ParseUint(h.Get(wire.HeaderIntakeSeq), 10, 64)
	return h.Get(wire.HeaderTaskID), created, intakeSeq, true
}

// The payloads of the events every task emits, as structs: a map costs an
// allocation and a sort of its keys per event. Fields are in key order, so
// the JSON is what the map gave.
type (
	createdPayload struct {
		Queue string `json:"queue"`
		Seq   uint64 `json:"seq"`
		Type  string `json:"type"`
	}
	startedPayload struct {
		Attempt int    `json:"attempt"`
		Type    string `json:"type"`
		Worker  string `json:"worker"`
	}
	finishedPayload struct {
		Attempts int             `json:"attempts"`
		Result   json.RawMessage `json:"result,omitempty"`
		Run      int             `json:"run"`
		State    wire.TaskState  `json:"state"`
	}
)

// runOf is the run a task message's headers number, as the record keeps
// it: 0 (omitted) for the first.
func runOf(h nats.Header) int {
	if n := wire.TaskRun(h); n > 1 {
		return n
	}
	return 0
}

// interruptedDelay is when a task interrupted by a stopping worker is
// delivered again.
const interruptedDelay = 3 * time.Second

// delivery is one delivery of a task message being handled.
type delivery struct {
	w    *Workers
	msg  jetstream.Msg
	meta *jetstream.MsgMetadata
	sp   *spec
	task wire.Task
	pol  Policy
	rec  wire.TaskRecord
	// arrived and intakeSeq are when and where the task entered the
	// stream (the broker's time and sequence): its place in a resource's
	// line.
	arrived   time.Time
	intakeSeq uint64

	// replayed marks a delivery a consumer made again after forgetting it
	// (see spec.replayed): its delivery count may say 1.
	replayed bool

	// sent are the audit events of the delivery whose acknowledgement its
	// ack, nak or term waits for.
	sent []sentEvent

	// mu orders the state writes of the delivery: the delayed RUNNING
	// write never lands after the final one.
	mu    sync.Mutex
	final bool

	// readyAt is when the task could first start this delivery: its
	// creation, its not_before or its retry's due time.
	readyAt time.Time
	// pm are the metrics of the task's queue and type, once resolved.
	pm *pairMetrics
}

// metrics returns the series of the delivery's queue and type.
func (d *delivery) metrics() *pairMetrics {
	if d.pm == nil {
		d.pm = d.w.metrics.pair(d.rec.Queue, d.rec.Type)
	}
	return d.pm
}

// process handles one delivered message from decoding to its ack, nak or
// term.
func (w *Workers) process(ctx context.Context, sp *spec, m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		w.log.Error("message without metadata", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return
	}
	if sp.lane != nil {
		sp.lane.delivered(meta.NumPending)
	}
	d := &delivery{w: w, msg: m, meta: meta, sp: sp, replayed: w.suspect(ctx, sp, meta)}
	d.run(ctx)
}

func (d *delivery) run(ctx context.Context) {
	w, m, meta := d.w, d.msg, d.meta
	now := w.cfg.Clock.Now()
	queue, typ, err := wire.ParseTaskSubject(m.Subject())
	if err != nil {
		queue, typ = d.sp.queue.Name, "unknown"
	}
	task, decErr := DecodeTask(m.Data(), w.cfg.MaxPayload)
	if decErr != nil {
		// A rejected task keeps the id its publisher gave it, so that it
		// can be found by it.
		task.ID = publishedID(m.Data())
	}
	d.task = task
	msgID, created, intakeSeq, sorted := origin(m.Subject(), m.Headers(), meta.Timestamp, meta.Sequence.Stream)
	id := taskID(task, msgID, created, intakeSeq)
	d.arrived, d.intakeSeq = created, intakeSeq
	d.rec = wire.TaskRecord{
		TaskInfo: wire.TaskInfo{ID: id, Type: typ, Queue: queue, State: wire.TaskWaiting,
			Resource: task.Resource, CreatedAt: created, UpdatedAt: now},
		Deliveries: int(meta.NumDelivered), MaxAttempts: task.MaxAttempts, Priority: task.Priority,
		Key: task.Key, NotBefore: task.NotBefore, Seq: meta.Sequence.Stream, Worker: w.cfg.Name,
		Job: jobOf(m.Headers()),
		Run: runOf(m.Headers()),
	}
	if decErr == nil && err != nil {
		decErr = fmt.Errorf("%w: %v", ErrBadTask, err)
	}
	if decErr != nil {
		d.reject(ctx, decErr)
		return
	}
	d.pol = w.cfg.policy(d.sp.queue, typ)
	if task.MaxAttempts > 0 {
		d.pol.MaxAttempts = task.MaxAttempts
	}
	if task.Timeout != "" {
		d.pol.Timeout, _ = time.ParseDuration(task.Timeout)
	}
	d.pol.Timeout = min(d.pol.Timeout, d.pol.MaxRuntime)
	d.rec.MaxAttempts = d.pol.MaxAttempts

	// A redelivery: what happened before is in the task's record (also
	// for a delivery the consumer forgot and made again as a first one: a
	// task whose end is recorded never starts again). A sorted task may
	// have been cancelled while it waited for its turn.
	if !w.claim(id) {
		// Delivered again while this process handles it (a replay after
		// a failover): the delivery under way settles the message.
		w.log.Info("task delivered again while it runs", "task_id", id)
		return
	}
	defer w.release(id)
	if meta.NumDelivered > 1 || sorted || d.replayed {
		var prev wire.TaskRecord
		err := d.persist(ctx, func(ctx context.Context) error {
			var err error
			prev, _, err = w.tasks.Get(ctx, id)
			if errors.Is(err, tasks.ErrNotFound) {
				return nil
			}
			return err
		})
		switch {
		case errors.Is(err, kv.ErrBadValue):
			// Any client can write garbage over a record: it tells nothing,
			// and the next write of the task replaces it.
			d.quarantined(err)
			d.lostAttempts(wire.TaskRecord{})
		case err != nil:
			w.log.Warn("read task state", "task_id", id, "err", err)
			d.nak(time.Second)
			return
		case prev.ID == "":
			d.lostAttempts(wire.TaskRecord{})
		case prev.Seq == 0 || prev.Seq == meta.Sequence.Stream || (sorted && prev.Seq == intakeSeq):
			d.rec.CreatedAt = prev.CreatedAt
			if prev.RetryAt != nil {
				d.readyAt = *prev.RetryAt
			}
			d.rec.Delays = prev.Delays
			d.rec.LastError = prev.LastError
			// The end is emitted again, as the same event: the process
			// that recorded it may have died before the audit stream had it.
			switch prev.State {
			case wire.TaskSucceeded:
				d.sent = w.emitSent(d.sent, finishedEvent(prev, wire.LevelInfo, "task succeeded", prev.Result))
				d.ack()
				return
			case wire.TaskNeedsReview:
				d.sent = w.emitSent(d.sent, finishedEvent(prev, wire.LevelWarn, "task needs review", nil))
				d.term("already in NEEDS_REVIEW")
				return
			case wire.TaskCancelled:
				job := d.rec.Job
				d.rec = prev
				d.rec.Job = cmp.Or(prev.Job, job)
				d.finishCancelled(ctx)
				return
			}
			d.lostAttempts(prev)
		}
	}

	if task.Key != "" {
		var owner string
		err := d.persist(ctx, func(ctx context.Context) error {
			var err error
			owner, err = w.cps.ClaimKey(ctx, task.Key, id, w.cfg.KeyTTL)
			return err
		})
		if err != nil {
			w.log.Warn("claim task key", "task_id", id, "err", err)
			d.nak(time.Second)
			return
		}
		if owner != id {
			d.emit(wire.Event{Type: wire.EventTaskRejected, Level: wire.LevelInfo,
				Message: fmt.Sprintf("duplicate: key %q belongs to task %s", task.Key, owner),
				Payload: audit.Payload(map[string]any{"key": task.Key, "duplicate_of": owner})})
			d.term("duplicate key")
			return
		}
	}

	attempt := int(meta.NumDelivered) - d.rec.Delays
	d.rec.Attempts = attempt - 1
	if attempt > d.pol.MaxAttempts {
		d.needsReview(ctx, fmt.Errorf("attempts exhausted: %d deliveries ended without an outcome (did a worker stop or crash?)", attempt-1))
		return
	}
	if task.NotBefore != nil && now.Before(*task.NotBefore) {
		d.delay(ctx, task.NotBefore.Sub(now), wire.TaskWaiting, fmt.Errorf("not before %s", task.NotBefore.Format(time.RFC3339)))
		return
	}
	d.rec.Attempts = attempt
	d.execute(ctx, attempt)
}

// execute runs the handler of one attempt and settles the message.
func (d *delivery) execute(ctx context.Context, attempt int) {
	w, m := d.w, d.msg
	id := d.rec.ID
	first := attempt == 1 && d.meta.NumDelivered == 1
	if first && m.Headers().Get(wire.HeaderCreated) == "" {
		d.emit(wire.Event{Type: wire.EventTaskCreated,
			Message: "task received", Payload: audit.Payload(createdPayload{Queue: d.rec.Queue, Seq: d.rec.Seq, Type: d.rec.Type})})
	}
	tctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	untrack := w.track(wire.RunningTask{ID: id, Queue: d.rec.Queue, Type: d.rec.Type, Attempt: attempt,
		Resource: d.rec.Resource, StartedAt: time.Now().UTC()}, cancel)
	defer untrack()

	var holder *lease.ResourceHolder
	stateDelay := w.cfg.StateDelay
	if d.rec.Resource != "" {
		// A task that cannot run at all does not take its resource.
		if c, ok := w.handler(d.rec.Type).(checker); ok {
			if err := c.check(&Task{ID: id, Type: d.rec.Type, Queue: d.rec.Queue, Attempt: attempt, Payload: d.task.Payload, Resource: d.rec.Resource}); err != nil {
				d.settle(context.WithoutCancel(ctx), &Task{ID: id}, err)
				return
			}
		}
		var waited, ok bool
		if holder, waited, ok = d.lease(ctx, tctx, cancel); !ok {
			return
		}
		stop := context.AfterFunc(holder.Context(), func() { cancel(ErrLost) })
		defer stop()
		if waited {
			// The WAITING record counted this delivery as a delay: the
			// RUNNING write takes that back at once.
			stateDelay = 0
		}
	}

	d.emit(wire.Event{Type: wire.EventTaskStarted,
		Message: "task started", Payload: audit.Payload(startedPayload{Attempt: attempt, Type: d.rec.Type, Worker: w.cfg.Name})})

	start := time.Now()
	pm := d.metrics()
	pm.wait.Observe(max(w.cfg.Clock.Now().Sub(d.ready()), 0).Seconds())
	pm.running.Inc()
	deadline := w.cfg.Clock.Now().Add(d.pol.Timeout)
	tctx, cancelTimeout := context.WithTimeoutCause(tctx, d.pol.Timeout, ErrTimeout)
	defer cancelTimeout()

	// RUNNING is written only if the task outlives StateDelay.
	runningTimer := time.AfterFunc(stateDelay, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.final {
			return
		}
		rec := d.rec
		rec.State = wire.TaskRunning
		rec.UpdatedAt = w.cfg.Clock.Now()
		rec.RetryAt = nil
		m, err := w.tasks.PutMsg(rec)
		if err != nil {
			w.log.Warn("write task state", "task_id", rec.ID, "state", rec.State, "err", err)
			return
		}
		w.pub.Publish(m, "")
	})
	defer runningTimer.Stop()

	// Heartbeat: keep the delivery while the task runs. A timer, not a
	// goroutine, so that short tasks cost nothing.
	hb := newHeartbeat(max(d.sp.queue.AckWait/3, 10*time.Millisecond), func() {
		if err := m.InProgress(); err != nil {
			w.log.Debug("heartbeat", "task_id", id, "err", err)
		}
	})
	defer hb.stop()

	live := w.newLiveOutput(id, attempt, d.task.Payload)
	untrackOutput := w.trackOutput(id, live)
	defer untrackOutput()
	t := &Task{ID: id, Type: d.rec.Type, Queue: d.rec.Queue, Attempt: attempt, Payload: d.task.Payload,
		Resource: d.rec.Resource, Deadline: deadline, cps: w.cps, live: live}
	if holder != nil {
		t.LeaseRevision = holder.Lease().Revision
	}
	err := d.call(tctx, t)
	pm.run.Observe(time.Since(start).Seconds())
	pm.running.Dec()
	live.close()
	// The attempt has ended: no RUNNING write from now on, and the one
	// under way (it reads d.rec) is over before d.rec changes.
	d.mu.Lock()
	d.final = true
	d.mu.Unlock()
	if err != nil {
		if cause := context.Cause(tctx); cause != nil && tctx.Err() != nil {
			switch {
			case errors.Is(cause, ErrTimeout):
				err = fmt.Errorf("timed out after %v: %w", d.pol.Timeout, err)
			case errors.Is(cause, ErrCancelled), errors.Is(cause, errInterrupted), errors.Is(cause, ErrLost):
				err = fmt.Errorf("%w: %w", cause, err)
			case ctx.Err() != nil:
				err = fmt.Errorf("%w: %w", errInterrupted, err)
			}
		}
	}
	d.rec.Output = redactOutput(t.Output(), d.task.Payload)
	w.log.Debug("attempt ended", "task_id", id, "attempt", attempt, "duration", time.Since(start), "err", err)
	if holder != nil {
		if ferr := holder.Finish(context.WithoutCancel(ctx), lease.OutcomeOf(err)); ferr != nil {
			w.log.Warn("release resource", "task_id", id, "resource_id", d.rec.Resource, "err", ferr)
		}
	}
	d.settle(context.WithoutCancel(ctx), t, err)
}

// lease takes the task's resource and moves it to RUNNING. While another
// owner holds the resource, or it is DISABLED or FAULT, the task waits in
// the resource's line (lease.Resources.LeaseWait): its delivery is kept
// with heartbeats, so the wait uses up no attempt, and it starts the moment
// its turn comes. tctx ends the wait (a cancel, an interrupt); cancel is
// its cancel function, with which a stopping worker hands a waiting task
// back at once. If the task cannot start, lease settles the delivery and
// returns false; waited reports whether the task waited in line.
func (d *delivery) lease(ctx, tctx context.Context, cancel context.CancelCauseFunc) (h *lease.ResourceHolder, waited, ok bool) {
	w := d.w
	owner := w.cfg.Name + "/" + d.rec.ID
	place := lease.Place{Arrived: d.arrived, Seq: d.intakeSeq, TaskID: d.rec.ID, Job: d.rec.Job}
	if d.sp.queue.Prioritized {
		place.Priority = d.task.Priority
	}
	stopping := context.AfterFunc(w.stopping, func() { cancel(errInterrupted) })
	since := time.Now()
	hb := newHeartbeat(max(d.sp.queue.AckWait/3, 10*time.Millisecond), func() {
		if err := d.msg.InProgress(); err != nil {
			w.log.Debug("heartbeat", "task_id", d.rec.ID, "err", err)
		}
	})
	h, err := w.resources.LeaseWait(tctx, d.rec.Resource, owner, w.cfg.LeaseTTL, lease.WaitOptions{
		Place: place,
		OnChange: func(s lease.WaitStatus) {
			if !waited {
				waited = true
				d.writeWaiting(s)
			}
		},
	})
	hb.stop()
	stopping()
	if err == nil && time.Since(since) >= d.sp.queue.AckWait && d.endedMeanwhile(ctx) {
		_ = h.Finish(context.WithoutCancel(ctx), lease.Outcome{})
		return nil, waited, false
	}
	if err == nil {
		if err = h.Start(ctx); err != nil {
			_ = h.Finish(context.WithoutCancel(ctx), lease.Outcome{})
		}
	}
	if err == nil {
		return h, waited, true
	}
	// The task did not run: this delivery is not an attempt.
	d.rec.Attempts--
	cause := context.Cause(tctx)
	ctx = context.WithoutCancel(ctx)
	switch {
	case tctx.Err() != nil && errors.Is(cause, ErrCancelled):
		d.finishCancelled(ctx)
	case tctx.Err() != nil:
		d.delay(ctx, interruptedDelay, wire.TaskWaiting, fmt.Errorf("%w while waiting for resource %s", errInterrupted, d.rec.Resource))
	case errors.Is(err, kv.ErrInvalid):
		d.needsReview(ctx, Permanent(fmt.Errorf("resource %s: %w", d.rec.Resource, err)))
	default:
		wait := time.Duration(float64(w.cfg.BusyDelay) * (1 + 0.2*jitter()))
		d.delay(ctx, wait, wire.TaskWaiting, fmt.Errorf("resource %s: %w", d.rec.Resource, err))
	}
	return nil, waited, false
}

// endedMeanwhile settles the delivery and reports true if the task's
// record says it ended while this delivery waited: a wait as long as the
// ack deadline may have been redelivered (heartbeats lost), and the other
// delivery run.
func (d *delivery) endedMeanwhile(ctx context.Context) bool {
	prev, _, err := d.w.tasks.Get(ctx, d.rec.ID)
	if err != nil || prev.Seq != d.rec.Seq {
		return false
	}
	switch prev.State {
	case wire.TaskSucceeded:
		d.ack()
	case wire.TaskNeedsReview, wire.TaskCancelled:
		d.term("ended while this delivery waited for its resource")
	default:
		return false
	}
	d.w.log.Info("task ended while it waited for its resource", "task_id", d.rec.ID, "state", prev.State)
	return true
}

// writeWaiting records that the task waits in line for its resource:
// WAITING, with what holds it up. The record counts this delivery as a
// delay, so that if the worker dies while the task waits, its redelivery
// has used up no attempt; the RUNNING write when the task starts takes that
// back.
func (d *delivery) writeWaiting(s lease.WaitStatus) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.final {
		return
	}
	rec := d.rec
	rec.State = wire.TaskWaiting
	rec.Attempts--
	rec.Delays++
	rec.RetryAt = nil
	rec.LastError = fmt.Sprintf("waiting for resource %s: %v", rec.Resource, s)
	rec.UpdatedAt = d.w.cfg.Clock.Now()
	m, err := d.w.tasks.PutMsg(rec)
	if err != nil {
		d.w.log.Warn("write task state", "task_id", rec.ID, "state", rec.State, "err", err)
		return
	}
	d.w.pub.Publish(m, "")
	d.w.log.Debug("waiting for resource", "task_id", rec.ID, "resource_id", rec.Resource, "holder", s.Holder, "position", s.Position)
}

// call runs the handler, turning a panic into a retryable error.
func (d *delivery) call(ctx context.Context, t *Task) (err error) {
	defer func() {
		if r := recover(); r != nil {
			d.w.log.Error("handler panicked", "task_id", t.ID, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return d.w.handler(t.Type).Run(ctx, t)
}

// ready returns when the task could first start this delivery.
func (d *delivery) ready() time.Time {
	at := d.readyAt
	if at.IsZero() {
		at = d.rec.CreatedAt
	}
	if nb := d.task.NotBefore; nb != nil && nb.After(at) {
		at = *nb
	}
	return at
}

// settle records the outcome of an attempt and acks, naks or terms.
func (d *delivery) settle(ctx context.Context, t *Task, err error) {
	if err == nil {
		d.succeed(ctx, t)
		return
	}
	d.rec.LastError = err.Error()
	c, hint := Classify(err)
	if c != ClassCancelled {
		d.metrics().failed(errorKind(err, c), d.w.cfg.Clock.Now())
	}
	switch c {
	case ClassCancelled:
		d.finishCancelled(ctx)
	case ClassInterrupted:
		// Not at once: the stopping worker's pull requests may still be
		// open on the server, and a message delivered to one of them would
		// wait out the ack deadline.
		d.delay(ctx, interruptedDelay, wire.TaskWaiting, err)
	case ClassPermanent:
		d.needsReview(ctx, err)
	case ClassDelay:
		if hint <= 0 {
			hint = d.pol.Delay
		}
		if errors.Is(err, ErrNoHandler) {
			// No handler saw the task: this delivery is not an attempt.
			hint = d.pol.NoHandlerDelay
			d.rec.Attempts--
		}
		d.delay(ctx, hint, wire.TaskRetryWait, err)
	default:
		if d.rec.Attempts >= d.pol.MaxAttempts {
			d.needsReview(ctx, fmt.Errorf("attempts exhausted (%d): %w", d.rec.Attempts, err))
			return
		}
		wait := backoff(d.pol, d.rec.Attempts, jitter)
		d.metrics().retry.Inc()
		at := d.w.cfg.Clock.Now().Add(wait)
		d.rec.State = wire.TaskRetryWait
		d.rec.RetryAt = &at
		d.write(ctx)
		p := map[string]any{"attempt": d.rec.Attempts, "class": c.String(), "delay": wait.String(), "retry_at": at}
		if errors.Is(err, ErrHandlerSilent) {
			p["reason"] = wire.ReasonHandlerSilent
		}
		d.emit(wire.Event{Type: wire.EventRetryScheduled, Level: wire.LevelWarn, Message: d.rec.LastError, Payload: audit.Payload(p)})
		d.nak(wait)
	}
}

func (d *delivery) succeed(ctx context.Context, t *Task) {
	if t.touched.Load() {
		if err := d.w.cps.Clear(ctx, d.rec.ID); err != nil {
			d.w.log.Warn("clear checkpoint", "task_id", d.rec.ID, "err", err)
		}
	}
	d.metrics().success(d.w.cfg.Clock.Now())
	d.rec.State = wire.TaskSucceeded
	d.rec.LastError = ""
	d.rec.RetryAt = nil
	d.rec.Result = t.Result()
	d.write(ctx)
	d.sent = d.w.emitSent(d.sent, finishedEvent(d.rec, wire.LevelInfo, "task succeeded", d.rec.Result))
	d.ack()
}

// delay naks the message for wait without using up an attempt.
func (d *delivery) delay(ctx context.Context, wait time.Duration, state wire.TaskState, reason error) {
	if d.rec.Delays >= d.w.cfg.MaxDelays {
		d.needsReview(ctx, fmt.Errorf("delayed %d times, the limit: %w", d.rec.Delays, reason))
		return
	}
	d.rec.Delays++
	d.metrics().delay.Inc()
	at := d.w.cfg.Clock.Now().Add(wait)
	d.rec.State = state
	d.rec.RetryAt = &at
	d.rec.LastError = reason.Error()
	// The next delivery reads Delays: the write must land before the nak.
	d.write(ctx)
	p := map[string]any{"attempt": d.rec.Attempts, "class": ClassDelay.String(), "delay": wait.String(), "retry_at": at, "delays": d.rec.Delays}
	if errors.Is(reason, ErrNoHandler) {
		p["reason"] = wire.ReasonNoHandler
	}
	d.emit(wire.Event{Type: wire.EventRetryScheduled, Message: reason.Error(), Payload: audit.Payload(p)})
	d.nak(wait)
}

// needsReview parks the task: its message is kept on its review subject
// for `gantry task retry`, its record written, and only then does the
// message leave its queue.
func (d *delivery) needsReview(ctx context.Context, reason error) {
	d.mu.Lock()
	d.final = true
	d.mu.Unlock()
	d.rec.LastError = reason.Error()
	d.review(ctx, d.stored(), reason.Error())
}

// reviewRetry is when a task whose review could not be stored is delivered
// again.
const reviewRetry = 5 * time.Second

// review records the task NEEDS_REVIEW, keeping msg (unless nil), and
// terms its message. If the message cannot be kept or the record written,
// the message stays in its queue and is delivered again after reviewRetry:
// nothing accepted leaves the stream before what replaces it is stored.
func (d *delivery) review(ctx context.Context, msg *wire.StoredMessage, reason string) {
	if err := d.w.needsReviewRecord(ctx, d.rec, msg); err != nil {
		d.w.log.Error("task not parked for review; its message stays in the queue", "task_id", d.rec.ID, "retry_in", reviewRetry, "err", err)
		d.nak(reviewRetry)
		return
	}
	d.term(reason)
}

func (d *delivery) finishCancelled(ctx context.Context) {
	d.metrics().cancelled.Inc()
	d.rec.State = wire.TaskCancelled
	d.rec.RetryAt = nil
	d.write(ctx)
	d.emit(wire.Event{Type: wire.EventTaskFinished, Message: "task cancelled",
		Payload: audit.Payload(finishedPayload{Attempts: d.rec.Attempts, Run: max(d.rec.Run, 1), State: wire.TaskCancelled})})
	d.term("cancelled")
}

// reject handles a message that is not a valid task: TASK_REJECTED, the
// task to NEEDS_REVIEW with the reason, the message removed.
func (d *delivery) reject(ctx context.Context, reason error) {
	d.w.log.Warn("task rejected", "task_id", d.rec.ID, "subject", d.msg.Subject(), "err", reason)
	d.metrics().errs[kindRejected].Inc()
	d.emit(wire.Event{Type: wire.EventTaskRejected, Level: wire.LevelWarn, Message: reason.Error(),
		Payload: audit.Payload(map[string]any{"subject": d.msg.Subject(), "seq": d.rec.Seq, "size": len(d.msg.Data())})})
	d.rec.Attempts = 0
	d.rec.LastError = "rejected: " + reason.Error()
	var kept *wire.StoredMessage
	if len(d.msg.Data()) <= d.w.cfg.MaxPayload {
		kept = d.stored()
	}
	d.review(ctx, kept, reason.Error())
}

// emit publishes ev about the delivery's task, stamped with its id, its
// resource and the job that fired it.
func (d *delivery) emit(ev wire.Event) {
	ev.TaskID, ev.ResourceID, ev.JobID = d.rec.ID, d.rec.Resource, d.rec.Job
	d.sent = d.w.emitSent(d.sent, ev)
}

// awaitEvents waits until the audit stream has the delivery's events,
// before its message is settled.
func (d *delivery) awaitEvents() {
	d.w.awaitEvents(context.Background(), d.sent)
	d.sent = nil
}

// quarantined records the bad value err names as VALUE_QUARANTINED, about
// the delivery's task.
func (d *delivery) quarantined(err error) {
	var bad *kv.BadValueError
	if errors.As(err, &bad) {
		d.emit(bad.Event("replaced by the task's next write"))
	}
}

// lostAttempts emits ATTEMPT_LOST when deliveries before this one ended
// without an outcome (their worker stopped or died while the task ran),
// as prev, the task's record, tells: every outcome is written with the
// delivery count, a RUNNING record is not an outcome.
func (d *delivery) lostAttempts(prev wire.TaskRecord) {
	n := int(d.meta.NumDelivered)
	recorded := prev.Deliveries
	if prev.State == wire.TaskRunning {
		recorded--
	}
	lost := n - 1 - recorded
	if n <= 1 || lost <= 0 {
		return
	}
	attempt := n - 1 - prev.Delays
	p := map[string]any{"attempt": attempt, "lost": lost}
	if prev.State != "" {
		p["state"] = prev.State
	}
	if prev.State == wire.TaskRunning && prev.Worker != "" {
		p["worker"] = prev.Worker
	}
	d.emit(wire.Event{Type: wire.EventAttemptLost, Level: wire.LevelWarn, Payload: audit.Payload(p),
		Message: fmt.Sprintf("attempt %d ended without an outcome: its worker stopped or died while it ran", attempt)})
}

// jobOf is the job a task message says fired it, if any.
func jobOf(h nats.Header) string {
	if job := h.Get(wire.HeaderJob); wire.ValidJobName(job) {
		return job
	}
	return ""
}

func (d *delivery) stored() *wire.StoredMessage {
	return asPublished(d.msg.Subject(), d.msg.Headers(), d.msg.Data())
}

// asPublished is a task message as its publisher sent it: one a sorter
// moved to gantry.ready goes back to gantry.tasks without the sorter's
// headers, so that a retry is sorted again.
func asPublished(subject string, h nats.Header, data []byte) *wire.StoredMessage {
	queue, typ, err := wire.ParseTaskSubject(subject)
	if err != nil || !strings.HasPrefix(subject, wire.SubjectReadyPrefix+".") {
		return &wire.StoredMessage{Subject: subject, Header: h, Data: data}
	}
	orig := nats.Header{}
	for k, v := range h {
		switch k {
		case wire.HeaderTaskID, wire.HeaderIntakeSeq, wire.HeaderIntakeTime, jetstream.MsgIDHeader:
		default:
			orig[k] = v
		}
	}
	return &wire.StoredMessage{Subject: wire.TaskSubject(queue, typ), Header: orig, Data: data}
}

// write stores the record and returns once the bucket has it.
func (d *delivery) write(ctx context.Context) {
	d.mu.Lock()
	d.final = true
	d.rec.UpdatedAt = d.w.cfg.Clock.Now()
	m, err := d.w.tasks.PutMsg(d.rec)
	var f *asyncpub.Future
	if err == nil {
		// Published under mu: after any RUNNING write, so stored after it.
		f = d.w.pub.Async(m)
	}
	d.mu.Unlock()
	if err == nil {
		// A failed put is made once more, waiting.
		err = d.w.pub.Settle(ctx, f, "")
	}
	if err != nil {
		d.w.log.Error("write task state", "task_id", d.rec.ID, "state", d.rec.State, "err", err)
	}
}

// persistFor bounds how long persist keeps trying: longer than a cluster
// takes to elect a new leader, shorter than a stopping worker may wait.
const persistFor = time.Minute

// persist runs op, a read or write of the broker's that the delivery cannot
// do without, until it succeeds, for up to persistFor, keeping the delivery
// meanwhile (InProgress): a broker restarting or a cluster electing a new
// stream leader costs neither an attempt nor a redelivery.
func (d *delivery) persist(ctx context.Context, op func(context.Context) error) error {
	deadline := time.Now().Add(persistFor)
	wait := 50 * time.Millisecond
	for {
		octx, cancel := context.WithTimeout(ctx, ackTimeout)
		err := op(octx)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) || settledError(err) {
			return err
		}
		d.w.log.Debug("broker unavailable, trying again", "task_id", d.rec.ID, "err", err)
		_ = d.msg.InProgress()
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// settledError reports whether err is an answer the store will give again
// (bad input, a bad value, a missing or taken key, a lost compare-and-swap),
// not a broker that failed to answer: persist does not try again.
func settledError(err error) bool {
	for _, kind := range []error{kv.ErrInvalid, kv.ErrBadValue, kv.ErrNotFound, kv.ErrExists, kv.ErrChanged} {
		if errors.Is(err, kind) {
			return true
		}
	}
	return false
}

func (d *delivery) ack() {
	d.awaitEvents()
	d.w.settled.add(d.meta.Sequence.Stream)
	if err := d.msg.Ack(); err != nil {
		d.w.log.Warn("ack", "task_id", d.rec.ID, "err", err)
	}
}

// nak hands the message back for redelivery after wait.
//
// With a consumer BackOff, the server (2.15) times a nak's delay from
// AckWait but the redelivery from the BackOff of the delivery count, so
// delivery n's delay would grow by backOff[n-1]-AckWait. nak takes that
// off, sending the nak itself since the client drops delays below zero.
func (d *delivery) nak(wait time.Duration) {
	d.awaitEvents()
	if wait <= 0 {
		if err := d.msg.Nak(); err != nil {
			d.w.log.Warn("nak", "task_id", d.rec.ID, "err", err)
		}
		return
	}
	if bo := d.sp.backOff; len(bo) > 0 {
		i := min(int(d.meta.NumDelivered), len(bo)) - 1
		wait -= bo[i] - d.sp.queue.AckWait
	}
	body := fmt.Appendf(nil, "-NAK {\"delay\": %d}", wait.Nanoseconds())
	if err := d.w.nc.Publish(d.msg.Reply(), body); err != nil {
		d.w.log.Warn("nak", "task_id", d.rec.ID, "err", err)
	}
}

func (d *delivery) term(reason string) {
	d.awaitEvents()
	d.w.settled.add(d.meta.Sequence.Stream)
	if err := d.msg.TermWithReason(reason); err != nil {
		d.w.log.Warn("term", "task_id", d.rec.ID, "err", err)
	}
}

// heartbeat calls beat every interval until stopped.
type heartbeat struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

func newHeartbeat(every time.Duration, beat func()) *heartbeat {
	h := &heartbeat{}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.timer = time.AfterFunc(every, func() {
		beat()
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.stopped {
			h.timer.Reset(every)
		}
	})
	return h
}

func (h *heartbeat) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	h.timer.Stop()
}
