// Package metricstest reads Prometheus series in tests.
package metricstest

import dto "github.com/prometheus/client_model/go"

// Value returns the value of the first series of f whose labels include
// labels (name, value pairs): a counter's or gauge's value, a histogram's
// sample count. It reports false when f is nil or no series matches.
func Value(f *dto.MetricFamily, labels ...string) (float64, bool) {
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}
