// Package routertest holds helpers for tests that read the router's
// Prometheus metrics (and the control plane's, registered beside them).
package routertest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Samples gathers g and returns, for each series of name whose labels
// include labels, a counter's or gauge's value or a histogram's count, in
// the order the gatherer lists them.
func Samples(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) []float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				out = append(out, m.Counter.GetValue())
			case m.Gauge != nil:
				out = append(out, m.Gauge.GetValue())
			case m.Histogram != nil:
				out = append(out, float64(m.Histogram.GetSampleCount()))
			}
		}
	}
	return out
}

// hasLabels reports whether m carries every label of labels with its value.
func hasLabels(m *dto.Metric, labels map[string]string) bool {
next:
	for k, v := range labels {
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				continue next
			}
		}
		return false
	}
	return true
}

// Value is the first of Samples, or 0 when no series matches.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	if v := Samples(t, g, name, labels); len(v) > 0 {
		return v[0]
	}
	return 0
}
