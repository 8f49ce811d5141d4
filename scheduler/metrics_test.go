package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/metricstest"
	"github.com/gantry-dev/gantry/jobs"
)

// metricValue returns the value of reg's series of name whose labels
// include labels (a histogram's sample count), or -1 when there is none.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			if v, ok := metricstest.Value(f, labels...); ok {
				return v
			}
		}
	}
	return -1
}

// TestMetricsCountFiresSkipsAndMisses: the planned times a scheduler
// missed while down and dropped by the misfire policy count in
// gantry_scheduler_misses_total, a fire in fires_total and the fire lag
// histogram, and the fires an unfinished run forbids in skips_total by
// reason.
func TestMetricsCountFiresSkipsAndMisses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The job existed an hour ago and last fired 10 minutes ago; no
	// scheduler has run since. Its runs must not overlap.
	j, err := jobs.Normalize(wire.Job{Name: "m", Type: "noop", Every: "1m", Misfire: wire.MisfireSkip, Overlap: wire.OverlapForbid})
	if err != nil {
		t.Fatal(err)
	}
	j.CreatedAt, j.UpdatedAt = t0.Add(-time.Hour), t0.Add(-time.Hour)
	if _, err := b.jobs.Create(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	b.putState(wire.JobState{Job: "m", LastPlanned: t0.Add(-10 * time.Minute)})
	reg := prometheus.NewRegistry()
	b.start(Config{Metrics: reg}, true)

	// 09:51 .. 09:59 were missed and are skipped by the policy; 10:00 is
	// on time and fires.
	b.waitTasks(1)
	b.waitEvents(wire.EventJobMissed, 9)
	check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
		if got := metricValue(t, reg, "gantry_scheduler_fires_total", "job", "m", "trigger", string(wire.TriggerSchedule)); got != 1 {
			return fmt.Errorf("gantry_scheduler_fires_total{job=m,trigger=schedule} = %v, want 1", got)
		}
		return nil
	})
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gantry_scheduler_misses_total", []string{"job", "m"}, 9},
		{"gantry_scheduler_fire_lag_seconds", nil, 1},
		{"gantry_scheduler_leading", nil, 1},
		{"gantry_scheduler_skips_total", nil, -1},
	} {
		if got := metricValue(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	// The 10:00 run has not finished: 10:01 and 10:02 are skipped.
	for i := 1; i <= 2; i++ {
		b.advance(time.Minute)
		b.waitEvents(wire.EventJobSkipped, i)
		check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
			if got := metricValue(t, reg, "gantry_scheduler_skips_total", "job", "m", "reason", string(wire.SkipOverlap)); got != float64(i) {
				return fmt.Errorf("gantry_scheduler_skips_total{job=m,reason=overlap} = %v, want %d", got, i)
			}
			return nil
		})
	}
	if got := metricValue(t, reg, "gantry_scheduler_fires_total", "job", "m"); got != 1 {
		t.Errorf("gantry_scheduler_fires_total{job=m} = %v, want still 1", got)
	}
	if got := metricValue(t, reg, "gantry_scheduler_misses_total", "job", "m"); got != 9 {
		t.Errorf("gantry_scheduler_misses_total{job=m} = %v, want still 9", got)
	}
}
