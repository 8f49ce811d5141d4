package workers

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/asyncpub"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/durable"
	"github.com/gantry-dev/gantry/internal/lifecycle"
	"github.com/gantry-dev/gantry/internal/proctree"
	"github.com/gantry-dev/gantry/internal/rpc"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/lease"
	"github.com/gantry-dev/gantry/sqltask"
	"github.com/gantry-dev/gantry/tasks"
)

// Workers consumes the task queues of one process and runs their tasks.
//
// It is an actor (lifecycle.Base): Run blocks until Stop or its context
// ends, and runs once; Ready is closed once every consumer is consuming;
// Stop asks Run to stop taking tasks and to return once the running tasks
// have ended, and is idempotent and safe before Run or after it returns.
type Workers struct {
	lifecycle.Base
	cfg   Config
	nc    *nats.Conn
	js    jetstream.JetStream
	log   *slog.Logger
	audit *audit.Emitter

	tasks     *tasks.Store
	cps       *tasks.CheckpointStore
	resources *lease.Resources
	// sql holds the pools of the databases sql tasks use.
	sql *sqltask.Databases
	// trees starts exec tasks' processes; their checkpoint files are in
	// cpDir, this Workers' own directory under Config.CheckpointDir.
	trees *proctree.Starter
	cpDir string

	hmu      sync.RWMutex
	handlers map[string]Handler

	// suspectUntil is until when (unix nanoseconds) every delivery reads
	// its task's record first: a consumer leader was elected.
	suspectUntil atomic.Int64
	// settled are the stream sequences of the messages this process acked
	// or terminated lately.
	settled recentSeqs
	// mark is the tasks stream's last sequence when this process last
	// connected to the broker.
	mark watermark
	// rmu guards running, handling and interrupting: once interruptAll
	// has run, a task that starts is interrupted at once.
	rmu     sync.Mutex
	running map[string]runningTask
	// handling are the tasks whose delivery this process handles now.
	handling     map[string]struct{}
	interrupting bool

	// metrics are the Prometheus metrics and the presence's window.
	metrics *metrics
	// queues holds the queues' pauses; paused, read when Run starts, says
	// which configured queues' new consumers start paused.
	queues *tasks.Queues
	paused map[string]bool
	// presence is this process's entry in gantry_workers, from started.
	presence *tasks.Presence
	started  time.Time

	// outputs holds the live output of each running attempt, by task id.
	outputs sync.Map

	// cmu guards closing and the Add side of inflight.
	cmu      sync.Mutex
	closing  bool
	inflight sync.WaitGroup

	// idle hands a delivery to a runner waiting for one; runners counts
	// the runner goroutines.
	idle    chan job
	runners sync.WaitGroup

	// consumers are the queue and type consumers; sorters order the
	// prioritized queues, by queue name. Both are set by New.
	consumers []*spec
	sorters   map[string]*sorter

	// stopping ends when the workers stop taking tasks: the tasks waiting
	// in line for a resource are handed back at once.
	stopping     context.Context
	markStopping context.CancelFunc
	// durables are the consumers Run started, for Healthy.
	dmu      sync.Mutex
	durables []*durable.Consumer

	// pub publishes the hot path's audit events and task records without
	// waiting, and checks their acknowledgements.
	pub *asyncpub.Publisher
	// quit is closed when Run returns: idle runners leave.
	quit chan struct{}
}

// runningTask is a task running in this process: how to stop it, and
// what the presence entry lists of it.
type runningTask struct {
	cancel context.CancelCauseFunc
	info   wire.RunningTask
}

// job is one delivered message for a runner.
type job struct {
	sp *spec
	m  jetstream.Msg
}

// spec is one consumer: a queue, or a type of a queue.
type spec struct {
	queue   *Queue
	typ     string
	name    string
	subject string
	// lane is the spec's lane in its queue's sorter, on a prioritized
	// queue.
	lane *lane
	// leftover is the subject of tasks a sorter moved before the queue
	// stopped being prioritized; the consumer of a FIFO queue takes them
	// too while there are any.
	leftover    string
	concurrency int
	// backOff is the consumer's BackOff: the ack deadline of delivery n
	// is backOff[min(n, len)-1].
	backOff []time.Duration
	// lastDelivery is the highest consumer sequence this process was
	// delivered.
	lastDelivery atomic.Uint64
}

// replayed records a delivery's consumer sequence and reports whether this
// process saw it or a later one before: a consumer whose leader changed
// (a broker died) delivers again what it forgot it had delivered, under
// the same sequences and as a first delivery.
func (sp *spec) replayed(seq uint64) bool {
	for {
		last := sp.lastDelivery.Load()
		if seq <= last {
			return true
		}
		if sp.lastDelivery.CompareAndSwap(last, seq) {
			return false
		}
	}
}

