package scheduler

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the scheduler's Prometheus metrics. Fires are rare (a job's
// cadence), so series are resolved per fire.
type metrics struct {
	fires, skips, misses *prometheus.CounterVec
	lag                  prometheus.Histogram
	leader               prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, s *Scheduler) (*metrics, error) {
	m := &metrics{
		fires: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gantry", Subsystem: "scheduler", Name: "fires_total",
			Help: "Tasks fired by this scheduler while it led, by job and trigger (schedule, misfire, manual)."}, []string{"job", "trigger"}),
		skips: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gantry", Subsystem: "scheduler", Name: "skips_total",
			Help: "Planned fires skipped, by job and reason (window, budget, overlap, cooldown, concurrency...)."}, []string{"job", "reason"}),
		misses: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gantry", Subsystem: "scheduler", Name: "misses_total",
			Help: "Planned fires missed: passed while no scheduler led and dropped by the misfire policy, or not published."}, []string{"job"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "gantry", Subsystem: "scheduler", Name: "fire_lag_seconds",
			Help:    "Time from a fire's planned time to its publish.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 1800, 3600}}),
		leader: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "gantry", Subsystem: "scheduler", Name: "leading",
			Help: "1 while this scheduler holds the leader lease."}, func() float64 {
			if s.leading.Load() {
				return 1
			}
			return 0
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.fires, m.skips, m.misses, m.lag, m.leader} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("scheduler: register metrics: %w", err)
		}
	}
	return m, nil
}
