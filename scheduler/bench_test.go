package scheduler

import (
	"container/heap"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/jobs"
)

// Benchmark scenario: benchJobs jobs every benchEvery, each with a jitter of
// benchEvery, so fires spread evenly at benchJobs/benchEvery per second.
const (
	benchJobs   = 10_000
	benchEvery  = 10 * time.Second
	benchWindow = 20 * time.Second
)

// BenchmarkFireLag runs 10,000 jobs firing ~1,000 times a second for 20 s
// and reports the lag from each fire's due moment (planned + jitter) to the
// task's delivery to a consumer, and the scheduler's memory. The baseline,
// measured in the same run on its own broker, is a bare loop publishing the
// same schedule straight to JetStream.
func BenchmarkFireLag(b *testing.B) {
	for b.Loop() {
		raw := runRawBaseline(b)
		sched, heapMB := runSchedulerScenario(b)
		b.ReportMetric(sched.p50, "p50-lag-ms")
		b.ReportMetric(sched.p99, "p99-lag-ms")
		b.ReportMetric(sched.rate, "fires/s")
		b.ReportMetric(raw.p50, "raw-p50-lag-ms")
		b.ReportMetric(raw.p99, "raw-p99-lag-ms")
		b.ReportMetric(raw.rate, "raw-fires/s")
		b.ReportMetric(heapMB, "sched-heap-MB")
		b.Logf("scheduler: %d fires, %.0f/s, lag p50 %.2f ms p99 %.2f ms max %.2f ms; raw JetStream: %d fires, %.0f/s, lag p50 %.2f ms p99 %.2f ms max %.2f ms; scheduler heap %.1f MB for %d jobs",
			sched.n, sched.rate, sched.p50, sched.p99, sched.max, raw.n, raw.rate, raw.p50, raw.p99, raw.max, heapMB, benchJobs)
	}
}

type lagStats struct {
	n             int
	rate          float64
	p50, p99, max float64
}

// lagCollector receives tasks and records each one's lag behind its due
// moment.
type lagCollector struct {
	mu   sync.Mutex
	lags []time.Duration
	past bool // a task due at or after to has arrived
	from time.Time
	to   time.Time
	due  func(m jetstream.Msg) time.Time
}

func (c *lagCollector) consume(b *testing.B, js jetstream.JetStream) jetstream.ConsumeContext {
	b.Helper()
	cons, err := js.CreateConsumer(context.Background(), wire.StreamTasks, jetstream.ConsumerConfig{
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 100_000,
	})
	if err != nil {
		b.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		due := c.due(m)
		c.mu.Lock()
		if !due.Before(c.from) && due.Before(c.to) {
			c.lags = append(c.lags, now.Sub(due))
		}
		c.past = c.past || !due.Before(c.to)
		c.mu.Unlock()
		_ = m.Ack()
	})
	if err != nil {
		b.Fatal(err)
	}
	return cc
}

// waitPast waits until a task due at or after the window's end has arrived.
// Fires are published in due order on one connection and the consumer
// receives them in stream order, so by then every task due within the
// window has arrived, but for one whose publish had to be retried.
func (c *lagCollector) waitPast(b *testing.B) {
	b.Helper()
	check.For(b, time.Until(c.to)+30*time.Second, 10*time.Millisecond, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.past {
			return fmt.Errorf("no task due at or after %s received (%d within the window), want one", c.to.Format(time.TimeOnly), len(c.lags))
		}
		return nil
	})
}

func (c *lagCollector) stats() lagStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := lagStats{n: len(c.lags)}
	if s.n == 0 {
		return s
	}
	slices.Sort(c.lags)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	s.p50 = ms(c.lags[s.n/2])
	s.p99 = ms(c.lags[s.n*99/100])
	s.max = ms(c.lags[s.n-1])
	s.rate = float64(s.n) / c.to.Sub(c.from).Seconds()
	return s
}

func benchJob(i int) wire.Job {
	return wire.Job{Name: fmt.Sprintf("job-%05d", i), Type: "noop", Queue: "bench", Every: benchEvery.String(),
		Jitter: benchEvery.String(), Misfire: wire.MisfireSkip, Overlap: wire.OverlapAllow, MisfireCap: 1}
}

// runSchedulerScenario loads the jobs, runs one scheduler and measures.
func runSchedulerScenario(b *testing.B) (lagStats, float64) {
	b.Helper()
	env := brokertest.Start(b)
	ctx := context.Background()
	now := time.Now()
	specs := map[string]*jobs.Spec{}
	for i := range benchJobs {
		j := benchJob(i)
		j.CreatedAt, j.UpdatedAt = now, now
		sp, err := jobs.Compile(j)
		if err != nil {
			b.Fatal(err)
		}
		specs[j.Name] = sp
		data, _ := json.Marshal(j)
		if _, err := env.JS.PublishAsync("$KV."+wire.BucketJobs+"."+j.Name, data); err != nil {
			b.Fatal(err)
		}
	}
	waitAsync(b, env.JS)

	c := &lagCollector{due: func(m jetstream.Msg) time.Time {
		planned, _ := time.Parse(time.RFC3339Nano, m.Headers().Get(wire.HeaderPlanned))
		sp := specs[m.Headers().Get(wire.HeaderJob)]
		if sp == nil {
			return time.Time{}
		}
		return planned.Add(sp.Jitter(planned))
	}}
	// Measure fires due after a warm-up of one period.
	c.from = time.Now().Add(benchEvery)
	c.to = c.from.Add(benchWindow)
	cc := c.consume(b, env.JS)
	defer cc.Stop()

	_, js := brokertest.Connect(b, env.URL)
	s, err := New(Config{Logger: env.Log}, js)
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = s.Run(runCtx); close(done) }()
	defer func() { s.Stop(); cancel(); <-done }()
	<-s.Ready()

	c.waitPast(b)
	runtime.GC()
	var withSched runtime.MemStats
	runtime.ReadMemStats(&withSched)
	s.Stop()
	<-done
	runtime.GC()
	var without runtime.MemStats
	runtime.ReadMemStats(&without)
	heapMB := float64(int64(withSched.HeapInuse)-int64(without.HeapInuse)) / (1 << 20)
	return c.stats(), heapMB
}

