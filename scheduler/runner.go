package scheduler

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/asyncpub"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/jobs"
	"github.com/gantry-dev/gantry/kv"
)

// maxMissedEvents bounds the JOB_MISSED events of one job after one
// downtime; the rest are counted in one summary event.
const maxMissedEvents = 100

// maxPendingAcks bounds the task, state, run and event publishes awaiting
// their acknowledgement before the loop waits for room.
const maxPendingAcks = 2000

// publishRetries is how many times a failed task publish (or audit event)
// is published again, synchronously: its Nats-Msg-Id makes that safe.
const publishRetries = 3

// maxReconcile bounds the task lookups of one reconciliation pass.
const maxReconcile = 1000

// maxActivePerJob bounds the unfinished runs tracked per job (overlap
// allow, tasks nobody works on); the oldest is forgotten first, its run
// record left as last written.
const maxActivePerJob = 100

// maxMisfireScan bounds how many missed planned times are enumerated for a
// job; a longer gap is skipped to the present.
const maxMisfireScan = 100_000

// entry is one job as the scheduler knows it.
type entry struct {
	spec  *jobs.Spec
	rev   uint64
	state wire.JobState
	// queue holds planned times to fire at once (misfires), oldest first.
	queue []plannedFire
	// next is the next planned time on schedule (zero: none), due the
	// moment it fires (next + jitter, or now when queue is non-empty).
	next  time.Time
	due   time.Time
	index int
	dirty bool
}

type plannedFire struct {
	at      time.Time
	trigger string
}

// active is a fired task whose end the leader waits for.
type active struct {
	job string
	run wire.JobRun
}

type leaderChange struct {
	gained bool
	leader wire.SchedulerLeader
}

type triggerReq struct {
	job   string
	reply chan triggerReply
}

// runner is the state of one Run: owned by the loop goroutine, except
// where noted.
type runner struct {
	s       *Scheduler
	jobs    *jobs.Store
	st      *jobs.SchedulerStore
	jobsStr jetstream.Stream
	tasks   jetstream.KeyValue
	watch   jetstream.KeyWatcher
	lastRev uint64

	entries map[string]*entry
	heap    dueHeap
	timer   clock.Timer
	armed   bool

	leader    bool
	lead      wire.SchedulerLeader
	leaderCh  chan leaderChange
	active    map[string]*active
	cooldowns map[string]time.Time
	events    chan jetstream.Msg
	consume   jetstream.ConsumeContext
	triggers  chan triggerReq
	trigSvc   micro.Service
	reconcile clock.Timer

	// pub publishes tasks, job states, runs and events without waiting
	// and checks their acknowledgements.
	pub   *asyncpub.Publisher
	dirty []*entry
	// done is closed when the loop returns, releasing NATS callbacks that
	// wait for it.
	done chan struct{}

	reconciled  chan []wire.TaskInfo
	reconciling bool
	elector     sync.WaitGroup

	// stopping is closed by the scheduler's Stop.
	stopping <-chan struct{}
}

func (s *Scheduler) newRunner(ctx context.Context, stopping <-chan struct{}) (*runner, error) {
	jobStore, err := jobs.NewStore(ctx, s.js)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	st, err := jobs.NewSchedulerStore(ctx, s.js)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	str, err := s.js.Stream(ctx, "KV_"+wire.BucketJobs)
	if err != nil {
		return nil, fmt.Errorf("scheduler: open jobs stream: %w", err)
	}
	pub, err := asyncpub.New(s.js.Conn(), asyncpub.Config{MaxPending: maxPendingAcks, Retries: publishRetries, Logger: s.log})
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	r := &runner{
		s: s, jobs: jobStore, st: st, jobsStr: str, pub: pub,
		entries:    map[string]*entry{},
		leaderCh:   make(chan leaderChange),
		active:     map[string]*active{},
		cooldowns:  map[string]time.Time{},
		events:     make(chan jetstream.Msg, 1024),
		triggers:   make(chan triggerReq),
		done:       make(chan struct{}),
		reconciled: make(chan []wire.TaskInfo),
		stopping:   stopping,
	}
	if b, err := s.js.KeyValue(ctx, wire.BucketTasks); err == nil {
		r.tasks = b
	}
	// A bad value in gantry_scheduler (a forged leader key, a term that is
	// not a number) is deleted or skipped, and recorded.
	st.Quarantine = kv.NewQuarantine(r.emitAsync)
	return r, nil
}