// suspectFor is how long after a consumer leader election (beyond the
// queue's AckWait) every delivery is checked against its task's record.
const suspectFor = 30 * time.Second

// suspect reports whether a delivery may be one a consumer forgot and made
// again: this process acked or terminated its message before, its
// consumer sequence is not new to this process, a consumer leader was
// elected a short while ago, or its message was stored before this
// process last connected to the broker (a broker killed and restarted
// forgets the deliveries it made just before, and makes them again as
// first ones, to this process or a new one).
func (w *Workers) suspect(ctx context.Context, sp *spec, meta *jetstream.MsgMetadata) bool {
	return sp.replayed(meta.Sequence.Consumer) || w.settled.has(meta.Sequence.Stream) ||
		time.Now().UnixNano() < w.suspectUntil.Load() || w.storedBefore(ctx, meta.Sequence.Stream)
}

// watermark is the tasks stream's last sequence when a connection to the
// broker was made: a message at or below it may have been delivered
// before, by a broker that has since forgotten it.
type watermark struct {
	mu sync.Mutex
	// seq is the last sequence read on the connection conn (its reconnect
	// count); known says whether it was read.
	seq   uint64
	conn  uint64
	known bool
	// reading is set while a delivery reads the mark.
	reading bool
}

// storedBefore reports whether the message at stream sequence seq was
// stored before this process last connected to the broker. While that is
// not known (the connection is new, the broker does not answer) every
// message counts as stored before, and one delivery reads the mark.
func (w *Workers) storedBefore(ctx context.Context, seq uint64) bool {
	conn := w.nc.Stats().Reconnects
	w.mark.mu.Lock()
	if w.mark.known && w.mark.conn == conn {
		defer w.mark.mu.Unlock()
		return seq <= w.mark.seq
	}
	reading := w.mark.reading
	w.mark.reading = true
	w.mark.mu.Unlock()
	if !reading {
		w.readMark(ctx, conn)
	}
	return true
}

// readMark reads the tasks stream's last sequence as the mark of the
// connection conn (the reconnect count read before).
func (w *Workers) readMark(ctx context.Context, conn uint64) {
	ctx, cancel := context.WithTimeout(ctx, ackTimeout)
	defer cancel()
	var last uint64
	stream, err := w.js.Stream(ctx, wire.StreamTasks)
	if err == nil {
		last = stream.CachedInfo().State.LastSeq
	}
	w.setMark(conn, last, err)
}

// setMark records last as the mark of the connection conn, unless err
// says it could not be read.
func (w *Workers) setMark(conn, last uint64, err error) {
	w.mark.mu.Lock()
	defer w.mark.mu.Unlock()
	w.mark.reading = false
	if err != nil {
		w.log.Warn("read the tasks stream's last sequence; deliveries read their task's record meanwhile", "err", err)
		return
	}
	w.mark.seq, w.mark.conn, w.mark.known = last, conn, true
}

// recentSeqs remembers the last stream sequences added to it.
type recentSeqs struct {
	mu   sync.Mutex
	set  map[uint64]struct{}
	ring []uint64
	next int
}

// settledMemory is how many settled messages a worker process remembers.
const settledMemory = 1 << 16

func (r *recentSeqs) add(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.set == nil {
		r.set, r.ring = make(map[uint64]struct{}, settledMemory), make([]uint64, settledMemory)
	}
	delete(r.set, r.ring[r.next])
	r.ring[r.next] = seq
	r.set[seq] = struct{}{}
	r.next = (r.next + 1) % settledMemory
}

func (r *recentSeqs) has(seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.set[seq]
	return ok
}

// claim marks task id as handled by this process, unless a delivery of it
// is handled already: then it returns false. release undoes it.
func (w *Workers) claim(id string) bool {
	w.rmu.Lock()
	defer w.rmu.Unlock()
	if _, ok := w.handling[id]; ok {
		return false
	}
	w.handling[id] = struct{}{}
	return true
}

func (w *Workers) release(id string) {
	w.rmu.Lock()
	defer w.rmu.Unlock()
	delete(w.handling, id)
}