// runRawBaseline publishes the same schedule with a bare timer-and-heap loop
// straight to JetStream: no KV, no policies, no audit, no run history.
func runRawBaseline(b *testing.B) lagStats {
	b.Helper()
	env := brokertest.Start(b)
	now := time.Now()
	h := &rawHeap{}
	for i := range benchJobs {
		sp, err := jobs.Compile(benchJob(i))
		if err != nil {
			b.Fatal(err)
		}
		p := sp.Next(now)
		heap.Push(h, rawFire{sp: sp, planned: p, due: p.Add(sp.Jitter(p))})
	}
	dues := map[string]time.Time{}
	var mu sync.Mutex
	c := &lagCollector{due: func(m jetstream.Msg) time.Time {
		mu.Lock()
		defer mu.Unlock()
		return dues[m.Headers().Get(jetstream.MsgIDHeader)]
	}}
	c.from = time.Now().Add(benchEvery)
	c.to = c.from.Add(benchWindow)
	cc := c.consume(b, env.JS)
	defer cc.Stop()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		next := (*h)[0]
		if next.due.After(c.to.Add(time.Second)) {
			break
		}
		timer.Reset(time.Until(next.due))
		<-timer.C
		for h.Len() > 0 && !(*h)[0].due.After(time.Now()) {
			f := heap.Pop(h).(rawFire)
			id := wire.JobTaskID(f.sp.Job.Name, f.planned)
			mu.Lock()
			dues[id] = f.due
			mu.Unlock()
			msg := nats.NewMsg(wire.TaskSubject(f.sp.Job.Queue, f.sp.Job.Type))
			msg.Data, _ = json.Marshal(wire.Task{ID: id})
			msg.Header.Set(jetstream.MsgIDHeader, id)
			if _, err := env.JS.PublishMsgAsync(msg); err != nil {
				b.Fatal(err)
			}
			p := f.sp.Next(f.planned)
			heap.Push(h, rawFire{sp: f.sp, planned: p, due: p.Add(f.sp.Jitter(p))})
		}
		waitAsync(b, env.JS)
	}
	c.waitPast(b)
	return c.stats()
}

type rawFire struct {
	sp      *jobs.Spec
	planned time.Time
	due     time.Time
}

type rawHeap []rawFire

func (h rawHeap) Len() int           { return len(h) }
func (h rawHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h rawHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *rawHeap) Push(x any)        { *h = append(*h, x.(rawFire)) }
func (h *rawHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func waitAsync(b *testing.B, js jetstream.JetStream) {
	b.Helper()
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		b.Fatal("async publishes not acknowledged within 30s")
	}
}

// kvEntry is a jobs bucket entry for feeding applyJob without a broker.
type kvEntry struct {
	key   string
	value []byte
	rev   uint64
}

func (e kvEntry) Bucket() string                  { return wire.BucketJobs }
func (e kvEntry) Key() string                     { return e.key }
func (e kvEntry) Value() []byte                   { return e.value }
func (e kvEntry) Revision() uint64                { return e.rev }
func (e kvEntry) Created() time.Time              { return time.Time{} }
func (e kvEntry) Delta() uint64                   { return 0 }
func (e kvEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }

// BenchmarkJobTableMemory measures the leader's in-memory job table for
// 10,000 jobs: definitions, compiled schedules, state and the due heap.
func BenchmarkJobTableMemory(b *testing.B) {
	now := time.Now()
	entries := make([]kvEntry, benchJobs)
	for i := range entries {
		j := benchJob(i)
		j.Payload = json.RawMessage(`{"cmd":["poll-plc","--line","3"]}`)
		j.CreatedAt, j.UpdatedAt = now, now
		data, _ := json.Marshal(j)
		entries[i] = kvEntry{key: j.Name, value: data, rev: uint64(i + 1)}
	}
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := &Scheduler{cfg: Config{MisfireThreshold: time.Minute}, clock: clock.Real{}, log: slog.New(slog.DiscardHandler)}
		r := &runner{s: s, entries: map[string]*entry{}, leader: true}
		for _, e := range entries {
			r.applyJob(e)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if r.heap.Len() != benchJobs {
			b.Fatalf("heap = %d entries, want %d", r.heap.Len(), benchJobs)
		}
		runtime.KeepAlive(r)
		used := float64(after.HeapAlloc - before.HeapAlloc)
		b.ReportMetric(used/(1<<20), "table-MB")
		b.ReportMetric(used/benchJobs, "bytes/job")
	}
}
