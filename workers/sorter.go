package workers

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
)

// A JetStream consumer delivers in stream order, so the priority of a task
// cannot reorder the queue it waits in. A prioritized queue therefore has
// two stages in StreamTasks:
//
//   - the sorter consumes gantry.tasks.<queue>.> (durable
//     gantry-sorter-<queue>), holds up to the queue's PriorityWindow
//     unacknowledged tasks in a heap, and republishes the best of them to
//     gantry.ready.<queue>.<type> whenever fewer than lookahead tasks wait
//     there undelivered (all workers busy); then it acks the original;
//   - the workers consume gantry.ready.<queue>.> exactly as they consume a
//     FIFO queue, with the same concurrency, ack deadlines and attempts.
//
// Every worker process of the queue runs a sorter on the same durable
// consumer in a pinned priority group: the broker delivers to one of them
// at a time, so one heap orders the whole queue. A pinned sorter pulls
// every SorterTimings.PullExpiry to keep its pin; when its process stops it hands
// its tasks back and unpins, and when the process dies another sorter is
// pinned after SorterTimings.PinnedTTL and gets the held tasks after
// SorterTimings.AckWait.
//
// A republish carries Nats-Msg-Id gantry:sorted:<sequence of the original>
// (no task id has a ':'), so a sorter stopped between republishing and
// acking does not queue the task twice, and the headers HeaderTaskID,
// HeaderIntakeSeq and HeaderIntakeTime, so the task keeps its id, its
// record and its created_at.
const (
	// sorterWait bounds one wait of a sorter on the broker.
	sorterWait = 5 * time.Second
	// sorterGroup is the priority group of the sorter consumers.
	sorterGroup = "sorter"
)

// SorterTimings are the real-time settings of the sorters of prioritized
// queues. Every worker of a queue must use the same ones. The defaults fit
// production; tests shorten them.
type SorterTimings struct {
	// AckWait is the sorter consumer's ack deadline: the held tasks of a
	// sorter that died come back after it; a live sorter keeps them every
	// third of it. Defaults to 30 s.
	AckWait time.Duration
	// PinnedTTL is how long the broker keeps a silent sorter pinned before
	// another worker's sorter takes the queue over. Defaults to 5 s.
	PinnedTTL time.Duration
	// PullExpiry is how long a sorter's pull request lasts: the next one
	// renews the pin, so it must be well within PinnedTTL, and at least 1 s
	// (the broker's minimum). Defaults to 2 s.
	PullExpiry time.Duration
	// Poll is how often a sorter holding tasks asks the broker how many
	// sorted tasks still wait (deliveries in its own process tell it
	// sooner). Defaults to 50 ms.
	Poll time.Duration
}

func (t SorterTimings) withDefaults() SorterTimings {
	t.AckWait = cmp.Or(t.AckWait, 30*time.Second)
	t.PinnedTTL = cmp.Or(t.PinnedTTL, 5*time.Second)
	t.PullExpiry = cmp.Or(t.PullExpiry, 2*time.Second)
	t.Poll = cmp.Or(t.Poll, 50*time.Millisecond)
	return t
}

// sorter moves the tasks of one prioritized queue to its ready subjects,
// highest priority first.
type sorter struct {
	w     *Workers
	queue *Queue
	name  string
	// lanes are the ready consumers of the queue, by task type; "" is the
	// consumer of the whole queue, otherTypes the types a queue split by
	// type does not run. Fixed by newSorter.
	lanes map[string]*lane
	// in carries the delivered tasks to run.
	in   chan *held
	kick chan struct{}
	cc   jetstream.ConsumeContext

	// ids holds the id of every task delivered and not yet moved or
	// dropped; dropping marks those cancelled, for run to drop. Both are
	// read by cancelled on the goroutine of the cancel subscription.
	ids      sync.Map
	dropping sync.Map
	// quit stops run; lost is closed when the consumer is deleted under
	// the sorter; done when run has returned.
	quit, lost, done   chan struct{}
	stopOnce, lostOnce sync.Once
}

// lane is one consumer of sorted tasks and the tasks held for it.
type lane struct {
	sorter *sorter
	sp     *spec
	// lookahead is how many sorted tasks may wait undelivered on the lane,
	// ahead of any task still held: a quarter of its concurrency, at
	// least 1. More keeps a busy lane fed between the sorter's moves;
	// fewer keeps the order closer to priority.
	lookahead int
	// cons is sp's consumer, asked for its pending count.
	cons jetstream.Consumer
	held heldHeap
	// pending estimates the sorted tasks waiting undelivered on the lane:
	// the broker's count, from a local delivery or a poll, plus the
	// tasks forwarded since.
	pending int
	// seen is the broker's count from the last local delivery, -1 when
	// none came since the sorter last read it.
	seen atomic.Int64
}