// New validates cfg and fills its defaults. nc is the connection to the
// broker; Run opens the stores and consumers.
func New(cfg Config, nc *nats.Conn) (*Workers, error) {
	if nc == nil {
		return nil, errors.New("workers: no NATS connection")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	trees, err := proctree.New(cfg.ProcessTrees)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	cpDir, err := checkpointDir(cfg.CheckpointDir)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(16384))
	if err != nil {
		return nil, fmt.Errorf("workers: jetstream: %w", err)
	}
	dbs, err := sqltask.New(cfg.Databases)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	w := &Workers{
		cfg:      cfg,
		nc:       nc,
		js:       js,
		log:      cfg.Logger,
		audit:    audit.NewEmitter(js, "workers", cfg.Clock),
		sql:      dbs,
		trees:    trees,
		cpDir:    cpDir,
		handlers: map[string]Handler{},
		running:  map[string]runningTask{},
		handling: map[string]struct{}{},
		idle:     make(chan job),
		quit:     make(chan struct{}),
	}
	w.stopping, w.markStopping = context.WithCancel(context.Background())
	if w.metrics, err = newMetrics(cfg.Metrics); err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	w.consumers = w.specs()
	w.sorters = map[string]*sorter{}
	for i := range w.cfg.Queues {
		if q := &w.cfg.Queues[i]; q.Prioritized {
			w.sorters[q.Name] = newSorter(w, q, w.consumers)
		}
	}
	if w.pub, err = asyncpub.New(nc, asyncpub.Config{MaxPending: maxPendingWrites, Timeout: ackTimeout,
		Patience: persistFor, Logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	w.handlers["noop"] = HandlerFunc(w.runNoop)
	w.handlers["exec"] = execHandler{w}
	w.handlers["http"] = HandlerFunc(w.runHTTP)
	w.handlers["sql"] = HandlerFunc(w.runSQL)
	w.handlers["backup"] = HandlerFunc(w.runBackup)
	return w, nil
}

// Handle registers h as the in-process handler of task type typ,
// replacing any earlier one (built-in types included). Types without an
// in-process handler go to gantry.handlers.<type> over request-reply.
func (w *Workers) Handle(typ string, h Handler) error {
	if !wire.ValidToken(typ) {
		return fmt.Errorf("task type %q: want a name without spaces, '.', '*' or '>'", typ)
	}
	w.hmu.Lock()
	defer w.hmu.Unlock()
	w.handlers[typ] = h
	return nil
}

func (w *Workers) handler(typ string) Handler {
	w.hmu.RLock()
	defer w.hmu.RUnlock()
	if h, ok := w.handlers[typ]; ok {
		return h
	}
	return HandlerFunc(w.runRemote)
}

// specs lists the consumers of the configuration.
func (w *Workers) specs() []*spec {
	var out []*spec
	for i := range w.cfg.Queues {
		q := &w.cfg.Queues[i]
		split := false
		for _, t := range q.Types {
			if t.Concurrency > 0 {
				split = true
			}
		}
		prefix, name := wire.SubjectTasksPrefix, "gantry-workers-"+q.Name
		if q.Prioritized {
			prefix, name = wire.SubjectReadyPrefix, "gantry-ready-"+q.Name
		}
		if !split {
			out = append(out, &spec{queue: q, name: name,
				subject: prefix + "." + q.Name + ".>", concurrency: q.Concurrency,
				backOff: backOffs(q.AckWait, w.cfg.MaxDeliver)})
			continue
		}
		for typ, t := range q.Types {
			conc := t.Concurrency
			if conc == 0 {
				conc = q.Concurrency
			}
			out = append(out, &spec{queue: q, typ: typ, name: name + "-" + typ,
				subject: prefix + "." + q.Name + "." + typ, concurrency: conc, backOff: backOffs(q.AckWait, w.cfg.MaxDeliver)})
		}
	}
	return out
}

// backOffs is the consumer BackOff for ackWait: a dead worker's task is
// redelivered after ackWait, then 2, 4, 8 and 16 times ackWait.
func backOffs(ackWait time.Duration, maxDeliver int) []time.Duration {
	var out []time.Duration
	for d := ackWait; len(out) < 5 && len(out) < maxDeliver; d *= 2 {
		out = append(out, d)
	}
	return out
}

// consumerConfig is the durable consumer of one spec.
func (w *Workers) consumerConfig(sp *spec) jetstream.ConsumerConfig {
	ackWait := sp.queue.AckWait
	cfg := jetstream.ConsumerConfig{
		Durable:       sp.name,
		Description:   "gantry workers: " + sp.subject,
		FilterSubject: sp.subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       ackWait,
		BackOff:       sp.backOff,
		MaxDeliver:    w.cfg.MaxDeliver,
		MaxAckPending: sp.concurrency,
		MaxWaiting:    512,
	}
	if sp.leftover != "" {
		cfg.FilterSubject, cfg.FilterSubjects = "", []string{sp.subject, sp.leftover}
	}
	if w.paused[sp.queue.Name] {
		// A new consumer of a paused queue starts paused; an existing
		// one keeps its own pause (the broker ignores this on update).
		cfg.PauseUntil = &tasks.PausedUntil
	}
	return cfg
}

// Run opens the stores, creates the consumers and runs tasks until Stop
// (running tasks get Config.DrainTimeout to finish) or ctx ends; tasks
// still running then are interrupted and handed back to the broker. It
// returns nil on a clean stop, and lifecycle.ErrAlreadyRun when called
// again. A start that fails once some consumers consume stops them,
// interrupts the tasks they delivered and waits for those before it
// returns its error.
func (w *Workers) Run(ctx context.Context) error {
	return lifecycle.Run(ctx, &w.Base, w.run)
}

// run is Run's body.
func (w *Workers) run(ctx context.Context, lc *lifecycle.Runner) error {
	// Last, once no task runs: the database pools.
	defer func() {
		if err := w.sql.Close(); err != nil {
			w.log.Warn("close databases", "err", err)
		}
	}()
	// Removed last, once every task has ended.
	if err := w.makeCheckpointDir(); err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(w.cpDir) }()
	w.log.Info("exec process trees", "containment", w.trees.Containment(), "checkpoint_dir", w.cpDir)
	var err error
	if w.tasks, err = tasks.NewStore(ctx, w.js, tasks.StoreConfig{Retention: w.cfg.TaskRetention}); err != nil {
		return err
	}
	if w.cps, err = tasks.NewCheckpointStore(ctx, w.js); err != nil {
		return err
	}
	w.cps.Quarantine = kv.NewQuarantine(w.emitAsync)
	if w.resources, err = lease.NewResources(w.js, lease.ResourcesConfig{Audit: w.audit, Logger: w.log, Clock: w.cfg.Clock}); err != nil {
		return err
	}
	// The mark of this connection: what the stream held before this
	// process started may have been delivered already.
	conn := w.nc.Stats().Reconnects
	stream, err := w.js.Stream(ctx, wire.StreamTasks)
	if err != nil {
		return fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
	}
	w.setMark(conn, stream.CachedInfo().State.LastSeq, nil)
	if err := w.openOps(ctx); err != nil {
		return err
	}

	defer func() {
		close(w.quit)
		// No task is running (stopTaking waited for them): the idle
		// runners leave on quit.
		w.runners.Wait()
	}()

	// Every worker process hears every cancel request: only the one
	// running (or holding) the task answers.
	cancelSvc, err := rpc.AddService(w.nc, wire.WorkersServiceName, "gantry workers: cancel a running or held task, read a running task's output",
		rpc.Endpoint{Name: "cancel", Subject: wire.SubjectTaskCancel, Handler: w.cancelRunning, Everyone: true},
		rpc.Endpoint{Name: "output", Subject: wire.SubjectTaskOutput, Handler: w.taskOutput, Everyone: true})
	if err != nil {
		return err
	}
	defer func() { _ = cancelSvc.Stop() }()

	// The consumers and sorters started so far; stopTaking stops them and
	// waits for the tasks they delivered, on a failed start or a stop.
	var ccs []*durable.Consumer
	var sorting sync.WaitGroup
	stopped := false
	stopTaking := func(grace time.Duration) {
		if stopped {
			return
		}
		stopped = true
		w.cmu.Lock()
		w.closing = true
		w.cmu.Unlock()
		w.markStopping()
		for _, cc := range ccs {
			cc.Stop()
		}
		for _, s := range w.sorters {
			s.stop()
		}
		sorting.Wait()
		w.waitTasks(ctx, grace)
		if err := w.flush(context.WithoutCancel(ctx)); err != nil {
			w.log.Warn("flush on stop", "err", err)
		}
	}
	// A failed start interrupts the tasks at once.
	defer stopTaking(0)
	if err := w.prepareConsumers(ctx, stream); err != nil {
		return err
	}
	for _, sp := range w.consumers {
		advSubj := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + wire.StreamTasks + "." + sp.name
		adv, err := w.nc.QueueSubscribe(advSubj, "gantry-workers", func(m *nats.Msg) { w.maxDeliveries(ctx, stream, m.Data) })
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", advSubj, err)
		}
		defer func() { _ = adv.Unsubscribe() }()
		// A new consumer leader (a broker died) may deliver again, as
		// first deliveries, what its predecessor delivered: for a while,
		// every delivery reads its task's record first.
		electedSubj := "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED." + wire.StreamTasks + "." + sp.name
		elected, err := w.nc.Subscribe(electedSubj, func(*nats.Msg) {
			w.suspectUntil.Store(time.Now().Add(sp.queue.AckWait + suspectFor).UnixNano())
		})
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", electedSubj, err)
		}
		defer func() { _ = elected.Unsubscribe() }()
		if len(sp.queue.Types) > 0 && sp.typ == "" {
			w.log.Debug("queue types set without concurrency; one consumer for the queue", "queue", sp.queue.Name)
		}
		// A consumer, or the stream, deleted behind the workers' back is
		// recreated as provisioned; Healthy reports the gap.
		cc, err := durable.Start(ctx, w.js, durable.Config{
			Stream: stream.CachedInfo().Config, Consumer: w.consumerConfig(sp),
			Handler: func(m jetstream.Msg) { w.dispatch(ctx, sp, m) },
			// Pulls that expire every 5 s (heartbeats every 2.5 s): pulls
			// the broker forgot (its JetStream restarted after a full
			// disk, without dropping the connection) are noticed within
			// seconds, not the default 30.
			Options: []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(min(sp.concurrency, 256)),
				jetstream.PullExpiry(5 * time.Second)},
			CheckInterval: w.cfg.ConsumerCheck, Logger: w.log,
		})
		if err != nil {
			return err
		}
		if sp.lane != nil {
			sp.lane.cons = cc.Consumer()
		}
		ccs = append(ccs, cc)
		w.setDurables(ccs)
		w.log.Info("consuming", "consumer", sp.name, "subject", sp.subject, "concurrency", sp.concurrency, "ack_wait", sp.queue.AckWait)
	}
	// The sorters start once their lanes are consumed: they read the
	// lanes' pending counts.
	for _, s := range w.sorters {
		if err := s.start(ctx); err != nil {
			return err
		}
		sorting.Go(func() { s.run(ctx) })
		w.log.Info("sorting by priority", "consumer", s.name, "queue", s.queue.Name, "window", s.queue.PriorityWindow)
	}
	// The queues' pauses, followed live, and this process's presence.
	opsCtx, stopOps := context.WithCancel(ctx)
	var ops sync.WaitGroup
	ops.Go(func() { w.followPauses(opsCtx) })
	ops.Go(func() { w.heartbeat(opsCtx) })
	defer func() {
		stopOps()
		ops.Wait()
		w.leave(context.WithoutCancel(ctx))
	}()
	lc.MarkReady()

	select {
	case <-lc.Stopping():
	case <-ctx.Done():
	}
	stopTaking(w.cfg.DrainTimeout)
	return nil
}