// start applies the config's jobs and loads every job.
func (r *runner) start(ctx context.Context) error {
	for _, j := range r.s.cfg.Jobs {
		if _, err := jobs.Apply(ctx, r.jobs, j, r.s.clock.Now()); err != nil {
			return fmt.Errorf("scheduler: apply config job %s: %w", j.Name, err)
		}
	}
	w, err := r.jobs.KeyValue().WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("scheduler: watch jobs: %w", err)
	}
	r.watch = w
	for {
		select {
		case <-ctx.Done():
			_ = w.Stop()
			return nil
		case e := <-w.Updates():
			if e == nil {
				r.s.log.Info("jobs loaded", "jobs", len(r.entries))
				return nil
			}
			r.applyJob(e)
		}
	}
}

func (r *runner) loop(ctx context.Context) error {
	ectx, ecancel := context.WithCancel(ctx)
	r.elector.Add(1)
	go r.elect(ectx)
	defer func() {
		close(r.done)
		ecancel()
		// The elector may be sending a change: take it so it can resign.
		done := make(chan struct{})
		go func() { r.elector.Wait(); close(done) }()
		for {
			select {
			case <-r.leaderCh:
				continue
			case <-done:
			}
			break
		}
		r.unlead("stopped")
		_ = r.watch.Stop()
	}()
	for {
		var timerC, reconcileC <-chan time.Time
		if r.armed {
			timerC = r.timer.C()
		}
		if r.leader && r.reconcile != nil {
			reconcileC = r.reconcile.C()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.stopping:
			return nil
		case e, ok := <-r.watch.Updates():
			if !ok {
				return errors.New("scheduler: jobs watcher closed")
			}
			if e != nil {
				r.applyJob(e)
				r.flush()
				r.arm()
			}
		case ch := <-r.leaderCh:
			if ch.gained {
				r.becomeLeader(ctx, ch.leader)
			} else {
				r.unlead("lease lost")
			}
			r.arm()
		case <-timerC:
			r.armed = false
			r.fireDue(ctx)
			r.arm()
		case m := <-r.events:
			r.taskEvent(m)
			r.flush()
			r.arm()
		case tr := <-r.triggers:
			run, err := r.trigger(ctx, tr.job)
			tr.reply <- triggerReply{run: run, err: err}
			r.arm()
		case found := <-r.reconciled:
			r.reconciledRuns(ctx, found)
		case <-reconcileC:
			r.reconcileActive(ctx)
			r.reconcile.Reset(r.s.cfg.ReconcileInterval)
			r.arm()
		}
	}
}

// applyJob takes one change of gantry_jobs into the table.
func (r *runner) applyJob(e jetstream.KeyValueEntry) {
	r.lastRev = max(r.lastRev, e.Revision())
	name := e.Key()
	old := r.entries[name]
	if e.Operation() != jetstream.KeyValuePut {
		if old != nil {
			r.removeEntry(old)
			delete(r.entries, name)
			if r.leader {
				if err := r.st.DeleteState(context.Background(), name); err != nil {
					r.s.log.Warn("forget job state", "job", name, "err", err)
				}
			}
			r.s.log.Info("job removed", "job", name)
		}
		return
	}
	if old != nil && old.rev == e.Revision() {
		return
	}
	j, err := jobs.Decode(name, e.Value())
	var sp *jobs.Spec
	if err == nil {
		if j, err = jobs.Normalize(j); err == nil {
			sp, err = jobs.Compile(j)
		}
	}
	if err != nil {
		if old != nil {
			r.removeEntry(old)
			delete(r.entries, name)
		}
		r.s.log.Warn("job rejected", "job", name, "err", err)
		if r.leader {
			r.emitAsync(wire.Event{Type: wire.EventConfigRejected, Level: wire.LevelWarn, JobID: name,
				Message: "job rejected: " + err.Error()})
		}
		return
	}
	en := old
	if en == nil {
		en = &entry{index: -1, state: wire.JobState{Job: name}}
		r.entries[name] = en
	}
	en.spec, en.rev = sp, e.Revision()
	if r.leader {
		r.plan(en, r.s.clock.Now())
	}
}

func (r *runner) removeEntry(en *entry) {
	if en.index >= 0 {
		heap.Remove(&r.heap, en.index)
	}
}

