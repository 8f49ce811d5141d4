package auditd

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// registerMetrics exports the sink's counters to reg: read at scrape time,
// they cost the ingest nothing.
func (s *Service) registerMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	counter := func(name, help string, v func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "gantry", Subsystem: "auditd", Name: name, Help: help},
			func() float64 { return float64(v()) })
	}
	for _, c := range []prometheus.Collector{
		counter("events_stored_total", "Events written into the audit store (its ingest rate is the rate of this).", s.stored.Load),
		counter("events_malformed_total", "Messages on the audit stream that were not valid events, stored as AUDIT_MALFORMED.", s.malformed.Load),
		counter("write_errors_total", "Failed store writes (each retried).", s.writeErrors.Load),
		counter("events_expired_total", "Events removed by retention.", s.expired.Load),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("auditd: register metrics: %w", err)
		}
	}
	return nil
}