// setDurables records the consumers Healthy reports on.
func (w *Workers) setDurables(ccs []*durable.Consumer) {
	w.dmu.Lock()
	defer w.dmu.Unlock()
	w.durables = slices.Clone(ccs)
}

// Healthy returns nil while every consumer consumes, and why not otherwise:
// before Run has started them, or while one (or the tasks stream) is being
// recreated after it was deleted.
func (w *Workers) Healthy() error {
	select {
	case <-w.Ready():
	default:
		return errors.New("workers not consuming yet")
	}
	w.dmu.Lock()
	defer w.dmu.Unlock()
	var errs []error
	for _, c := range w.durables {
		errs = append(errs, c.Healthy())
	}
	return errors.Join(errs...)
}

// waitTasks waits for the running tasks to end; once grace has passed, or
// when ctx ends, it interrupts them (they go back to the broker) and waits
// for that.
func (w *Workers) waitTasks(ctx context.Context, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		w.inflight.Wait()
		close(done)
	}()
	drain := time.NewTimer(grace)
	defer drain.Stop()
	select {
	case <-done:
	case <-drain.C:
		w.interruptAll()
		<-done
	case <-ctx.Done():
		w.interruptAll()
		<-done
	}
}

// prepareConsumers removes the consumers a queue had under other settings: when a queue becomes
// prioritized or stops being so, or its type limits change, its old
// consumers would overlap the new ones, and a new consumer starts from the
// first task of the stream, so none is skipped. A FIFO queue that was
// prioritized also takes the tasks already sorted.
func (w *Workers) prepareConsumers(ctx context.Context, stream jetstream.Stream) error {
	want := map[string]bool{}
	for _, sp := range w.consumers {
		want[sp.name] = true
	}
	for _, s := range w.sorters {
		want[s.name] = true
	}
	lister := stream.ListConsumers(ctx)
	var stale []*jetstream.ConsumerInfo
	for info := range lister.Info() {
		if !want[info.Name] && w.ownQueue(info.Config) != "" {
			stale = append(stale, info)
		}
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("list consumers: %w", err)
	}
	for _, info := range stale {
		if err := stream.DeleteConsumer(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("remove consumer %s: %w", info.Name, err)
		}
		w.log.Warn("removed a consumer of the queue's former settings; every worker of a queue must agree on them",
			"queue", w.ownQueue(info.Config), "consumer", info.Name)
	}
	for _, sp := range w.consumers {
		if sp.queue.Prioritized {
			continue
		}
		leftover := wire.SubjectReadyPrefix + strings.TrimPrefix(sp.subject, wire.SubjectTasksPrefix)
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(leftover))
		if err != nil {
			return fmt.Errorf("look for sorted tasks of queue %s: %w", sp.queue.Name, err)
		}
		if len(info.State.Subjects) > 0 {
			sp.leftover = leftover
		}
	}
	return nil
}

