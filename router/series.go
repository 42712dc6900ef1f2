package router

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// lazySeries is one series of a labelled vector, resolved by its label
// values on first use and kept. A request's metrics are then a pointer load
// each, where WithLabelValues checks, hashes and looks up its label values
// under the vector's lock every time. As with WithLabelValues, a series
// appears when it is first observed, not before.
type lazySeries[T any] struct{ p atomic.Pointer[T] }

// get returns the series, resolving it with resolve the first time (two
// callers may both resolve it: the vector returns the same series).
func (l *lazySeries[T]) get(resolve func() T) T {
	if p := l.p.Load(); p != nil {
		return *p
	}
	s := resolve()
	l.p.Store(&s)
	return s
}

// outcomes are the values of the outcome label.
var outcomes = [...]string{outcomeOK, outcomeBadRequest, outcomeUnauthorized, outcomeNoRoute, outcomeUpstream4xx,
	outcomeOverloaded, outcomeUpstreamErr, outcomeTimeout, outcomeStreamError, outcomeClientGone, outcomeRouterBusy, outcomeInternal}

// Leg protocols and results, the labels of the prefill and decode
// durations.
var (
	legProtocols = [...]string{"sglang", "vllm"}
	legResults   = [...]string{"ok", "error", "cancelled"}
)

// labelIndex is v's index in values, -1 when absent.
func labelIndex(values []string, v string) int {
	for i, name := range values {
		if name == v {
			return i
		}
	}
	return -1
}

// seriesCache holds the router's per-request series that have a small,
// fixed set of label values.
type seriesCache struct {
	requests [numRoutes][len(outcomes)]lazySeries[prometheus.Counter]
	prefill  [len(legProtocols)][len(legResults)]lazySeries[prometheus.Observer]
	decode   [len(legProtocols)][len(legResults)]lazySeries[prometheus.Observer]
}

// countRequest counts a request of route r that ended with outcome.
func (m *metrics) countRequest(r route, outcome string) {
	i := labelIndex(outcomes[:], outcome)
	if i < 0 || r >= numRoutes {
		m.requests.WithLabelValues(r.label(), outcome).Inc()
		return
	}
	m.cache.requests[r][i].get(func() prometheus.Counter { return m.requests.WithLabelValues(r.label(), outcome) }).Inc()
}

// prefillSeries and decodeSeries are the series of a leg's duration.
func (m *metrics) prefillSeries(proto, result string) prometheus.Observer {
	return legSeries(&m.cache.prefill, m.prefillDuration, proto, result)
}

func (m *metrics) decodeSeries(proto, result string) prometheus.Observer {
	return legSeries(&m.cache.decode, m.decodeDuration, proto, result)
}

func legSeries(cache *[len(legProtocols)][len(legResults)]lazySeries[prometheus.Observer], vec *prometheus.HistogramVec,
	proto, result string) prometheus.Observer {
	p, r := labelIndex(legProtocols[:], proto), labelIndex(legResults[:], result)
	if p < 0 || r < 0 {
		return vec.WithLabelValues(proto, result)
	}
	return cache[p][r].get(func() prometheus.Observer { return vec.WithLabelValues(proto, result) })
}

// modelSeries are a model's series on one route, kept by its modelView.
type modelSeries struct {
	ttft, duration     lazySeries[prometheus.Observer]
	prompt, completion lazySeries[prometheus.Counter]
}

func (s *modelSeries) ttftOf(m *metrics, r route, model string) prometheus.Observer {
	return s.ttft.get(func() prometheus.Observer { return m.ttft.WithLabelValues(r.label(), model) })
}

func (s *modelSeries) durationOf(m *metrics, r route, model string) prometheus.Observer {
	return s.duration.get(func() prometheus.Observer { return m.duration.WithLabelValues(r.label(), model) })
}

func (s *modelSeries) promptOf(m *metrics, r route, model string) prometheus.Counter {
	return s.prompt.get(func() prometheus.Counter { return m.promptTokens.WithLabelValues(r.label(), model) })
}

func (s *modelSeries) completionOf(m *metrics, r route, model string) prometheus.Counter {
	return s.completion.get(func() prometheus.Counter { return m.completionTokens.WithLabelValues(r.label(), model) })
}
