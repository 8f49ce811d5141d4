package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Throughput is the throughput scenario's result: n noop tasks published
// at once, timed from the first publish until every TASK_FINISHED is seen,
// against publishing n messages of the same size into a scratch stream and
// consuming them with a durable pull consumer that acknowledges each.
type Throughput struct {
	Tasks int `json:"tasks"`
	// Published is the publish phase alone (JetStream-acknowledged).
	Published Rate `json:"published"`
	// Finished is end to end: distinct tasks whose TASK_FINISHED was seen.
	Finished Rate `json:"finished"`
	// DuplicateFinished counts TASK_FINISHED events seen again for a task.
	DuplicateFinished int `json:"duplicate_finished"`
	// Raw is publish + consume + ack of as many messages, same server.
	Raw Rate `json:"raw_consume_ack"`
	// Ratio is Finished.PerSec / Raw.PerSec.
	Ratio float64 `json:"ratio"`
}

// Throughput runs the throughput scenario with n tasks.
func (r *Run) Throughput(ctx context.Context, n int) (*Throughput, error) {
	raw, t, err := rawThenTrack(r, "throughput", n, false, func() (Rate, error) { return r.rawThroughput(ctx, n) })
	if err != nil {
		return nil, err
	}
	defer t.close()
	start := time.Now()
	pub, err := r.publishAll(ctx, n, "publish tasks")
	if err != nil {
		return nil, err
	}
	if err := t.wait(ctx, "tasks finished"); err != nil {
		return nil, err
	}
	e2e := time.Since(start)
	res := &Throughput{Tasks: n, Published: rate(n, pub), Finished: rate(t.done(), e2e), Raw: raw}
	t.mu.Lock()
	res.DuplicateFinished = t.dupes
	t.mu.Unlock()
	res.Ratio = ratio(res.Finished.PerSec, raw.PerSec)
	return res, nil
}

// rawThenTrack checks a scenario's task count, measures the raw figure it
// compares with, then starts tracking its n tasks: in that order, so that
// the tracker's subscriptions take no part in the raw run.
func rawThenTrack[T any](r *Run, scenario string, n int, starts bool, raw func() (T, error)) (T, *tracker, error) {
	var zero T
	if n < 1 {
		return zero, nil, fmt.Errorf("%s: want at least 1 task, got %d", scenario, n)
	}
	v, err := raw()
	if err != nil {
		return zero, nil, err
	}
	t, err := r.track(n, starts)
	return v, t, err
}

// publishAll publishes tasks 0..n-1 at once and returns how long until
// every publish was acknowledged.
func (r *Run) publishAll(ctx context.Context, n int, phase string) (time.Duration, error) {
	start := time.Now()
	err := r.burst(ctx, n, phase, func(i int) (jetstream.PubAckFuture, error) {
		f, err := r.publishTask(i)
		if err != nil {
			return nil, fmt.Errorf("publish task %d: %w", i, err)
		}
		return f, nil
	})
	if err != nil {
		return 0, err
	}
	r.cfg.Progress(Progress{Phase: phase, Done: n, Total: n})
	return time.Since(start), nil
}

// burst calls publish(i) for i in 0..n-1 at once, reporting progress
// under phase, then waits for every acknowledgement.
func (r *Run) burst(ctx context.Context, n int, phase string, publish func(int) (jetstream.PubAckFuture, error)) error {
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		f, err := publish(i)
		if err != nil {
			return err
		}
		futures = append(futures, f)
		if i%1000 == 0 {
			r.cfg.Progress(Progress{Phase: phase, Done: i, Total: n})
		}
	}
	return r.awaitAcks(ctx, futures)
}

// publishRaw publishes n task-sized messages into s at once and waits
// for their acknowledgements.
func (r *Run) publishRaw(ctx context.Context, s *scratch, n int, phase string) error {
	body := []byte(fmt.Sprintf(`{"id":%q}`, r.taskID(n)))
	return r.burst(ctx, n, phase, func(int) (jetstream.PubAckFuture, error) {
		f, err := r.publishAsync(s.subject, body)
		if err != nil {
			return nil, fmt.Errorf("publish raw: %w", err)
		}
		return f, nil
	})
}

// countRaw consumes s with a durable pull consumer, acknowledging each
// message; all closes when the n-th arrived and got says how many have.
func (r *Run) countRaw(ctx context.Context, s *scratch, n int) (cc jetstream.ConsumeContext, all <-chan struct{}, got func() int, err error) {
	var count atomic.Int64
	done := make(chan struct{})
	cc, err = r.rawConsumer(ctx, s, func(jetstream.Msg) {
		if count.Add(1) == int64(n) {
			close(done)
		}
	})
	return cc, done, func() int { return int(count.Load()) }, err
}

// rawThroughput publishes n task-sized messages into a scratch stream and
// consumes them with a durable pull consumer, acknowledging each.
func (r *Run) rawThroughput(ctx context.Context, n int) (Rate, error) {
	s, err := r.scratchStream(ctx, jetstream.WorkQueuePolicy)
	if err != nil {
		return Rate{}, err
	}
	defer r.remove(s)
	cc, all, got, err := r.countRaw(ctx, s, n)
	if err != nil {
		return Rate{}, err
	}
	defer cc.Stop()
	start := time.Now()
	if err := r.publishRaw(ctx, s, n, "raw publish"); err != nil {
		return Rate{}, err
	}
	if err := r.waitFor(ctx, all, "raw consume+ack", got, n); err != nil {
		return Rate{}, err
	}
	return rate(n, time.Since(start)), nil
}

// waitFor waits for all to close, reporting done() of total as progress.
func (r *Run) waitFor(ctx context.Context, all <-chan struct{}, phase string, done func() int, total int) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-all:
			r.cfg.Progress(Progress{Phase: phase, Done: total, Total: total})
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%s: %d of %d: %w", phase, done(), total, ctx.Err())
		case <-tick.C:
			r.cfg.Progress(Progress{Phase: phase, Done: done(), Total: total})
		}
	}
}