// plan computes an entry's next fire from its persisted state and
// (re)places it in the heap. Planned times already past are fired late
// (trigger schedule) while none of them is older than the misfire
// threshold (a failover, a slow batch); once one is, the scheduler was
// down, and the job's misfire policy decides for every past one: "once"
// fires once, however many passed.
func (r *runner) plan(en *entry, now time.Time) {
	j := en.spec.Job
	en.queue = nil
	base := en.state.LastPlanned
	for _, t := range []time.Time{j.CreatedAt, j.UpdatedAt} {
		if t.After(base) {
			base = t
		}
	}
	if su := en.state.SkipUntil; su != nil {
		switch {
		case !su.After(en.state.LastPlanned) || j.UpdatedAt.After(en.state.LastPlanned):
			// Reached, or the job changed since: its windows may have.
			en.state.SkipUntil = nil
		case su.After(base):
			// The planned times before it were skipped, in one summary.
			base = su.Add(-time.Nanosecond)
		}
	}
	if base.IsZero() {
		// Never fired, and no creation time (written by another client):
		// nothing can have been missed.
		base = now
	}
	cutoff := now.Add(-r.s.cfg.MisfireThreshold)
	first := en.spec.Next(base)
	if first.IsZero() || first.After(cutoff) {
		en.next = first
		r.reschedule(en, now)
		return
	}
	var missed []time.Time
	p := first
	more := 0
	for !p.IsZero() && p.Before(now) {
		if len(missed) >= maxMisfireScan {
			more++
			p = en.spec.Next(now.Add(-time.Nanosecond))
			break
		}
		missed = append(missed, p)
		p = en.spec.Next(p)
	}
	r.misfire(en, missed, more)
	en.next = p
	r.reschedule(en, now)
}

// misfire applies the job's misfire policy to planned times missed while
// no scheduler led.
func (r *runner) misfire(en *entry, missed []time.Time, more int) {
	j := en.spec.Job
	var fire []time.Time
	switch j.Misfire {
	case wire.MisfireOnce:
		fire = missed[len(missed)-1:]
	case wire.MisfireAll:
		n := orDefault(j.MisfireCap, jobs.DefaultMisfireCap)
		fire = missed[max(0, len(missed)-n):]
	}
	skipped := missed[:len(missed)-len(fire)]
	r.s.m.misses.WithLabelValues(j.Name).Add(float64(len(skipped) + more))
	for i, p := range skipped {
		if i == maxMissedEvents {
			break
		}
		r.emitAsync(wire.Event{Type: wire.EventJobMissed, Level: wire.LevelWarn, JobID: j.Name,
			TaskID:  wire.JobTaskID(j.Name, p),
			Message: "planned fire missed while no scheduler led",
			Payload: audit.Payload(map[string]any{"planned": p, "policy": j.Misfire})})
	}
	if extra := len(skipped) - maxMissedEvents + more; extra > 0 {
		msg := fmt.Sprintf("%d more planned fires missed", extra)
		if more > 0 {
			msg = fmt.Sprintf("at least %d more planned fires missed", extra)
		}
		r.emitAsync(wire.Event{Type: wire.EventJobMissed, Level: wire.LevelWarn, JobID: j.Name,
			Message: msg,
			Payload: audit.Payload(map[string]any{"count": extra, "policy": j.Misfire})})
	}
	for _, p := range fire {
		en.queue = append(en.queue, plannedFire{at: p, trigger: wire.TriggerMisfire})
	}
	last := missed[len(missed)-1]
	if len(fire) == 0 || len(skipped) > 0 {
		if len(fire) > 0 {
			last = skipped[len(skipped)-1]
		}
		if last.After(en.state.LastPlanned) {
			en.state.LastPlanned = last
			r.touch(en)
		}
	}
	r.s.log.Warn("misfire", "job", j.Name, "missed", len(missed)+more, "firing", len(fire), "policy", j.Misfire)
}

func orDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// reschedule sets an entry's due moment and its place in the heap.
func (r *runner) reschedule(en *entry, now time.Time) {
	switch {
	case len(en.queue) > 0:
		en.due = now
	case !en.next.IsZero():
		en.due = en.next.Add(en.spec.Jitter(en.next))
	default:
		en.due = time.Time{}
	}
	switch {
	case en.due.IsZero() && en.index >= 0:
		heap.Remove(&r.heap, en.index)
	case en.due.IsZero():
	case en.index >= 0:
		heap.Fix(&r.heap, en.index)
	default:
		heap.Push(&r.heap, en)
	}
}

