package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/jobs"
	"github.com/gantry-dev/gantry/lease"
	"github.com/gantry-dev/gantry/tasks"
)

// StatsWindow is how far back the per-queue counts, throughput and
// percentiles of Stats reach, and the resources' utilisation.
const StatsWindow = time.Hour

// Stats is a picture of the whole system, as `gantry stats` shows it and a
// dashboard polls it. Every part is read from the broker (streams,
// consumers, buckets) or the audit store, so any machine sees the same.
type Stats struct {
	// Time is when it was taken.
	Time      time.Time        `json:"time"`
	Queues    []QueueStats     `json:"queues"`
	Resources []ResourceStats  `json:"resources"`
	Leases    []Lease          `json:"leases"`
	Routes    []Route          `json:"routes"`
	Jobs      []JobInfo        `json:"jobs"`
	Workers   []WorkerInfo     `json:"workers"`
	Scheduler SchedulerStats   `json:"scheduler"`
	Audit     AuditIngestStats `json:"audit"`
	// Problems lists the parts that could not be read (their fields are
	// empty): the rest is still right.
	Problems []string `json:"problems,omitempty"`
}

// QueueStats is one queue: what waits, runs and ended, and how fast.
type QueueStats struct {
	Queue       string `json:"queue"`
	Paused      bool   `json:"paused"`
	PauseReason string `json:"pause_reason,omitempty"`
	// Waiting counts the tasks in the stream not handed to a worker yet.
	Waiting int `json:"waiting"`
	// Running counts the tasks the live workers run now.
	Running int `json:"running"`
	// RetryWait counts the tasks handed to a worker that wait to be
	// delivered again: a retry after a backoff, or a delay (a busy
	// resource, not_before, a rate limit).
	RetryWait int `json:"retry_wait"`
	// NeedsReview counts the NEEDS_REVIEW task records, in all and by
	// type.
	NeedsReview       int            `json:"needs_review"`
	NeedsReviewByType map[string]int `json:"needs_review_by_type,omitempty"`
	// Over the last WindowSeconds (StatsWindow, or less for workers that
	// started since), as the live workers saw it: tasks that ended, by
	// state, retries scheduled, tasks ended per minute, and percentiles of
	// the wait before an attempt and of the attempts' run time, in
	// seconds (nil without an observation).
	WindowSeconds    float64  `json:"window_seconds"`
	Done             uint64   `json:"done"`
	Succeeded        uint64   `json:"succeeded"`
	Failed           uint64   `json:"failed"`
	Cancelled        uint64   `json:"cancelled"`
	Retries          uint64   `json:"retries"`
	ThroughputPerMin float64  `json:"throughput_per_min"`
	WaitP50          *float64 `json:"wait_p50_seconds"`
	WaitP99          *float64 `json:"wait_p99_seconds"`
	RunP50           *float64 `json:"run_p50_seconds"`
	RunP99           *float64 `json:"run_p99_seconds"`
	// Consumers are the queue's consumers on the tasks stream.
	Consumers []ConsumerStats `json:"consumers"`
}

// ConsumerStats is one consumer of the tasks stream, as the broker counts.
type ConsumerStats struct {
	Name string `json:"name"`
	// Pending counts the messages not yet delivered; AckPending those
	// delivered and not yet acknowledged.
	Pending    uint64 `json:"pending"`
	AckPending int    `json:"ack_pending"`
	Paused     bool   `json:"paused"`
}

// ResourceStats is a resource with the share of the last StatsWindow it
// was leased (from the audit store; nil when auditd does not answer).
type ResourceStats struct {
	Resource
	Utilisation *float64 `json:"utilisation"`
}

// SchedulerStats names the leading scheduler, if one leads.
type SchedulerStats struct {
	Leading bool                  `json:"leading"`
	Leader  *wire.SchedulerLeader `json:"leader,omitempty"`
}

// AuditIngestStats is how auditd keeps up with the audit stream: what it
// stored since it started, what it has yet to store and how old the
// oldest of that is.
type AuditIngestStats struct {
	// Stored is nil when auditd does not answer.
	Stored *uint64 `json:"stored"`
	// Pending counts the events of the audit stream auditd has not stored
	// yet.
	Pending uint64 `json:"pending"`
	// LagSeconds is the age of the oldest of them (0 when none).
	LagSeconds float64 `json:"lag_seconds"`
}