// ownQueue returns the configured queue whose tasks a consumer with cfg
// takes, or "".
func (w *Workers) ownQueue(cfg jetstream.ConsumerConfig) string {
	for _, f := range append([]string{cfg.FilterSubject}, cfg.FilterSubjects...) {
		for _, q := range w.cfg.Queues {
			if strings.HasPrefix(f, wire.SubjectTasksPrefix+"."+q.Name+".") || strings.HasPrefix(f, wire.SubjectReadyPrefix+"."+q.Name+".") {
				return q.Name
			}
		}
	}
	return ""
}

// dispatch hands one delivered message to an idle runner, or to a new one
// when none is idle: the broker's MaxAckPending bounds how many run at once,
// and so how many runners there are.
func (w *Workers) dispatch(ctx context.Context, sp *spec, m jetstream.Msg) {
	w.cmu.Lock()
	if w.closing {
		w.cmu.Unlock()
		_ = m.Nak()
		return
	}
	w.inflight.Add(1)
	w.cmu.Unlock()
	j := job{sp: sp, m: m}
	select {
	case w.idle <- j:
	default:
		w.runners.Add(1)
		go w.runner(ctx, j)
	}
}

// runner processes j, then every delivery handed to it while idle, until
// Run returns. A goroutine per task spent ~6 % of the CPU of a noop task
// growing its fresh stack (BenchmarkRatio profile); a runner keeps its.
func (w *Workers) runner(ctx context.Context, j job) {
	defer w.runners.Done()
	for {
		w.process(ctx, j.sp, j.m)
		w.inflight.Done()
		select {
		case j = <-w.idle:
		case <-w.quit:
			return
		}
	}
}