// held is one task the sorter holds: its message is delivered to the
// sorter and not acknowledged yet.
type held struct {
	m        jetstream.Msg
	seq      uint64
	ts       time.Time
	priority int
	id       string
	typ      string
}

// heldHeap orders held tasks by priority (highest first), then by stream
// sequence (oldest first).
type heldHeap []*held

func (h heldHeap) Len() int { return len(h) }
func (h heldHeap) Less(i, j int) bool {
	if h[i].priority != h[j].priority {
		return h[i].priority > h[j].priority
	}
	return h[i].seq < h[j].seq
}
func (h heldHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *heldHeap) Push(x any)   { *h = append(*h, x.(*held)) }
func (h *heldHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

// sorterName is the durable consumer of queue's sorter.
func sorterName(queue string) string { return "gantry-sorter-" + queue }

func newSorter(w *Workers, q *Queue, specs []*spec) *sorter {
	s := &sorter{w: w, queue: q, name: sorterName(q.Name), lanes: map[string]*lane{},
		in: make(chan *held, 256), kick: make(chan struct{}, 1),
		quit: make(chan struct{}), lost: make(chan struct{}), done: make(chan struct{})}
	for _, sp := range specs {
		if sp.queue == q {
			l := &lane{sorter: s, sp: sp, lookahead: max(1, sp.concurrency/4)}
			l.seen.Store(-1)
			s.lanes[sp.typ] = l
			sp.lane = l
		}
	}
	if _, ok := s.lanes[""]; !ok {
		l := &lane{sorter: s}
		l.seen.Store(-1)
		s.lanes[otherTypes] = l
	}
	return s
}

func (s *sorter) consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        s.name,
		Description:    "gantry sorter: orders " + wire.SubjectTasksPrefix + "." + s.queue.Name + ".> by priority",
		FilterSubject:  wire.SubjectTasksPrefix + "." + s.queue.Name + ".>",
		AckPolicy:      jetstream.AckExplicitPolicy,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckWait:        s.w.cfg.Sorter.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  s.queue.PriorityWindow,
		MaxWaiting:     512,
		PriorityGroups: []string{sorterGroup},
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PinnedTTL:      s.w.cfg.Sorter.PinnedTTL,
	}
}

// start creates the sorter's consumer and consumes it into s.in.
func (s *sorter) start(ctx context.Context) error {
	cons, err := s.w.js.CreateOrUpdateConsumer(ctx, wire.StreamTasks, s.consumerConfig())
	if err != nil {
		return fmt.Errorf("consumer %s: %w", s.name, err)
	}
	s.cc, err = cons.Consume(s.receive,
		jetstream.PullPriorityGroup(sorterGroup),
		jetstream.PullMaxMessages(min(s.queue.PriorityWindow, 256)),
		jetstream.PullExpiry(s.w.cfg.Sorter.PullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			switch {
			case errors.Is(err, jetstream.ErrConsumerDeleted):
				s.lostOnce.Do(func() {
					s.w.log.Warn("sorter: its consumer was removed (a worker with other settings for the queue?); this process stops sorting",
						"queue", s.queue.Name, "consumer", s.name)
					close(s.lost)
				})
			case !errors.Is(err, jetstream.ErrNoHeartbeat):
				s.w.log.Debug("consume", "consumer", s.name, "err", err)
			}
		}))
	if err != nil {
		return fmt.Errorf("consume %s: %w", s.name, err)
	}
	return nil
}

// receive reads what the sorter needs of a delivered task and hands it to
// run.
func (s *sorter) receive(m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		s.w.log.Error("sorter: message without metadata", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return
	}
	// Only id and priority matter here; a body that does not decode goes
	// on with priority 0 and the worker rejects it.
	var body struct {
		ID       string `json:"id"`
		Priority int    `json:"priority"`
	}
	_ = json.Unmarshal(m.Data(), &body)
	_, typ, _ := wire.ParseTaskSubject(m.Subject())
	h := &held{m: m, seq: meta.Sequence.Stream, ts: meta.Timestamp, priority: body.Priority, typ: typ,
		id: taskID(wire.Task{ID: body.ID}, m.Headers().Get(jetstream.MsgIDHeader), meta.Timestamp, meta.Sequence.Stream)}
	s.ids.Store(h.id, struct{}{})
	select {
	case s.in <- h:
	case <-s.done:
		_ = m.Nak()
	}
}