// Stats takes a picture of the system. A part that cannot be read is
// named in Problems and left empty; Stats fails only when ctx does.
//
// Counting NEEDS_REVIEW tasks reads the record of each task in review
// (found from the tasks stream's review subjects), not every task record;
// the rest reads the stream's and consumers' counts and the small
// buckets.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	now := time.Now()
	st := Stats{Time: now.UTC(), Queues: []QueueStats{}, Resources: []ResourceStats{}, Leases: []Lease{}, Routes: []Route{}, Jobs: []JobInfo{}, Workers: []WorkerInfo{}}
	problem := func(part string, err error) {
		st.Problems = append(st.Problems, fmt.Sprintf("%s: %v", part, err))
	}
	var err error
	if st.Workers, err = c.Workers(ctx); err != nil {
		problem("workers", err)
		st.Workers = []WorkerInfo{}
	}
	if st.Queues, err = c.queueStats(ctx, st.Workers, problem); err != nil {
		problem("queues", err)
	}
	if st.Resources, err = c.resourceStats(ctx, now, problem); err != nil {
		problem("resources", err)
	}
	if st.Leases, err = c.Leases(ctx); err != nil {
		problem("leases", err)
		st.Leases = []Lease{}
	}
	if st.Routes, err = c.Routes(ctx); err != nil {
		problem("routes", err)
		st.Routes = []Route{}
	}
	jobList, bad, err := c.Jobs(ctx)
	if err != nil {
		problem("jobs", err)
	} else {
		st.Jobs = jobList
		for name, jerr := range bad {
			problem("job "+name, jerr)
		}
	}
	if sched, err := c.schedulerStore(ctx); err != nil {
		problem("scheduler", err)
	} else if l, _, err := sched.Leader(ctx); err == nil {
		st.Scheduler = SchedulerStats{Leading: true, Leader: &l}
	} else if !errors.Is(err, jobs.ErrNoLeader) {
		problem("scheduler", err)
	}
	st.Audit = c.auditIngest(ctx, problem)
	if err := ctx.Err(); err != nil {
		return st, fmt.Errorf("stats: %w", err)
	}
	return st, nil
}

// queueStats counts each queue's tasks: waiting and handed out from the
// stream and its consumers, running from the workers' presence, the last
// hour from their windows, NEEDS_REVIEW from the task records.
func (c *Client) queueStats(ctx context.Context, workers []WorkerInfo, problem func(string, error)) ([]QueueStats, error) {
	byQueue := map[string]*QueueStats{}
	q := func(name string) *QueueStats {
		if byQueue[name] == nil {
			byQueue[name] = &QueueStats{Queue: name, Consumers: []ConsumerStats{}}
		}
		return byQueue[name]
	}
	stream, err := c.js.Stream(ctx, wire.StreamTasks)
	if err != nil {
		return []QueueStats{}, fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
	}
	// In the stream: every live task, waiting or handed out.
	inStream := map[string]int{}
	for _, filter := range []string{wire.SubjectTasksAll, wire.SubjectReadyAll} {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			return []QueueStats{}, fmt.Errorf("read stream %s: %w", wire.StreamTasks, err)
		}
		for subj, n := range info.State.Subjects {
			if queue, _, err := wire.ParseTaskSubject(subj); err == nil {
				inStream[queue] += int(n)
				q(queue)
			}
		}
	}
	// Handed out: the workers' consumers' unacknowledged messages (a
	// prioritized queue's sorter holds its tasks unacknowledged too, but
	// they wait).
	handed := map[string]int{}
	lister := stream.ListConsumers(ctx)
	for info := range lister.Info() {
		queue := tasks.QueueOfConsumer(info.Config)
		if queue == "" {
			continue
		}
		qs := q(queue)
		qs.Consumers = append(qs.Consumers, ConsumerStats{Name: info.Name, Pending: info.NumPending, AckPending: info.NumAckPending, Paused: info.Paused})
		if !strings.HasPrefix(info.Name, "gantry-sorter-") {
			handed[queue] += info.NumAckPending
		}
	}
	if err := lister.Err(); err != nil {
		problem("consumers", fmt.Errorf("list consumers: %w", err))
	}
	if qstore, err := c.queueStore(ctx); err != nil {
		problem("queue pauses", err)
	} else if states, err := qstore.List(ctx); err != nil {
		problem("queue pauses", err)
	} else {
		for _, s := range states {
			if s.Paused {
				qs := q(s.Queue)
				qs.Paused, qs.PauseReason = true, s.Reason
			}
		}
	}
	windows := map[string][]wire.QueueWindow{}
	for _, w := range workers {
		for _, win := range w.Window {
			q(win.Queue).Running += win.Running
			windows[win.Queue] = append(windows[win.Queue], win)
		}
	}
	if review, err := c.reviewCounts(ctx); err != nil {
		problem("needs review", err)
	} else {
		for queue, types := range review {
			qs := q(queue)
			qs.NeedsReviewByType = types
			for _, n := range types {
				qs.NeedsReview += n
			}
		}
	}
	now := time.Now()
	out := make([]QueueStats, 0, len(byQueue))
	for _, name := range slices.Sorted(maps.Keys(byQueue)) {
		qs := byQueue[name]
		qs.Waiting = max(inStream[name]-handed[name], 0)
		qs.RetryWait = max(handed[name]-qs.Running, 0)
		windowStats(qs, windows[name], now)
		slices.SortFunc(qs.Consumers, func(a, b ConsumerStats) int { return strings.Compare(a.Name, b.Name) })
		out = append(out, *qs)
	}
	return out, nil
}

