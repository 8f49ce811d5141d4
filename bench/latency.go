package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Latency is the latency scenario's result: noop tasks published one by
// one at a fixed rate; submit→start is from just before a task's publish
// to the time in its TASK_STARTED event, submit→finished to the time in its
// TASK_FINISHED event (both stamped by the worker, on this machine's clock
// when gantry runs here). Raw is the same rate into a scratch stream, from
// just before each publish to its arrival at a durable pull consumer.
type Latency struct {
	Rate  int `json:"rate"`
	Tasks int `json:"tasks"`
	// Published is the publish phase: its rate is the rate achieved.
	Published      Rate      `json:"published"`
	SubmitToStart  Quantiles `json:"submit_to_start"`
	SubmitToFinish Quantiles `json:"submit_to_finish"`
	// Raw is publish → consumer arrival on the scratch stream.
	Raw Quantiles `json:"raw_publish_to_consume"`
	// RatioP99 is SubmitToStart.P99 / Raw.P99 (how many times slower).
	RatioP99 float64 `json:"ratio_p99_start_to_raw"`
}

// Latency runs the latency scenario: rate tasks a second for d.
func (r *Run) Latency(ctx context.Context, perSec int, d time.Duration) (*Latency, error) {
	n, err := pacedTasks("latency", perSec, d)
	if err != nil {
		return nil, err
	}
	raw, t, err := rawThenTrack(r, "latency", n, true, func() (Quantiles, error) { return r.rawLatency(ctx, perSec, n) })
	if err != nil {
		return nil, err
	}
	defer t.close()
	sent := make([]time.Time, n)
	pub, err := r.paced(ctx, perSec, n, "publish tasks", func(i int) (jetstream.PubAckFuture, error) {
		sent[i] = time.Now()
		return r.publishTask(i)
	})
	if err != nil {
		return nil, err
	}
	if err := t.wait(ctx, "tasks finished"); err != nil {
		return nil, err
	}
	// Events are published asynchronously: a TASK_STARTED may arrive after
	// its TASK_FINISHED. Give the last ones a moment; SubmitToStart.Count
	// says how many were seen.
	r.poll(ctx, 5*time.Second, func() bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.nStarted == n
	})
	t.mu.Lock()
	var starts, ends []time.Duration
	for i := range n {
		if !t.started[i].IsZero() {
			starts = append(starts, t.started[i].Sub(sent[i]))
		}
		ends = append(ends, t.finished[i].Sub(sent[i]))
	}
	t.mu.Unlock()
	res := &Latency{Rate: perSec, Tasks: n, Published: rate(n, pub),
		SubmitToStart: quantiles(starts), SubmitToFinish: quantiles(ends), Raw: raw}
	res.RatioP99 = ratio(res.SubmitToStart.P99, raw.P99)
	return res, nil
}

// pacedTasks is how many tasks perSec a second for d makes, for the
// scenario named; it wants a rate of one a second or more and one task.
func pacedTasks(scenario string, perSec int, d time.Duration) (int, error) {
	n := int(float64(perSec) * d.Seconds())
	if perSec < 1 || n < 1 {
		return 0, fmt.Errorf("%s: want a rate ≥ 1/s and at least one task, got %d/s for %v", scenario, perSec, d)
	}
	return n, nil
}

// paced calls publish(i) for i in 0..n-1 at perSec a second, then waits
// for every acknowledgement; it returns the time the whole took.
func (r *Run) paced(ctx context.Context, perSec, n int, phase string, publish func(int) (jetstream.PubAckFuture, error)) (time.Duration, error) {
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := 0; i < n; {
		due := min(int(time.Since(start).Seconds()*float64(perSec))+1, n)
		for ; i < due; i++ {
			f, err := publish(i)
			if err != nil {
				return 0, fmt.Errorf("publish %d: %w", i, err)
			}
			futures = append(futures, f)
		}
		r.cfg.Progress(Progress{Phase: phase, Done: i, Total: n})
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
	if err := r.awaitAcks(ctx, futures); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// rawLatency publishes n messages at perSec into a scratch stream and
// measures each one's publish → arrival at a durable pull consumer.
func (r *Run) rawLatency(ctx context.Context, perSec, n int) (Quantiles, error) {
	s, err := r.scratchStream(ctx, jetstream.WorkQueuePolicy)
	if err != nil {
		return Quantiles{}, err
	}
	defer r.remove(s)
	sent := make([]time.Time, n)
	var (
		mu   sync.Mutex
		lats = make([]time.Duration, 0, n)
		all  = make(chan struct{})
	)
	cc, err := r.rawConsumer(ctx, s, func(m jetstream.Msg) {
		at := time.Now()
		i := int(binary.BigEndian.Uint64(m.Data()))
		mu.Lock()
		defer mu.Unlock()
		lats = append(lats, at.Sub(sent[i]))
		if len(lats) == n {
			close(all)
		}
	})
	if err != nil {
		return Quantiles{}, err
	}
	defer cc.Stop()
	if _, err := r.paced(ctx, perSec, n, "raw publish", func(i int) (jetstream.PubAckFuture, error) {
		body := binary.BigEndian.AppendUint64(nil, uint64(i))
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
		return r.publishAsync(s.subject, body)
	}); err != nil {
		return Quantiles{}, err
	}
	done := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(lats)
	}
	if err := r.waitFor(ctx, all, "raw consume", done, n); err != nil {
		return Quantiles{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	return quantiles(lats), nil
}
