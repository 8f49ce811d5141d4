package scheduler

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/asyncpub"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/rpc"
	"github.com/gantry-dev/gantry/jobs"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/tasks"
)

// elect campaigns for the leader lease and, once held, renews it every
// third of its TTL by compare-and-swap. It runs on real time: the lease's
// TTL is the broker's. It reports every change on leaderCh and resigns when
// ctx ends.
func (r *runner) elect(ctx context.Context) {
	defer r.elector.Done()
	s := r.s
	ttl := s.cfg.LeaderTTL
	var updates <-chan jetstream.KeyValueEntry
	if w, err := r.st.KeyValue().Watch(ctx, r.st.LeaderKey()); err == nil {
		updates = w.Updates()
		defer func() { _ = w.Stop() }()
	}
	var (
		leading bool
		lead    wire.SchedulerLeader
		rev     uint64
	)
	tick := time.NewTimer(0)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if leading {
				rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if err := r.st.Resign(rctx, rev); err != nil {
					s.log.Warn("resign", "err", err)
				}
				cancel()
				s.validUntil.Store(0)
			}
			return
		case e := <-updates:
			// A leader key that goes away (resigned or expired) is a
			// chance to lead at once.
			if leading || e == nil || e.Operation() == jetstream.KeyValuePut {
				continue
			}
		case <-tick.C:
		}
		if leading {
			cctx, cancel := context.WithTimeout(ctx, ttl/3)
			start := time.Now()
			nrev, err := r.st.Renew(cctx, lead, rev, ttl)
			cancel()
			if err == nil {
				rev = nrev
				s.validUntil.Store(start.Add(ttl).UnixNano())
				tick.Reset(ttl / 3)
				continue
			}
			if ctx.Err() != nil {
				continue
			}
			s.log.Warn("leadership lost", "term", lead.Term, "err", err)
			leading = false
			s.validUntil.Store(0)
			if !r.send(ctx, leaderChange{}) {
				return
			}
			tick.Reset(ttl / 2)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, ttl)
		start := time.Now()
		l, nrev, err := r.st.Campaign(cctx, s.cfg.ID, s.host, s.clock.Now(), ttl)
		cancel()
		if err != nil {
			if !errors.Is(err, jobs.ErrLeaderHeld) && ctx.Err() == nil {
				s.log.Warn("campaign", "err", err)
			}
			tick.Reset(ttl / 2)
			continue
		}
		leading, lead, rev = true, l, nrev
		s.validUntil.Store(start.Add(ttl).UnixNano())
		if !r.send(ctx, leaderChange{gained: true, leader: l}) {
			continue
		}
		tick.Reset(ttl / 3)
	}
}

