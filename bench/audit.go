package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
)

// Audit is the audit scenario's result: noop tasks at a fixed rate, and
// whether auditd keeps up. Produced is what entered GANTRY_AUDIT (from any
// component) from the first publish until every task's TASK_FINISHED was
// seen (events published asynchronously after that fall outside the
// window); Stored is what auditd stored in the same window (its own count). Backlog is
// auditd's pending events (its consumer's pending + unacknowledged),
// sampled every second; Drain is from the end of the load until it is 0.
type Audit struct {
	Rate     int     `json:"rate"`
	Tasks    int     `json:"tasks"`
	Produced Rate    `json:"produced"`
	Stored   Rate    `json:"stored"`
	Backlog  []int64 `json:"backlog_samples"`
	// BacklogAtEnd is the backlog when the last task finished.
	BacklogAtEnd int64 `json:"backlog_at_end"`
	// BacklogAfter is the backlog once drained (0) or when the wait ran out.
	BacklogAfter int64   `json:"backlog_after"`
	DrainSeconds float64 `json:"drain_seconds"`
	// Ratio is Stored.PerSec / Produced.PerSec.
	Ratio float64 `json:"ratio"`
}

// Audit runs the audit scenario: perSec tasks a second for d.
func (r *Run) Audit(ctx context.Context, perSec int, d time.Duration) (*Audit, error) {
	n, err := pacedTasks("audit", perSec, d)
	if err != nil {
		return nil, err
	}
	seq0, stored0, err := r.auditCounts(ctx)
	if err != nil {
		return nil, err
	}
	t, err := r.track(n, false)
	if err != nil {
		return nil, err
	}
	defer t.close()
	res := &Audit{Rate: perSec, Tasks: n}
	start := time.Now()
	err = r.sampledLoad(ctx, t, perSec, n, "publish tasks", time.Second, func() {
		if lag, err := r.cfg.Client.AuditLag(ctx); err == nil {
			res.Backlog = append(res.Backlog, int64(lag.Pending))
		}
	})
	if err != nil {
		return nil, err
	}
	window := time.Since(start)
	seq1, stored1, err := r.auditCounts(ctx)
	if err != nil {
		return nil, err
	}
	res.Produced, res.Stored = rate(int(seq1-seq0), window), rate(int(stored1-stored0), window)
	res.Ratio = ratio(res.Stored.PerSec, res.Produced.PerSec)
	lag, err := r.cfg.Client.AuditLag(ctx)
	if err != nil {
		return nil, err
	}
	res.BacklogAtEnd = int64(lag.Pending)
	end := time.Now()
	res.BacklogAfter, err = r.drainAudit(ctx)
	res.DrainSeconds = round(time.Since(end).Seconds(), 3)
	return res, err
}

// auditCounts reads the audit stream's last sequence and auditd's stored
// count.
func (r *Run) auditCounts(ctx context.Context) (seq, stored uint64, err error) {
	s, err := r.js.Stream(ctx, wire.StreamAudit)
	if err != nil {
		return 0, 0, fmt.Errorf("stream %s: %w", wire.StreamAudit, err)
	}
	st, err := r.cfg.Client.AuditStats(ctx)
	if err != nil {
		return 0, 0, err
	}
	return s.CachedInfo().State.LastSeq, st.Stored, nil
}

// drainAudit waits until auditd has nothing pending (or Timeout) and
// returns what is left.
func (r *Run) drainAudit(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		lag, err := r.cfg.Client.AuditLag(ctx)
		if err != nil {
			return 0, err
		}
		if lag.Pending == 0 {
			return 0, nil
		}
		r.cfg.Progress(Progress{Phase: "audit backlog", Done: 0, Total: int(lag.Pending)})
		select {
		case <-ctx.Done():
			return int64(lag.Pending), nil
		case <-tick.C:
		}
	}
}

// sampledLoad publishes n tasks at perSec a second (progress under phase)
// and waits until t saw each finish, calling sample every period
// meanwhile; sample no longer runs when it returns.
func (r *Run) sampledLoad(ctx context.Context, t *tracker, perSec, n int, phase string, period time.Duration, sample func()) error {
	defer r.every(ctx, period, sample)()
	if _, err := r.paced(ctx, perSec, n, phase, func(i int) (jetstream.PubAckFuture, error) { return r.publishTask(i) }); err != nil {
		return err
	}
	return t.wait(ctx, "tasks finished")
}

// every calls fn every period until the returned stop is called; stop
// returns once fn no longer runs.
func (r *Run) every(ctx context.Context, period time.Duration, fn func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	tick := time.NewTicker(period)
	go func() {
		defer close(done)
		for {
			select {
			case <-tick.C:
				fn()
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() {
		cancel()
		tick.Stop()
		<-done
	}
}