// stop drains the consumer, so that every delivery reaches run, then stops
// run, which hands the held tasks back. It returns once run has. It does
// nothing for a sorter that did not start (no consumer, no run), and
// nothing more when called again.
func (s *sorter) stop() {
	if s.cc == nil {
		return
	}
	s.stopOnce.Do(func() {
		select {
		case <-s.lost:
			s.cc.Stop()
		default:
			s.cc.Drain()
			select {
			case <-s.cc.Closed():
			case <-time.After(sorterWait):
				s.w.log.Warn("sorter: consumer not drained in time; tasks still on their way come back after the ack deadline", "queue", s.queue.Name)
			}
		}
		close(s.quit)
	})
	<-s.done
}

// delivered tells the lane's sorter that a local delivery from the lane
// saw pending sorted tasks still waiting behind it.
func (l *lane) delivered(pending uint64) {
	l.seen.Store(int64(pending))
	l.sorter.wake()
}

func (s *sorter) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run sorts until stop or until its consumer is deleted. It owns the
// heaps.
func (s *sorter) run(ctx context.Context) {
	defer close(s.done)
	beat := time.NewTicker(s.w.cfg.Sorter.AckWait / 3)
	defer beat.Stop()
	// poll runs while a lane holds tasks it cannot forward yet.
	poll := time.NewTimer(s.w.cfg.Sorter.Poll)
	defer poll.Stop()
	armed := true
	s.refresh(ctx, true)
	for {
		select {
		case <-s.quit:
			s.handBack()
			return
		case <-s.lost:
			// The tasks are free for whoever took the queue over: move
			// nothing more, ack nothing more.
			return
		case h := <-s.in:
			s.add(h)
			// Take what else has come, so that one forward moves a batch
			// and waits for its acknowledgements once.
			for more := len(s.in); more > 0; more-- {
				s.add(<-s.in)
			}
		case <-s.kick:
		case <-poll.C:
			armed = false
			s.refresh(ctx, false)
		case <-beat.C:
			s.keepAlive()
		}
		s.dropCancelled(ctx)
		if s.forward(ctx) && !armed {
			poll.Reset(s.w.cfg.Sorter.Poll)
			armed = true
		}
	}
}