// windowStats adds up the workers' windows of one queue into qs.
func windowStats(qs *QueueStats, wins []wire.QueueWindow, now time.Time) {
	var wait, run wire.Histogram
	for _, w := range wins {
		qs.WindowSeconds = max(qs.WindowSeconds, now.Sub(w.Since).Seconds())
		qs.Succeeded += w.Succeeded
		qs.Failed += w.NeedsReview
		qs.Cancelled += w.Cancelled
		qs.Retries += w.Retries
		wait = mergeHistogram(wait, w.Wait)
		run = mergeHistogram(run, w.Run)
	}
	qs.Done = qs.Succeeded + qs.Failed + qs.Cancelled
	if qs.WindowSeconds > 0 {
		qs.ThroughputPerMin = float64(qs.Done) / (qs.WindowSeconds / 60)
	}
	qs.WaitP50, qs.WaitP99 = quantile(wait, .5), quantile(wait, .99)
	qs.RunP50, qs.RunP99 = quantile(run, .5), quantile(run, .99)
}

// mergeHistogram adds b to a; histograms of other bounds than a's are
// left out.
func mergeHistogram(a, b wire.Histogram) wire.Histogram {
	if a.Bounds == nil {
		return wire.Histogram{Bounds: b.Bounds, Counts: slices.Clone(b.Counts), Count: b.Count, Sum: b.Sum}
	}
	if !slices.Equal(a.Bounds, b.Bounds) || len(a.Counts) != len(b.Counts) {
		return a
	}
	for i := range a.Counts {
		a.Counts[i] += b.Counts[i]
	}
	a.Count += b.Count
	a.Sum += b.Sum
	return a
}

// quantile estimates the q-quantile of h, interpolating within its bucket
// as Prometheus's histogram_quantile does; nil without observations.
func quantile(h wire.Histogram, q float64) *float64 {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return nil
	}
	rank := q * float64(h.Count)
	lower, below := 0.0, uint64(0)
	for i, bound := range h.Bounds {
		if float64(h.Counts[i]) >= rank {
			in := h.Counts[i] - below
			v := bound
			if in > 0 {
				v = lower + (bound-lower)*(rank-float64(below))/float64(in)
			}
			v = math.Round(v*1000) / 1000
			return &v
		}
		lower, below = bound, h.Counts[i]
	}
	v := h.Bounds[len(h.Bounds)-1]
	return &v
}