// cancelRunning handles a cancel request: the task's context ends if this
// process runs it, a sorter drops it if one holds it, and only then is the
// request answered, so the canceller knows who records the task's end.
func (w *Workers) cancelRunning(req micro.Request) {
	var in wire.TaskCancelRequest
	if err := rpc.Decode(req, &in); err != nil {
		w.answerCancel(req, wire.TaskCancelReply{}, err)
		return
	}
	id := in.ID
	w.rmu.Lock()
	cancel := w.running[id].cancel
	w.rmu.Unlock()
	if cancel == nil {
		w.cancelHeld(req, id)
		return
	}
	w.log.Info("cancelling task", "task_id", id)
	cancel(ErrCancelled)
	// The answer tells `gantry task cancel` that this worker records the
	// task's end, so the CLI neither removes its message nor finishes it a
	// second time.
	w.answerCancel(req, wire.TaskCancelReply{ID: id, Action: wire.CancelStopping, Worker: w.cfg.Name}, nil)
}

// cancelHeld drops task id if a sorter of this process holds it, and
// answers for it as for a running task.
func (w *Workers) cancelHeld(req micro.Request, id string) {
	for _, s := range w.sorters {
		if s.cancelled(id) {
			w.answerCancel(req, wire.TaskCancelReply{ID: id, Action: wire.CancelDropped, Worker: w.cfg.Name}, nil)
			return
		}
	}
}

func (w *Workers) answerCancel(req micro.Request, reply wire.TaskCancelReply, err error) {
	if err := rpc.Respond(req, reply, err); err != nil {
		w.log.Warn("answer cancel request", "task_id", reply.ID, "err", err)
	}
}

// interruptAll interrupts the running tasks, and those that start after.
func (w *Workers) interruptAll() {
	w.rmu.Lock()
	defer w.rmu.Unlock()
	w.interrupting = true
	for _, rt := range w.running {
		rt.cancel(errInterrupted)
	}
}

// track registers a running task for cancellation (interrupting it at once
// if interruptAll has run) and for the presence entry; the returned
// function unregisters it.
func (w *Workers) track(info wire.RunningTask, cancel context.CancelCauseFunc) func() {
	id := info.ID
	w.rmu.Lock()
	w.running[id] = runningTask{cancel: cancel, info: info}
	if w.interrupting {
		cancel(errInterrupted)
	}
	w.rmu.Unlock()
	return func() {
		w.rmu.Lock()
		delete(w.running, id)
		w.rmu.Unlock()
	}
}