// handBack naks every held task, and every one still on its way, so that
// the next sorter gets them at once, and unpins the consumer so that the
// broker picks the next sorter at once.
func (s *sorter) handBack() {
	for _, l := range s.lanes {
		for _, h := range l.held {
			_ = h.m.Nak()
		}
		l.held = nil
	}
	for more := len(s.in); more > 0; more-- {
		_ = (<-s.in).m.Nak()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if stream, err := s.w.js.Stream(ctx, wire.StreamTasks); err == nil {
		_ = stream.UnpinConsumer(ctx, s.name, sorterGroup)
	}
}

// add takes a delivered task into the heap of its lane.
func (s *sorter) add(h *held) {
	heap.Push(&s.lane(h.typ).held, h)
}

func (s *sorter) lane(typ string) *lane {
	if l, ok := s.lanes[typ]; ok {
		return l
	}
	if l, ok := s.lanes[""]; ok {
		return l
	}
	return s.lanes[otherTypes]
}

// otherTypes keys the lane of a queue split by type for the types it does
// not list: it runs none of them, so they go to their ready subjects at
// once and wait there unconsumed, as they would on gantry.tasks.
const otherTypes = "*"

// refresh asks the broker how many sorted tasks wait on the lanes: every
// lane when all is set (a sorter starting, perhaps after another), else
// those that hold tasks they could not forward.
func (s *sorter) refresh(ctx context.Context, all bool) {
	for _, l := range s.lanes {
		if l.cons == nil || !all && (l.held.Len() == 0 || l.pending < l.lookahead) {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, sorterWait)
		info, err := l.cons.Info(cctx)
		cancel()
		if err != nil {
			s.w.log.Debug("sorter: read lane", "consumer", l.sp.name, "err", err)
			continue
		}
		l.pending = int(info.NumPending)
	}
}

// forward republishes the best held tasks of every lane while few sorted
// tasks wait on it, all at once, then acks those the stream stored. It
// reports whether some lane still holds tasks.
func (s *sorter) forward(ctx context.Context) (holding bool) {
	type sent struct {
		h *held
		l *lane
		f jetstream.PubAckFuture
	}
	var batch []sent
	for _, l := range s.lanes {
		if seen := l.seen.Swap(-1); seen >= 0 {
			l.pending = int(seen)
		}
		for l.held.Len() > 0 && (l.cons == nil || l.pending < l.lookahead) {
			h := heap.Pop(&l.held).(*held)
			f, err := s.w.js.PublishMsgAsync(s.sorted(h))
			if err != nil {
				s.w.log.Warn("sorter: move task", "task_id", h.id, "err", err)
				heap.Push(&l.held, h)
				break
			}
			batch = append(batch, sent{h, l, f})
			l.pending++
		}
	}
	bctx, cancel := context.WithTimeout(ctx, sorterWait)
	defer cancel()
	for _, x := range batch {
		var err error
		select {
		case <-x.f.Ok():
		case err = <-x.f.Err():
		case <-bctx.Done():
			err = bctx.Err()
		}
		if err != nil {
			// Held again; if it was stored after all, the next
			// republish is a duplicate the stream drops.
			s.w.log.Warn("sorter: move task", "task_id", x.h.id, "err", err)
			heap.Push(&x.l.held, x.h)
			x.l.pending--
			continue
		}
		s.ids.Delete(x.h.id)
		// A lost ack redelivers the original after sorterAckWait; its
		// republish is then a duplicate too.
		if err := x.h.m.Ack(); err != nil {
			s.w.log.Debug("sorter: ack moved task", "task_id", x.h.id, "err", err)
		}
	}
	for _, l := range s.lanes {
		holding = holding || l.held.Len() > 0
	}
	return holding
}

// sorted is h's message for its ready subject.
func (s *sorter) sorted(h *held) *nats.Msg {
	m := nats.NewMsg(wire.ReadySubject(s.queue.Name, h.typ))
	m.Data = h.m.Data()
	// The publisher's own headers go along; the broker's (Nats-Msg-Id,
	// expectations, TTL, and Nats-Pin-Id, which would pin the workers'
	// consumer) do not.
	for k, v := range h.m.Headers() {
		if !strings.HasPrefix(strings.ToLower(k), "nats-") {
			m.Header[k] = v
		}
	}
	m.Header.Set(jetstream.MsgIDHeader, "gantry:sorted:"+strconv.FormatUint(h.seq, 10))
	m.Header.Set(wire.HeaderTaskID, h.id)
	m.Header.Set(wire.HeaderIntakeSeq, strconv.FormatUint(h.seq, 10))
	m.Header.Set(wire.HeaderIntakeTime, h.ts.UTC().Format(time.RFC3339Nano))
	return m
}

// cancelled handles `gantry task cancel` of task id: if the sorter holds
// it and its record says CANCELLED, run drops it and records its end, and
// cancelled reports true so that the canceller leaves the task to it. A
// cancel request of anyone else (the scheduler replacing a run) finds the
// record unchanged and leaves the task alone, as on a FIFO queue. It runs
// on the goroutine of the cancel subscription, not on run's.
func (s *sorter) cancelled(id string) bool {
	select {
	case <-s.done:
		return false
	default:
	}
	if _, ok := s.ids.Load(id); !ok {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rec, _, err := s.w.tasks.Get(ctx, id)
	if err != nil || rec.State != wire.TaskCancelled {
		return false
	}
	s.dropping.Store(id, rec)
	s.wake()
	return true
}

// dropCancelled drops the held tasks marked cancelled: acks them, writes
// their record (with the retention of an ended task) and emits
// TASK_FINISHED. A task already moved is not here: its worker finds the
// record cancelled.
func (s *sorter) dropCancelled(ctx context.Context) {
	s.dropping.Range(func(k, v any) bool {
		id, rec := k.(string), v.(wire.TaskRecord)
		s.dropping.Delete(id)
		for _, l := range s.lanes {
			for i, h := range l.held {
				if h.id != id {
					continue
				}
				heap.Remove(&l.held, i)
				s.ids.Delete(id)
				if err := h.m.Ack(); err != nil {
					s.w.log.Warn("sorter: ack cancelled task", "task_id", id, "err", err)
				}
				rec.UpdatedAt = s.w.cfg.Clock.Now()
				wctx, cancel := context.WithTimeout(ctx, sorterWait)
				if _, err := s.w.tasks.Put(wctx, rec); err != nil {
					s.w.log.Warn("sorter: write cancelled task", "task_id", id, "err", err)
				}
				cancel()
				s.w.emitAsync(wire.Event{Type: wire.EventTaskFinished, TaskID: id, ResourceID: rec.Resource, JobID: rec.Job, Message: "task cancelled",
					Payload: audit.Payload(finishedPayload{Run: max(rec.Run, 1), State: wire.TaskCancelled})})
				s.w.log.Info("sorter: dropped cancelled task", "task_id", id)
				return true
			}
		}
		return true
	})
}

// keepAlive extends the ack deadline of every held task.
func (s *sorter) keepAlive() {
	for _, l := range s.lanes {
		for _, h := range l.held {
			if err := h.m.InProgress(); err != nil {
				s.w.log.Debug("sorter: keep task", "task_id", h.id, "err", err)
			}
		}
	}
}
