package workers

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gantry-dev/gantry/broker/wire"
)

// durationBuckets are the bounds (seconds) of the wait and run time
// histograms: from a noop's milliseconds to a report's hours.
var durationBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200}

// The kinds of gantry_task_errors_total: what went wrong in an attempt.
const (
	kindTimeout = iota
	kindLeaseLost
	kindNoHandler
	kindHandlerSilent
	kindRejected
	kindPermanent
	kindDelayed
	kindFailed
	kindInterrupted
	numKinds
)

var kindNames = [numKinds]string{"timeout", "lease_lost", "no_handler", "handler_silent", "rejected", "permanent", "delayed", "failed", "interrupted"}

// errorKind sorts a failed attempt's error into a kind of
// gantry_task_errors_total.
func errorKind(err error, c Class) int {
	switch {
	case errors.Is(err, ErrTimeout):
		return kindTimeout
	case errors.Is(err, ErrLost):
		return kindLeaseLost
	case errors.Is(err, ErrNoHandler):
		return kindNoHandler
	case errors.Is(err, ErrHandlerSilent):
		return kindHandlerSilent
	case errors.Is(err, ErrBadTask):
		return kindRejected
	}
	switch c {
	case ClassPermanent:
		return kindPermanent
	case ClassDelay:
		return kindDelayed
	case ClassInterrupted:
		return kindInterrupted
	}
	return kindFailed
}

// metrics are the workers' Prometheus metrics. Every series of a queue and
// type is resolved once, on the first task of the pair: a task costs a map
// read under a read lock and atomic adds, no allocation.
type metrics struct {
	wait, run *prometheus.HistogramVec
	finished  *prometheus.CounterVec
	retries   *prometheus.CounterVec
	errs      *prometheus.CounterVec
	recovery  *prometheus.HistogramVec
	running   *prometheus.GaugeVec

	mu    sync.RWMutex
	pairs map[pairKey]*pairMetrics
	types map[string]*typeRecovery
}

type pairKey struct{ queue, typ string }

// pairMetrics are the series of one queue and type.
type pairMetrics struct {
	queue                             string
	wait, run                         prometheus.Histogram
	succeeded, needsReview, cancelled prometheus.Counter
	retry, delay                      prometheus.Counter
	errs                              [numKinds]prometheus.Counter
	running                           prometheus.Gauge
	recovery                          *typeRecovery
}

// typeRecovery measures, per task type, the time from a failed attempt to
// the next success: the type's time to recover.
type typeRecovery struct {
	obs prometheus.Observer
	// failedAt is the unix nanoseconds of the first failure since the last
	// success, or 0.
	failedAt atomic.Int64
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "gantry", Name: "task_wait_seconds",
			Help:    "Time a task waited before an attempt started: since it was published, or since its retry was due.",
			Buckets: durationBuckets}, []string{"queue", "type"}),
		run: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "gantry", Name: "task_run_seconds",
			Help: "Run time of a task's attempts.", Buckets: durationBuckets}, []string{"queue", "type"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gantry", Name: "tasks_finished_total",
			Help: "Tasks that ended, by final state (SUCCEEDED, NEEDS_REVIEW, CANCELLED)."}, []string{"queue", "type", "state"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gantry", Name: "task_retries_total",
			Help: "Retries scheduled, by class: retry (backoff, uses an attempt) or delay (a hinted wait that does not)."}, []string{"queue", "type", "class"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gantry", Name: "task_errors_total",
			Help: "Failed attempts and refused deliveries, by kind."}, []string{"queue", "type", "kind"}),
		recovery: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "gantry", Name: "task_recovery_seconds",
			Help: "Time from a failed attempt of a type to the next success of that type (time to recover).", Buckets: durationBuckets}, []string{"type"}),
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "gantry", Name: "worker_tasks_running",
			Help: "Tasks running in this worker process."}, []string{"queue"}),
		pairs: map[pairKey]*pairMetrics{},
		types: map[string]*typeRecovery{},
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.wait, m.run, m.finished, m.retries, m.errs, m.recovery, m.running} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