// emitAsync stamps and publishes ev without waiting; the acknowledgement is
// checked later and a failed publish is made again synchronously, under
// the event id as Nats-Msg-Id.
//
// The hot-path publish carries no Nats-Msg-Id: the stream's duplicate
// tracking of one id per event cut the throughput of four writes per
// message by ~2.5x (BenchmarkEndToEnd/raw+4writes-with-msg-id). auditd
// stores an event under its id, so the rare event stored twice after a
// lost acknowledgement is stored once; the republish does carry the id.
func (w *Workers) emitAsync(ev wire.Event) {
	if m := w.eventMsg(&ev); m != nil {
		w.pub.Publish(m, ev.ID)
	}
}

// eventMsg stamps ev and returns it as a message for the audit stream, or
// nil (logged) if it cannot be encoded.
func (w *Workers) eventMsg(ev *wire.Event) *nats.Msg {
	w.audit.Stamp(ev)
	data, err := json.Marshal(ev)
	if err != nil {
		w.log.Error("encode audit event", "type", ev.Type, "task_id", ev.TaskID, "err", err)
		return nil
	}
	return &nats.Msg{Subject: ev.Type.Subject(), Data: data}
}

// sentEvent is an audit event published without waiting, whose
// acknowledgement a task's ack waits for.
type sentEvent struct {
	f  *asyncpub.Future
	id string
}

// emitSent publishes ev as emitAsync does and adds it to sent.
func (w *Workers) emitSent(sent []sentEvent, ev wire.Event) []sentEvent {
	m := w.eventMsg(&ev)
	if m == nil {
		return sent
	}
	return append(sent, sentEvent{f: w.pub.Async(m), id: ev.ID})
}

// awaitEvents waits until the audit stream has the events sent, each
// failed publish made again under its event id: a task message is
// acknowledged only once its events are stored, so that a process killed
// right after leaves no acknowledged task without them. Those that cannot
// be stored are logged.
func (w *Workers) awaitEvents(ctx context.Context, sent []sentEvent) {
	for _, e := range sent {
		if err := w.pub.Settle(ctx, e.f, e.id); err != nil {
			w.log.Error("audit event lost", "event_id", e.id, "err", err)
		}
	}
}

// finishedEvent is the TASK_FINISHED event of rec, a task recorded in its
// final state. Its id and time derive from the record, so that the event
// emitted again for a message delivered after its task ended (a broker that
// died forgot the ack) is the same event, stored once by auditd.
func finishedEvent(rec wire.TaskRecord, level wire.Level, message string, result json.RawMessage) wire.Event {
	sum := sha256.Sum256([]byte(rec.ID + "\x00" + strconv.Itoa(max(rec.Run, 1))))
	var id ulid.ULID
	_ = id.SetTime(ulid.Timestamp(rec.UpdatedAt))
	_ = id.SetEntropy(sum[:10])
	return wire.Event{ID: id.String(), Time: rec.UpdatedAt, Type: wire.EventTaskFinished, Level: level,
		TaskID: rec.ID, ResourceID: rec.Resource, JobID: rec.Job, Message: message,
		Payload: audit.Payload(finishedPayload{Attempts: rec.Attempts, Result: result, Run: max(rec.Run, 1), State: rec.State})}
}

// ackTimeout bounds the wait for the acknowledgement of an asynchronous
// publish (a closed connection never answers).
const ackTimeout = 10 * time.Second

// maxPendingWrites bounds the asynchronous writes waiting for their
// acknowledgement; a write past it waits for room.
const maxPendingWrites = 16384

// flushTimeout bounds the wait for the pending writes when Run stops.
const flushTimeout = 5 * time.Second

// flush waits for the asynchronous writes (the hot path's, the resources'
// events) to be acknowledged.
func (w *Workers) flush(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	if err := errors.Join(w.pub.Flush(ctx), w.resources.Flush(ctx)); err != nil {
		return fmt.Errorf("wait for pending writes: %w", err)
	}
	return nil
}