func (r *runner) send(ctx context.Context, ch leaderChange) bool {
	select {
	case r.leaderCh <- ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// becomeLeader loads what the last leader left (job states, cooldowns,
// unfinished runs), starts following task events and serving triggers, and
// plans every job, misfires included.
func (r *runner) becomeLeader(ctx context.Context, l wire.SchedulerLeader) {
	s := r.s
	r.leader, r.lead = true, l
	s.leading.Store(true)
	s.term.Store(l.Term)
	s.log.Info("leader elected", "term", l.Term)
	if err := s.audit.Emit(ctx, wire.Event{Type: wire.EventLeaderElected, Message: "scheduler leads",
		Payload: audit.Payload(map[string]any{"scheduler_id": l.ID, "host": l.Host, "term": l.Term})}); err != nil {
		s.log.Warn("emit audit event", "type", wire.EventLeaderElected, "err", err)
	}
	if err := r.catchUp(ctx); err != nil {
		s.log.Warn("catch up with jobs", "err", err)
	}
	states, err := r.st.States(ctx)
	if err != nil {
		s.log.Warn("load job states", "err", err)
	}
	if r.cooldowns, err = r.st.Cooldowns(ctx); err != nil {
		s.log.Warn("load cooldowns", "err", err)
		r.cooldowns = map[string]time.Time{}
	}
	for name := range states {
		if r.entries[name] == nil {
			if err := r.st.DeleteState(ctx, name); err != nil {
				s.log.Warn("forget job state", "job", name, "err", err)
			}
		}
	}
	for name, en := range r.entries {
		en.state = states[name]
		en.state.Job = name
		en.queue = nil
		for _, a := range en.state.Active {
			run, err := r.st.Run(ctx, name, a.Planned)
			if err != nil {
				run = wire.JobRun{Job: name, TaskID: a.TaskID, Planned: a.Planned, State: wire.TaskWaiting}
			}
			r.active[a.TaskID] = &active{job: name, run: run}
		}
	}
	r.startFollowing(ctx)
	now := s.clock.Now()
	for _, en := range r.entries {
		r.plan(en, now)
	}
	r.reconcile = s.clock.NewTimer(s.cfg.ReconcileInterval)
	r.reconcileActive(ctx)
}

// startFollowing subscribes to task events (from a little before the
// election, to cover the hand-over) and to trigger requests.
func (r *runner) startFollowing(ctx context.Context) {
	s := r.s
	since := time.Now().Add(-2*s.cfg.LeaderTTL - time.Minute)
	cons, err := s.js.OrderedConsumer(ctx, wire.StreamAudit, jetstream.OrderedConsumerConfig{
		FilterSubjects: taskEventSubjects,
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &since,
	})
	if err == nil {
		r.consume, err = cons.Consume(func(m jetstream.Msg) {
			select {
			case r.events <- m:
			case <-r.done:
			}
		})
	}
	if err != nil {
		s.log.Warn("follow task events; runs end only by reconciliation", "err", err)
	}
	r.trigSvc, err = rpc.AddService(s.js.Conn(), wire.SchedulerServiceName, "gantry scheduler (the leader): fire a job now",
		rpc.Endpoint{Name: "trigger", Subject: wire.SubjectSchedulerTrigger, Handler: r.serveTrigger})
	if err == nil {
		err = s.js.Conn().Flush()
	}
	if err != nil {
		s.log.Warn("serve triggers", "err", err)
	}
}

// The trigger service's refusals, by the kv vocabulary they match.
var (
	errNotLeading = kv.Sentinel("this scheduler does not lead (any more): try again", kv.ErrUnavailable)
	errStopping   = kv.Sentinel("the scheduler is stopping: try again", kv.ErrUnavailable)
	errOverlap    = kv.Sentinel("the job forbids overlap", kv.ErrConflict)
)

// triggerReply is the loop's answer to a trigger request.
type triggerReply struct {
	run wire.JobRun
	err error
}

func (r *runner) serveTrigger(m micro.Request) {
	respond := func(v any, err error) {
		if rerr := rpc.Respond(m, v, err); rerr != nil {
			r.s.log.Warn("trigger reply not sent", "err", rerr)
		}
	}
	var req wire.TriggerRequest
	if err := rpc.Decode(m, &req); err != nil {
		respond(nil, err)
		return
	}
	if req.Job == "" {
		respond(nil, fmt.Errorf("%w: want {\"job\": NAME}", kv.ErrInvalid))
		return
	}
	tr := triggerReq{job: req.Job, reply: make(chan triggerReply, 1)}
	select {
	case r.triggers <- tr:
	case <-r.done:
		respond(nil, errStopping)
		return
	}
	rep := <-tr.reply
	respond(rep.run, rep.err)
}

// unleadFlushTimeout bounds the wait for the pending publishes when the
// scheduler stops leading.
const unleadFlushTimeout = 10 * time.Second

// unlead stops everything only a leader does.
func (r *runner) unlead(reason string) {
	if !r.leader {
		return
	}
	r.flush()
	ctx, cancel := context.WithTimeout(context.Background(), unleadFlushTimeout)
	defer cancel()
	if err := r.pub.Flush(ctx); err != nil {
		r.s.log.Warn("publishes not confirmed", "err", err)
	}
	r.leader = false
	r.s.leading.Store(false)
	if r.consume != nil {
		r.consume.Stop()
		r.consume = nil
	}
	if r.trigSvc != nil {
		_ = r.trigSvc.Stop()
		r.trigSvc = nil
	}
	if r.reconcile != nil {
		r.reconcile.Stop()
		r.reconcile = nil
	}
	for _, en := range r.heap {
		en.index = -1
	}
	r.heap = r.heap[:0]
	for _, en := range r.entries {
		en.queue = nil
	}
	clear(r.active)
	r.s.log.Info("no longer leading", "reason", reason)
}

// fireDue fires (or skips) every job due now, after making sure the jobs
// are current and this scheduler still holds its term.
func (r *runner) fireDue(ctx context.Context) {
	now := r.s.clock.Now()
	if r.heap.Len() == 0 || r.heap[0].due.After(now) {
		return
	}
	// The fencing read runs while the jobs catch up: two round trips in
	// the time of one.
	fence := make(chan error, 1)
	go func() { fence <- r.fenced(ctx) }()
	if err := r.catchUp(ctx); err != nil {
		<-fence
		r.s.log.Warn("not firing: jobs not current", "err", err)
		r.hold(now)
		return
	}
	if err := <-fence; err != nil {
		r.s.log.Warn("not firing: fencing check failed", "err", err)
		r.hold(now)
		return
	}
	var batch []*entry
	for r.heap.Len() > 0 && !r.heap[0].due.After(now) {
		batch = append(batch, heap.Pop(&r.heap).(*entry))
	}
	sortDue(batch)
	counts := r.taskCounts(ctx)
	var pubs []*pub
	for _, en := range batch {
		if len(en.queue) == 0 && en.next.Before(now.Add(-r.s.cfg.MisfireThreshold)) {
			// The timer fired past the misfire threshold (the wall clock
			// jumped forward, the machine slept): the planned times since
			// are missed ones, for the job's misfire policy to decide.
			r.plan(en, now)
			if len(en.queue) == 0 {
				continue
			}
		}
		var pf plannedFire
		if len(en.queue) > 0 {
			pf, en.queue = en.queue[0], en.queue[1:]
		} else {
			pf = plannedFire{at: en.next, trigger: wire.TriggerSchedule}
		}
		if reason, detail := r.decide(en, now, counts); reason == wire.SkipWindow && len(en.queue) == 0 {
			r.skipWindow(en, pf, detail)
		} else if reason != "" {
			r.skip(en, pf, reason, detail)
		} else {
			pubs = append(pubs, r.fire(en, pf, now, counts))
		}
		if pf.at.After(en.state.LastPlanned) {
			en.state.LastPlanned = pf.at
		}
		r.touch(en)
		if len(en.queue) > 0 {
			r.reschedule(en, now)
		} else {
			r.plan(en, now)
		}
	}
	r.complete(ctx, pubs)
	r.flush()
}

// hold delays every due entry a little after a failed check.
func (r *runner) hold(now time.Time) {
	for _, en := range r.heap {
		if !en.due.After(now) {
			en.due = now.Add(500 * time.Millisecond)
		}
	}
	heap.Init(&r.heap)
}

// decide returns why a job must not fire now, or "" if it may.
func (r *runner) decide(en *entry, now time.Time, counts *taskCounts) (wire.SkipReason, string) {
	j := en.spec.Job
	if j.Paused {
		return wire.SkipPaused, "job is paused"
	}
	if !en.spec.InWindow(now) {
		return wire.SkipWindow, fmt.Sprintf("%s is outside the windows %v", now.In(en.spec.Location()).Format("15:04"), j.Windows)
	}
	if until := r.cooldowns[j.Resource]; j.Resource != "" && now.Before(until) {
		return wire.SkipCooldown, fmt.Sprintf("resource %s cools down until %s", j.Resource, until.Format(time.RFC3339))
	}
	if j.MaxPerHour > 0 {
		hourAgo := now.Add(-time.Hour)
		en.state.RecentFires = slices.DeleteFunc(en.state.RecentFires, func(t time.Time) bool { return !t.After(hourAgo) })
		if len(en.state.RecentFires) >= j.MaxPerHour {
			return wire.SkipBudget, fmt.Sprintf("%d fires in the last hour (max %d)", len(en.state.RecentFires), j.MaxPerHour)
		}
	}
	if len(en.state.Active) > 0 && j.Overlap == wire.OverlapForbid {
		return wire.SkipOverlap, "previous run " + en.state.Active[len(en.state.Active)-1].TaskID + " has not finished"
	}
	if counts != nil {
		if max := r.s.cfg.MaxConcurrent; max > 0 && counts.total >= max {
			return wire.SkipConcurrency, fmt.Sprintf("%d tasks queued or running (max %d)", counts.total, max)
		}
		if max := r.s.cfg.MaxPerType[j.Type]; max > 0 && counts.byType[j.Type] >= max {
			return wire.SkipConcurrency, fmt.Sprintf("%d %s tasks queued or running (max %d)", counts.byType[j.Type], j.Type, max)
		}
	}
	return "", ""
}

func (r *runner) skip(en *entry, pf plannedFire, reason wire.SkipReason, detail string) {
	j := en.spec.Job
	r.s.log.Debug("job skipped", "job", j.Name, "reason", reason, "planned", pf.at)
	r.s.m.skips.WithLabelValues(j.Name, string(reason)).Inc()
	r.emitAsync(wire.Event{Type: wire.EventJobSkipped, JobID: j.Name, TaskID: wire.JobTaskID(j.Name, pf.at),
		Message: "job skipped: " + detail,
		Payload: audit.Payload(map[string]any{"reason": reason, "planned": pf.at, "trigger": pf.trigger})})
}

// skipWindow skips a fire outside the job's windows together with every
// planned time up to the next one inside them, in one JOB_SKIPPED: a job
// every 10 s outside a 06:00-22:00 window records one event a night, not
// 2,880.
func (r *runner) skipWindow(en *entry, pf plannedFire, detail string) {
	j := en.spec.Job
	next := en.spec.NextInWindow(pf.at)
	payload := map[string]any{"reason": wire.SkipWindow, "planned": pf.at, "trigger": pf.trigger, "skipped": next.Skipped + 1}
	msg := fmt.Sprintf("job skipped: %s; %d planned fires skipped", detail, next.Skipped+1)
	if !next.Planned.IsZero() {
		payload["until"] = next.Planned
		msg += " until " + next.Planned.In(en.spec.Location()).Format(time.RFC3339)
		until := next.Planned
		en.state.SkipUntil = &until
	}
	r.s.log.Debug("job skipped", "job", j.Name, "reason", wire.SkipWindow, "planned", pf.at, "skipped", next.Skipped+1)
	r.emitAsync(wire.Event{Type: wire.EventJobSkipped, JobID: j.Name, TaskID: wire.JobTaskID(j.Name, pf.at),
		Message: msg, Payload: audit.Payload(payload)})
}

// pub is a task publish in flight.
type pub struct {
	en  *entry
	f   *asyncpub.Future
	err error // the task message could not be built: nothing was published
	run wire.JobRun
}

// fire publishes the task of one planned fire without waiting; complete
// waits. Overlap replace cancels the unfinished runs first.
func (r *runner) fire(en *entry, pf plannedFire, now time.Time, counts *taskCounts) *pub {
	j := en.spec.Job
	if j.Overlap == wire.OverlapReplace {
		r.cancelActive(en)
	}
	id := wire.JobTaskID(j.Name, pf.at)
	if pf.trigger == wire.TriggerManual {
		id = wire.ManualTaskID(j.Name, pf.at)
	}
	task := wire.Task{ID: id, Payload: j.Payload, Resource: j.Resource, Priority: j.Priority,
		MaxAttempts: j.MaxAttempts, Timeout: j.Timeout}
	msg, err := tasks.NewMsg(j.Queue, j.Type, task)
	p := &pub{en: en, err: err, run: wire.JobRun{
		Job: j.Name, TaskID: id, Planned: pf.at, Fired: now, Trigger: pf.trigger,
		State: wire.TaskWaiting, Machine: r.s.host, Term: r.lead.Term,
	}}
	if err == nil {
		msg.Header.Set(wire.HeaderJob, j.Name)
		msg.Header.Set(wire.HeaderPlanned, pf.at.UTC().Format(time.RFC3339Nano))
		p.f = r.pub.Async(msg)
	}
	en.state.Active = append(en.state.Active, wire.ActiveRun{TaskID: id, Planned: pf.at})
	if n := len(en.state.Active) - maxActivePerJob; n > 0 {
		for _, a := range en.state.Active[:n] {
			delete(r.active, a.TaskID)
		}
		en.state.Active = slices.Delete(en.state.Active, 0, n)
	}
	if j.MaxPerHour > 0 {
		en.state.RecentFires = append(en.state.RecentFires, now)
	}
	t := now
	en.state.LastFired = &t
	r.touch(en)
	r.active[id] = &active{job: j.Name, run: p.run}
	counts.add(j.Type)
	return p
}

// cancelActive asks the workers to cancel a job's unfinished runs.
func (r *runner) cancelActive(en *entry) {
	for _, a := range en.state.Active {
		data, err := json.Marshal(wire.TaskCancelRequest{ID: a.TaskID})
		if err == nil {
			err = r.s.js.Conn().Publish(wire.SubjectTaskCancel, data)
		}
		if err != nil {
			r.s.log.Warn("cancel replaced run", "task_id", a.TaskID, "err", err)
			continue
		}
		r.s.log.Info("replacing run", "job", en.spec.Job.Name, "task_id", a.TaskID)
	}
}

// complete waits for the task publishes of a batch and records each fire:
// its run and JOB_FIRED. A failed publish is published again (its
// Nats-Msg-Id makes that safe); a duplicate (fired before by another
// leader) is not recorded again.
func (r *runner) complete(ctx context.Context, pubs []*pub) {
	for _, p := range pubs {
		var ack *jetstream.PubAck
		// A task that could not be built was not published.
		err := p.err
		if err == nil {
			err = r.pub.Settle(ctx, p.f, "")
		}
		if err == nil {
			ack, err = p.f.Ack()
		}
		j := p.en.spec.Job
		id := p.run.TaskID
		if err != nil {
			r.s.log.Error("fire", "job", j.Name, "task_id", id, "err", err)
			delete(r.active, id)
			p.en.state.Active = slices.DeleteFunc(p.en.state.Active, func(a wire.ActiveRun) bool { return a.TaskID == id })
			r.touch(p.en)
			r.s.m.misses.WithLabelValues(j.Name).Inc()
			r.emitAsync(wire.Event{Type: wire.EventJobMissed, Level: wire.LevelError, JobID: j.Name, TaskID: id,
				Message: "task could not be published: " + err.Error(),
				Payload: audit.Payload(map[string]any{"planned": p.run.Planned, "trigger": p.run.Trigger})})
			continue
		}
		if ack.Duplicate {
			r.s.log.Info("already fired", "job", j.Name, "task_id", id)
			continue
		}
		r.putRun(p.run)
		r.s.m.fires.WithLabelValues(j.Name, string(p.run.Trigger)).Inc()
		r.s.m.lag.Observe(max(p.run.Fired.Sub(p.run.Planned).Seconds(), 0))
		r.emitAsync(wire.Event{Type: wire.EventJobFired, JobID: j.Name, TaskID: id,
			Message: "job fired",
			Payload: audit.Payload(map[string]any{
				"planned": p.run.Planned, "fired": p.run.Fired, "trigger": p.run.Trigger, "term": p.run.Term,
				"queue": j.Queue, "type": j.Type, "lag_ms": p.run.Fired.Sub(p.run.Planned).Milliseconds(),
			})})
	}
}

// trigger fires a job now, on an operator's request: regardless of pause,
// window, budget, cooldown and concurrency, but not into an overlap the
// job forbids.
func (r *runner) trigger(ctx context.Context, name string) (wire.JobRun, error) {
	if !r.leader {
		return wire.JobRun{}, errNotLeading
	}
	if err := r.catchUp(ctx); err != nil {
		return wire.JobRun{}, err
	}
	en := r.entries[name]
	if en == nil {
		return wire.JobRun{}, fmt.Errorf("job %q: %w", name, jobs.ErrNotFound)
	}
	if err := r.fenced(ctx); err != nil {
		return wire.JobRun{}, fmt.Errorf("fencing check failed: %v: %w", err, errNotLeading)
	}
	if len(en.state.Active) > 0 && en.spec.Job.Overlap == wire.OverlapForbid {
		return wire.JobRun{}, fmt.Errorf("job %s: run %s has not finished and %w",
			name, en.state.Active[len(en.state.Active)-1].TaskID, errOverlap)
	}
	now := r.s.clock.Now()
	p := r.fire(en, plannedFire{at: now, trigger: wire.TriggerManual}, now, nil)
	r.complete(ctx, []*pub{p})
	r.flush()
	if r.active[p.run.TaskID] == nil {
		return wire.JobRun{}, errors.New("task could not be published")
	}
	return p.run, nil
}

// taskCounts is how many tasks the tasks stream holds (waiting or
// running), as the broker counts them.
type taskCounts struct {
	total  int
	byType map[string]int
}

func (c *taskCounts) add(typ string) {
	if c == nil {
		return
	}
	c.total++
	c.byType[typ]++
}

// taskCounts asks the broker for the tasks in the stream by subject, when a
// concurrency cap is set.
func (r *runner) taskCounts(ctx context.Context) *taskCounts {
	if r.s.cfg.MaxConcurrent == 0 && len(r.s.cfg.MaxPerType) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	str, err := r.s.js.Stream(cctx, wire.StreamTasks)
	var info *jetstream.StreamInfo
	if err == nil {
		// Every subject of the stream: gantry.tasks.> and, for prioritized
		// queues, the tasks their sorters moved to gantry.ready.>.
		info, err = str.Info(cctx, jetstream.WithSubjectFilter(">"))
	}
	if err != nil {
		r.s.log.Warn("count tasks; concurrency caps not applied to this batch", "err", err)
		return nil
	}
	c := &taskCounts{byType: map[string]int{}}
	for subj, n := range info.State.Subjects {
		if strings.HasPrefix(subj, wire.SubjectReviewPrefix+".") {
			// Kept for review: not waiting to run.
			continue
		}
		c.total += int(n)
		c.byType[typeOfSubject(subj)] += int(n)
	}
	return c
}
