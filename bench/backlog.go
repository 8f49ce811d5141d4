package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Backlog is the backlog scenario's result: n noop tasks queued while the
// queue is paused (`gantry queue pause`), the gantry process looked at,
// then the queue resumed and timed until every task finished; against
// draining as many messages queued in a scratch stream with a durable pull
// consumer. The RSS figures need the process's /metrics.
type Backlog struct {
	Tasks  int  `json:"tasks"`
	Queued Rate `json:"queued"`
	// Idle is the system with the tasks queued, before the resume.
	Idle Sample `json:"idle"`
	// PeakRSSBytes is the highest RSS sampled (every second) while draining.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	Drain        Rate  `json:"drain"`
	// Missed counts samples that could not be taken (a /metrics request
	// that timed out on a loaded machine); the RSS figures are then from
	// the samples that were.
	Missed int `json:"missed_samples"`
	// RawDrain is consume + ack of n messages already in a scratch stream.
	RawDrain Rate `json:"raw_drain"`
	// Ratio is Drain.PerSec / RawDrain.PerSec.
	Ratio float64 `json:"ratio"`
}

// Backlog runs the backlog scenario with n tasks.
func (r *Run) Backlog(ctx context.Context, n int) (res *Backlog, err error) {
	raw, t, err := rawThenTrack(r, "backlog", n, false, func() (Rate, error) { return r.rawDrain(ctx, n) })
	if err != nil {
		return nil, err
	}
	defer t.close()
	if _, err := r.cfg.Client.PauseQueue(ctx, r.cfg.Queue, "gantry bench backlog"); err != nil {
		return nil, fmt.Errorf("pause queue %s: %w", r.cfg.Queue, err)
	}
	resumed := false
	defer func() {
		if !resumed {
			if _, rerr := r.cfg.Client.ResumeQueue(context.WithoutCancel(ctx), r.cfg.Queue); rerr != nil && err == nil {
				err = fmt.Errorf("resume queue %s: %w", r.cfg.Queue, rerr)
			}
		}
	}()
	begin := time.Now()
	pub, err := r.publishAll(ctx, n, "queue tasks")
	if err != nil {
		return nil, err
	}
	res = &Backlog{Tasks: n, Queued: rate(n, pub), RawDrain: raw}
	if res.Idle, err = r.sample(ctx, begin); err != nil {
		res.Missed++
	}
	res.PeakRSSBytes = res.Idle.RSSBytes
	var mu sync.Mutex
	stop := r.every(ctx, time.Second, func() {
		s, err := r.sample(ctx, begin)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			res.Missed++
			return
		}
		res.PeakRSSBytes = max(res.PeakRSSBytes, s.RSSBytes)
	})
	start := time.Now()
	if _, err := r.cfg.Client.ResumeQueue(ctx, r.cfg.Queue); err != nil {
		stop()
		return nil, fmt.Errorf("resume queue %s: %w", r.cfg.Queue, err)
	}
	resumed = true
	err = t.wait(ctx, "drain")
	stop()
	if err != nil {
		return nil, err
	}
	res.Drain = rate(t.done(), time.Since(start))
	res.Ratio = ratio(res.Drain.PerSec, raw.PerSec)
	return res, nil
}

// rawDrain queues n task-sized messages in a scratch stream, then times a
// durable pull consumer consuming and acknowledging them all.
func (r *Run) rawDrain(ctx context.Context, n int) (Rate, error) {
	s, err := r.scratchStream(ctx, jetstream.WorkQueuePolicy)
	if err != nil {
		return Rate{}, err
	}
	defer r.remove(s)
	if err := r.publishRaw(ctx, s, n, "raw queue"); err != nil {
		return Rate{}, err
	}
	start := time.Now()
	cc, all, got, err := r.countRaw(ctx, s, n)
	if err != nil {
		return Rate{}, err
	}
	defer cc.Stop()
	if err := r.waitFor(ctx, all, "raw drain", got, n); err != nil {
		return Rate{}, err
	}
	return rate(n, time.Since(start)), nil
}
