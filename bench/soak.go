package bench

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Soak is the soak scenario's result: noop tasks at a steady rate for a
// duration, the system sampled every period; Growth is the last sample
// minus the first. GANTRY_AUDIT grows by design (events are kept for the
// retention period); the others should not.
type Soak struct {
	Rate     int      `json:"rate"`
	Seconds  float64  `json:"seconds"`
	Tasks    int      `json:"tasks"`
	Finished int      `json:"finished"`
	Samples  []Sample `json:"samples"`
	Growth   Sample   `json:"growth"`
	// WarmFrom is the first sample taken a tenth of the run or more after
	// the start, when the load had warmed the process up; WarmGrowth is the
	// last sample minus it.
	WarmFrom   Sample `json:"warm_from"`
	WarmGrowth Sample `json:"warm_growth"`
	// MaxRSSBytes is the highest RSS sampled.
	MaxRSSBytes int64 `json:"max_rss_bytes"`
	// Missed counts samples that could not be taken (a /metrics or stream
	// info request that timed out on a loaded machine), and LastMiss says
	// why the last one failed.
	Missed   int    `json:"missed_samples"`
	LastMiss string `json:"last_miss,omitempty"`
}

// Soak runs the soak scenario: perSec tasks a second for d, sampling every
// period.
func (r *Run) Soak(ctx context.Context, perSec int, d, period time.Duration) (*Soak, error) {
	n := int(float64(perSec) * d.Seconds())
	if perSec < 1 || n < 1 || period <= 0 {
		return nil, fmt.Errorf("soak: want a rate ≥ 1/s, at least one task and a sample period > 0, got %d/s for %v every %v", perSec, d, period)
	}
	t, err := r.track(n, false)
	if err != nil {
		return nil, err
	}
	defer t.close()
	res := &Soak{Rate: perSec, Tasks: n}
	begin := time.Now()
	var mu sync.Mutex
	take := func() {
		s, err := r.sample(ctx, begin)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			res.Missed++
			res.LastMiss = err.Error()
			return
		}
		res.Samples = append(res.Samples, s)
		res.MaxRSSBytes = max(res.MaxRSSBytes, s.RSSBytes)
	}
	take()
	if err := r.sampledLoad(ctx, t, perSec, n, "soak", period, take); err != nil {
		return nil, err
	}
	if _, err := r.drainAudit(ctx); err != nil {
		return nil, err
	}
	take()
	if len(res.Samples) < 2 {
		return nil, fmt.Errorf("soak: %d samples taken, %d missed (last: %s)", len(res.Samples), res.Missed, res.LastMiss)
	}
	res.Seconds = round(time.Since(begin).Seconds(), 1)
	res.Finished = t.done()
	last := res.Samples[len(res.Samples)-1]
	res.Growth = last.minus(res.Samples[0])
	for _, s := range res.Samples {
		if s.At >= d.Seconds()/10 {
			res.WarmFrom, res.WarmGrowth = s, last.minus(s)
			break
		}
	}
	return res, nil
}
