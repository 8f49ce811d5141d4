package alertd

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are alertd's Prometheus metrics.
type metrics struct {
	alerts     *prometheus.CounterVec
	held       *prometheus.CounterVec
	deliveries *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gantry", Subsystem: "alertd", Name: "alerts_total",
			Help: "Alerts sent, by rule and kind."}, []string{"rule", "kind"}),
		held: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gantry", Subsystem: "alertd", Name: "alerts_held_total",
			Help: "Occurrences held back by a rule's window, to be counted into its next alert."}, []string{"rule"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gantry", Subsystem: "alertd", Name: "deliveries_total",
			Help: "Deliveries to the sinks, by sink and outcome: sent, retried (an attempt failed), failed (attempts used up), dropped (queue full)."},
			[]string{"sink", "outcome"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.alerts, m.held, m.deliveries} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("alertd: register metrics: %w", err)
		}
	}
	return m, nil
}