// arm sets the timer to the earliest due entry.
func (r *runner) arm() {
	if !r.leader || r.heap.Len() == 0 {
		if r.armed {
			r.timer.Stop()
			r.armed = false
		}
		return
	}
	d := r.heap[0].due.Sub(r.s.clock.Now())
	if r.timer == nil {
		r.timer = r.s.clock.NewTimer(d)
	} else {
		r.timer.Stop()
		select {
		case <-r.timer.C():
		default:
		}
		r.timer.Reset(d)
	}
	r.armed = true
}

// dueHeap orders entries by due moment.
type dueHeap []*entry

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *dueHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.index = -1
	*h = old[:len(old)-1]
	return e
}

// catchUp applies every change of gantry_jobs written before now, so that
// no decision is taken on a stale copy: it asks the broker for the first
// message of the bucket after the last one the watcher delivered (a direct
// get from that sequence on) and, while there is one, consumes the watcher
// up to it.
func (r *runner) catchUp(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		m, err := r.jobsStr.GetMsg(cctx, r.lastRev+1, jetstream.WithGetMsgSubject(jobsSubjects))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read jobs stream: %w", err)
		}
		for r.lastRev < m.Sequence {
			select {
			case <-cctx.Done():
				return fmt.Errorf("catch up with jobs (at %d of %d): %w", r.lastRev, m.Sequence, cctx.Err())
			case e, ok := <-r.watch.Updates():
				if !ok {
					return errors.New("jobs watcher closed")
				}
				if e != nil {
					r.applyJob(e)
				}
			}
		}
	}
}

// jobsSubjects matches every message of the jobs bucket's stream.
const jobsSubjects = "$KV." + wire.BucketJobs + ".>"