// pair returns the series of queue and typ, resolving them on first use.
func (m *metrics) pair(queue, typ string) *pairMetrics {
	k := pairKey{queue, typ}
	m.mu.RLock()
	p := m.pairs[k]
	m.mu.RUnlock()
	if p != nil {
		return p
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p = m.pairs[k]; p != nil {
		return p
	}
	rec := m.types[typ]
	if rec == nil {
		rec = &typeRecovery{obs: m.recovery.WithLabelValues(typ)}
		m.types[typ] = rec
	}
	p = &pairMetrics{
		queue:       queue,
		wait:        m.wait.WithLabelValues(queue, typ).(prometheus.Histogram),
		run:         m.run.WithLabelValues(queue, typ).(prometheus.Histogram),
		succeeded:   m.finished.WithLabelValues(queue, typ, string(wire.TaskSucceeded)),
		needsReview: m.finished.WithLabelValues(queue, typ, string(wire.TaskNeedsReview)),
		cancelled:   m.finished.WithLabelValues(queue, typ, string(wire.TaskCancelled)),
		retry:       m.retries.WithLabelValues(queue, typ, ClassRetry.String()),
		delay:       m.retries.WithLabelValues(queue, typ, ClassDelay.String()),
		running:     m.running.WithLabelValues(queue),
		recovery:    rec,
	}
	for i := range p.errs {
		p.errs[i] = m.errs.WithLabelValues(queue, typ, kindNames[i])
	}
	m.pairs[k] = p
	return p
}

// failed counts a failed attempt of kind and, unless the type has an
// unrecovered failure already, starts its time to recover at now.
func (p *pairMetrics) failed(kind int, now time.Time) {
	p.errs[kind].Inc()
	if kind == kindInterrupted || kind == kindDelayed || kind == kindNoHandler {
		// The task did not fail: it waits for a worker, a resource or a
		// handler.
		return
	}
	p.recovery.failedAt.CompareAndSwap(0, now.UnixNano())
}

// success counts a success at now: it ends the type's failure, if any,
// observing its time to recover.
func (p *pairMetrics) success(now time.Time) {
	p.succeeded.Inc()
	if at := p.recovery.failedAt.Swap(0); at != 0 {
		p.recovery.obs.Observe(max(now.Sub(time.Unix(0, at)).Seconds(), 0))
	}
}

// window returns what the workers did per queue, as cumulative totals
// since they started: the presence heartbeat keeps a ring of them to
// report the last hour.
func (m *metrics) window() map[string]*wire.QueueWindow {
	m.mu.RLock()
	pairs := make([]*pairMetrics, 0, len(m.pairs))
	for _, p := range m.pairs {
		pairs = append(pairs, p)
	}
	m.mu.RUnlock()
	out := map[string]*wire.QueueWindow{}
	for _, p := range pairs {
		w := out[p.queue]
		if w == nil {
			w = &wire.QueueWindow{Queue: p.queue, Wait: emptyHistogram(), Run: emptyHistogram()}
			out[p.queue] = w
		}
		w.Succeeded += counterValue(p.succeeded)
		w.NeedsReview += counterValue(p.needsReview)
		w.Cancelled += counterValue(p.cancelled)
		w.Retries += counterValue(p.retry) + counterValue(p.delay)
		addHistogram(&w.Wait, p.wait)
		addHistogram(&w.Run, p.run)
	}
	return out
}

func emptyHistogram() wire.Histogram {
	return wire.Histogram{Bounds: durationBuckets, Counts: make([]uint64, len(durationBuckets))}
}

func counterValue(c prometheus.Counter) uint64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		return 0
	}
	return uint64(d.GetCounter().GetValue())
}

// addHistogram adds h's observations to dst, whose bounds are
// durationBuckets.
func addHistogram(dst *wire.Histogram, h prometheus.Histogram) {
	var d dto.Metric
	if err := h.Write(&d); err != nil {
		return
	}
	hist := d.GetHistogram()
	for i, b := range hist.GetBucket() {
		if i < len(dst.Counts) {
			dst.Counts[i] += b.GetCumulativeCount()
		}
	}
	dst.Count += hist.GetSampleCount()
	dst.Sum += hist.GetSampleSum()
}

// subHistogram returns a − b, two cumulative snapshots of the same
// histogram.
func subHistogram(a, b wire.Histogram) wire.Histogram {
	out := wire.Histogram{Bounds: a.Bounds, Counts: make([]uint64, len(a.Counts)), Count: a.Count - b.Count, Sum: a.Sum - b.Sum}
	for i := range a.Counts {
		if i < len(b.Counts) {
			out.Counts[i] = a.Counts[i] - b.Counts[i]
		}
	}
	return out
}