// maxDeliveries handles the consumer advisory for a task delivered
// MaxDeliver times without an outcome: the message stays in the stream and
// is never delivered again, so record NEEDS_REVIEW and delete it.
func (w *Workers) maxDeliveries(ctx context.Context, stream jetstream.Stream, data []byte) {
	var adv struct {
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries int    `json:"deliveries"`
	}
	if err := json.Unmarshal(data, &adv); err != nil || adv.StreamSeq == 0 {
		w.log.Warn("bad max deliveries advisory", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return
	}
	if err != nil {
		w.log.Error("read task at max deliveries", "seq", adv.StreamSeq, "err", err)
		return
	}
	queue, typ, _ := wire.ParseTaskSubject(raw.Subject)
	t, derr := DecodeTask(raw.Data, 0)
	if derr != nil {
		t.ID = publishedID(raw.Data)
	}
	msgID, created, intakeSeq, _ := origin(raw.Subject, raw.Header, raw.Time, adv.StreamSeq)
	id := taskID(t, msgID, created, intakeSeq)
	rec := wire.TaskRecord{TaskInfo: wire.TaskInfo{ID: id, Type: typ, Queue: queue, Resource: t.Resource, CreatedAt: created}}
	if prev, _, err := w.tasks.Get(ctx, id); err == nil {
		rec = prev
	}
	if t.ID != "" {
		rec.ID = t.ID
	}
	if rec.Job == "" {
		rec.Job = jobOf(raw.Header)
	}
	rec.Deliveries = adv.Deliveries
	rec.Attempts = adv.Deliveries - rec.Delays
	rec.Seq = adv.StreamSeq
	msg := fmt.Sprintf("max deliveries (%d) reached without an outcome", adv.Deliveries)
	if rec.LastError != "" {
		msg += "; last error: " + rec.LastError
	}
	rec.LastError = msg
	kept := asPublished(raw.Subject, raw.Header, raw.Data)
	// The advisory comes once: the review is tried a few times before the
	// message is left where it is, never delivered again but not lost.
	err = w.needsReviewRecord(ctx, rec, kept)
	for try := 1; err != nil && try < advisoryTries && ctx.Err() == nil; try++ {
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try) * time.Second):
			err = w.needsReviewRecord(ctx, rec, kept)
		}
	}
	if err != nil {
		w.log.Error("task at max deliveries not parked for review; its message stays in the stream", "task_id", rec.ID, "seq", adv.StreamSeq, "err", err)
		return
	}
	if err := stream.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		w.log.Error("delete task at max deliveries", "task_id", rec.ID, "seq", adv.StreamSeq, "err", err)
	}
	w.log.Warn("task reached max deliveries", "task_id", rec.ID, "seq", adv.StreamSeq, "deliveries", adv.Deliveries)
}

// advisoryTries bounds the attempts to park a task at max deliveries.
const advisoryTries = 4

// needsReviewRecord keeps msg (unless nil) on the task's review subject,
// writes rec as NEEDS_REVIEW pointing at it, and emits NEEDS_REVIEW and
// TASK_FINISHED. The record never holds the message: it fits the bucket
// whatever the message's size, and a secret in the message's payload stays
// out of what `gantry task get` prints. Only once it returns nil may the
// message leave its queue.
func (w *Workers) needsReviewRecord(ctx context.Context, rec wire.TaskRecord, msg *wire.StoredMessage) error {
	rec.State = wire.TaskNeedsReview
	rec.UpdatedAt = w.cfg.Clock.Now()
	w.metrics.pair(rec.Queue, rec.Type).needsReview.Inc()
	rec.RetryAt = nil
	if rec.CreatedAt.IsZero() {
		rec.CreatedAt = rec.UpdatedAt
	}
	rec.Message, rec.Kept = nil, ""
	if msg != nil {
		if err := w.keep(ctx, rec.ID, msg); err != nil {
			return err
		}
		rec.Kept = wire.ReviewSubject(rec.ID)
	} else if err := tasks.MarkNotKept(ctx, w.js, rec.ID); err != nil {
		return err
	}
	if _, err := w.tasks.Put(ctx, rec); err != nil {
		return fmt.Errorf("write task state %s: %w", rec.State, err)
	}
	sent := w.emitSent(nil, wire.Event{Type: wire.EventNeedsReview, Level: wire.LevelWarn, TaskID: rec.ID, ResourceID: rec.Resource, JobID: rec.Job,
		Message: rec.LastError, Payload: audit.Payload(map[string]any{"attempts": rec.Attempts, "queue": rec.Queue, "type": rec.Type})})
	sent = w.emitSent(sent, finishedEvent(rec, wire.LevelWarn, "task needs review", nil))
	w.awaitEvents(ctx, sent)
	return nil
}

// keep publishes msg, as its publisher sent it, on the review subject of
// task id, and waits until the stream has it. It drops the Nats-Msg-Id,
// which the stream would take for a duplicate of the task's first publish;
// so the copy is never larger than the message.
func (w *Workers) keep(ctx context.Context, id string, msg *wire.StoredMessage) error {
	m := &nats.Msg{Subject: wire.ReviewSubject(id), Data: msg.Data}
	for k, v := range msg.Header {
		if k == jetstream.MsgIDHeader {
			continue
		}
		if m.Header == nil {
			m.Header = nats.Header{}
		}
		m.Header[k] = v
	}
	if _, err := w.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("keep the message of task %s for review: %w", id, err)
	}
	return nil
}