// fenced reports whether this scheduler still holds the leader key with its
// term, reading the key from the broker.
func (r *runner) fenced(ctx context.Context) error {
	if time.Now().UnixNano() >= r.s.validUntil.Load() {
		return errors.New("leader lease not renewed in time")
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, _, err := r.st.Leader(cctx)
	if err != nil {
		return err
	}
	if l.ID != r.lead.ID || l.Term != r.lead.Term {
		return fmt.Errorf("leader key holds %s term %d, not %s term %d", l.ID, l.Term, r.lead.ID, r.lead.Term)
	}
	return nil
}

// emitAsync publishes an audit event without waiting; pub checks it.
func (r *runner) emitAsync(ev wire.Event) {
	m, err := r.s.audit.Message(&ev)
	if err != nil {
		r.s.log.Warn("emit audit event", "type", ev.Type, "err", err)
		return
	}
	r.pub.Publish(m, "")
}

// flush persists dirty job states, without waiting; pub checks them.
func (r *runner) flush() {
	for _, en := range r.dirty {
		en.dirty = false
		if !r.leader || r.entries[en.state.Job] != en {
			continue
		}
		m, err := r.st.StateMsg(en.state)
		if err != nil {
			r.s.log.Warn("save job state", "job", en.spec.Job.Name, "err", err)
			continue
		}
		r.pub.Publish(m, "")
	}
	clear(r.dirty)
	r.dirty = r.dirty[:0]
}

// touch marks an entry's state to be saved by the next flush.
func (r *runner) touch(en *entry) {
	if !en.dirty {
		en.dirty = true
		r.dirty = append(r.dirty, en)
	}
}

// taskEventSubjects are the audit events that tell the leader a fired task
// started or ended.
var taskEventSubjects = []string{
	wire.EventTaskStarted.Subject(), wire.EventTaskFinished.Subject(),
	wire.EventNeedsReview.Subject(), wire.EventTaskCancelled.Subject(), wire.EventTaskRejected.Subject(),
}

// eventPayload is the part of a task event's payload the scheduler reads.
type eventPayload struct {
	State     wire.TaskState `json:"state"`
	Attempts  int            `json:"attempts"`
	Attempt   int            `json:"attempt"`
	Error     string         `json:"error"`
	LastError string         `json:"last_error"`
}

// taskEvent records a fired task's start or end in its run.
func (r *runner) taskEvent(m jetstream.Msg) {
	var ev wire.Event
	if err := json.Unmarshal(m.Data(), &ev); err != nil {
		return
	}
	a := r.active[ev.TaskID]
	if a == nil || !r.leader {
		return
	}
	var p eventPayload
	_ = json.Unmarshal(ev.Payload, &p)
	switch ev.Type {
	case wire.EventTaskStarted:
		if a.run.State.Terminal() {
			return
		}
		t := ev.Time
		a.run.Started = &t
		a.run.State = wire.TaskRunning
		a.run.Attempts = max(a.run.Attempts, p.Attempt, p.Attempts)
		a.run.RanOn = ev.Host
		r.putRun(a.run)
	default:
		state := p.State
		switch {
		case ev.Type == wire.EventNeedsReview || ev.Type == wire.EventTaskRejected:
			state = wire.TaskNeedsReview
		case ev.Type == wire.EventTaskCancelled:
			state = wire.TaskCancelled
		case state == "":
			state = wire.TaskSucceeded
		}
		msg := cmpStr(p.Error, p.LastError)
		if msg == "" && state != wire.TaskSucceeded {
			msg = ev.Message
		}
		if a.run.RanOn == "" && ev.Type == wire.EventTaskFinished {
			a.run.RanOn = ev.Host
		}
		r.finish(ev.TaskID, state, max(p.Attempts, p.Attempt), msg, ev.Time)
	}
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// finish closes a fired task's run: its job's overlap ends and its
// resource's cooldown starts.
func (r *runner) finish(taskID string, state wire.TaskState, attempts int, msg string, at time.Time) {
	a := r.active[taskID]
	if a == nil {
		return
	}
	delete(r.active, taskID)
	a.run.State = state
	a.run.Attempts = max(a.run.Attempts, attempts)
	a.run.Error = msg
	a.run.Finished = &at
	r.putRun(a.run)
	en := r.entries[a.job]
	if en == nil {
		return
	}
	en.state.Active = slices.DeleteFunc(en.state.Active, func(x wire.ActiveRun) bool { return x.TaskID == taskID })
	r.touch(en)
	if res := en.spec.Job.Resource; res != "" && en.spec.Cooldown() > 0 {
		until := r.s.clock.Now().Add(en.spec.Cooldown())
		if until.After(r.cooldowns[res]) {
			r.cooldowns[res] = until
			if m, err := r.st.CooldownMsg(res, until); err == nil {
				r.pub.Publish(m, "")
			}
		}
	}
	r.s.log.Debug("run finished", "job", a.job, "task_id", taskID, "state", state)
}

func (r *runner) putRun(run wire.JobRun) {
	m, err := r.st.RunMsg(run, r.s.cfg.RunHistoryTTL)
	if err != nil {
		r.s.log.Warn("save run", "job", run.Job, "task_id", run.TaskID, "err", err)
		return
	}
	r.pub.Publish(m, "")
}

// reconcileActive looks up, off the loop, the unfinished runs in
// gantry_tasks, in case their end event was missed; the loop ends those
// found finished when the answer comes back on reconciled.
func (r *runner) reconcileActive(ctx context.Context) {
	if r.tasks == nil || r.reconciling || len(r.active) == 0 {
		return
	}
	ids := make([]string, 0, min(len(r.active), maxReconcile))
	for id := range r.active {
		if len(ids) == maxReconcile {
			break
		}
		ids = append(ids, id)
	}
	r.reconciling = true
	go func() {
		var found []wire.TaskInfo
		for _, id := range ids {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			e, err := r.tasks.Get(cctx, id)
			cancel()
			if err != nil {
				continue
			}
			var info wire.TaskInfo
			if json.Unmarshal(e.Value(), &info) == nil && info.State.Terminal() {
				info.ID = id
				found = append(found, info)
			}
		}
		select {
		case r.reconciled <- found:
		case <-r.done:
		}
	}()
}

// reconciledRuns ends the runs reconcileActive found finished.
func (r *runner) reconciledRuns(ctx context.Context, found []wire.TaskInfo) {
	r.reconciling = false
	for _, info := range found {
		r.finish(info.ID, info.State, info.Attempts, info.LastError, info.UpdatedAt)
	}
	r.flush()
}

// sortDue orders a batch: higher priority first, then earlier due.
func sortDue(batch []*entry) {
	sort.SliceStable(batch, func(i, j int) bool {
		pi, pj := batch[i].spec.Job.Priority, batch[j].spec.Job.Priority
		if pi != pj {
			return pi > pj
		}
		return batch[i].due.Before(batch[j].due)
	})
}

// typeOfSubject returns the type token of a task subject.
func typeOfSubject(subject string) string {
	if i := strings.LastIndexByte(subject, '.'); i >= 0 {
		return subject[i+1:]
	}
	return subject
}