// reviewCounts counts the NEEDS_REVIEW tasks by queue and type: the tasks
// with a message on their review subject (tasks.ReviewIDs), each checked
// against its record. It reads as many records as there are tasks in
// review, not the whole bucket, which holds every task of the retention.
func (c *Client) reviewCounts(ctx context.Context) (map[string]map[string]int, error) {
	ids, err := tasks.ReviewIDs(ctx, c.js)
	if err != nil {
		return nil, err
	}
	store, err := c.taskStore(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]int{}
	for _, id := range ids {
		r, _, err := store.Get(ctx, id)
		if errors.Is(err, tasks.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if r.State != wire.TaskNeedsReview {
			continue
		}
		if out[r.Queue] == nil {
			out[r.Queue] = map[string]int{}
		}
		out[r.Queue][r.Type]++
	}
	return out, nil
}

// resourceStats lists the resources with their utilisation over the last
// StatsWindow.
func (c *Client) resourceStats(ctx context.Context, now time.Time, problem func(string, error)) ([]ResourceStats, error) {
	list, err := c.Resources(ctx)
	if err != nil {
		return []ResourceStats{}, err
	}
	out := make([]ResourceStats, 0, len(list))
	auditOK := true
	for _, r := range list {
		rs := ResourceStats{Resource: r}
		if auditOK {
			u, err := c.utilisation(ctx, r, now)
			if err != nil {
				problem("resource utilisation", err)
				auditOK = false
			} else {
				rs.Utilisation = &u
			}
		}
		out = append(out, rs)
	}
	return out, nil
}

// maxUtilisationEvents bounds the events read for one resource's
// utilisation.
const maxUtilisationEvents = 20000

// utilisation is the share of [now-StatsWindow, now] resource r was leased,
// from its lease events in the audit store (a release into a cooldown
// ends the lease).
func (c *Client) utilisation(ctx context.Context, r Resource, now time.Time) (float64, error) {
	from := now.Add(-StatsWindow)
	q := AuditQuery{ResourceID: r.ID, Since: &from, Limit: 10000}
	var (
		busy      time.Duration
		start     time.Time
		held      bool
		seenFirst bool
		read      int
	)
	for {
		page, err := c.QueryAudit(ctx, q)
		if err != nil {
			return 0, err
		}
		for _, ev := range page.Events {
			switch ev.Type {
			case wire.EventResourceLeased:
				if !seenFirst || !held {
					held, start = true, ev.Time
				}
			case wire.EventResourceReleased, wire.EventLeaseExpired, wire.EventLeaseRevoked:
				if cooldownEnd(ev) {
					continue
				}
				if !seenFirst && !held {
					// Held since before the window.
					held, start = true, from
				}
				if held {
					busy += ev.Time.Sub(start)
					held = false
				}
			default:
				continue
			}
			seenFirst = true
		}
		read += len(page.Events)
		if page.Cursor == "" || read >= maxUtilisationEvents {
			break
		}
		q.Cursor = page.Cursor
	}
	if !seenFirst && (r.State == wire.ResourceLeased || r.State == wire.ResourceRunning) {
		held, start = true, from
	}
	if held {
		busy += now.Sub(start)
	}
	return math.Round(min(max(busy.Seconds()/StatsWindow.Seconds(), 0), 1)*10000) / 10000, nil
}

// cooldownEnd reports whether ev ends a cooldown's lease rather than a
// holder's.
func cooldownEnd(ev Event) bool {
	var p struct {
		Owner string `json:"owner"`
	}
	return ev.Type != wire.EventResourceReleased && json.Unmarshal(ev.Payload, &p) == nil &&
		strings.HasPrefix(p.Owner, lease.CooldownOwner(""))
}

// auditIngest reads how auditd keeps up: its own count, and its lag.
func (c *Client) auditIngest(ctx context.Context, problem func(string, error)) AuditIngestStats {
	lag, err := c.AuditLag(ctx)
	if err != nil {
		problem("audit lag", err)
	}
	if st, err := c.AuditStats(ctx); err == nil {
		lag.Stored = &st.Stored
	} else {
		problem("auditd", err)
	}
	return lag
}

// AuditLag reads how far auditd lags behind the audit stream, from its
// durable consumer on the broker (so it answers while auditd is down):
// the events it has not stored and the age of the oldest. Stored is left
// nil.
func (c *Client) AuditLag(ctx context.Context) (AuditIngestStats, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	var out AuditIngestStats
	cons, err := c.js.Consumer(ctx, wire.StreamAudit, wire.AuditConsumer)
	if err != nil {
		return out, fmt.Errorf("audit consumer: %w", err)
	}
	info := cons.CachedInfo()
	out.Pending = info.NumPending + uint64(info.NumAckPending)
	if out.Pending == 0 {
		return out, nil
	}
	stream, err := c.js.Stream(ctx, wire.StreamAudit)
	if err != nil {
		return out, fmt.Errorf("open stream %s: %w", wire.StreamAudit, err)
	}
	if m, err := stream.GetMsg(ctx, info.AckFloor.Stream+1); err == nil {
		out.LagSeconds = math.Round(max(info.TimeStamp.Sub(m.Time).Seconds(), 0)*1000) / 1000
	}
	return out, nil
}

// SchedulerLeading reports whether a scheduler holds the leader lease.
func (c *Client) SchedulerLeading(ctx context.Context) (bool, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	sched, err := c.schedulerStore(ctx)
	if err != nil {
		return false, err
	}
	_, _, err = sched.Leader(ctx)
	if errors.Is(err, jobs.ErrNoLeader) {
		return false, nil
	}
	return err == nil, err
}
