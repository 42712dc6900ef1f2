package router

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a request, the values of the outcome label.
const (
	outcomeOK           = "ok"
	outcomeBadRequest   = "bad_request"    // the client's request was refused before any upstream call
	outcomeUnauthorized = "unauthorized"   // missing or wrong API key
	outcomeNoRoute      = "no_route"       // no ready, compatible, healthy pair
	outcomeUpstream4xx  = "upstream_4xx"   // an engine refused the request; its answer was passed on
	outcomeOverloaded   = "overloaded"     // every pair tried answered 429/503 with Retry-After
	outcomeUpstreamErr  = "upstream_error" // every pair tried failed before the first byte
	outcomeTimeout      = "timeout"        // the last failure was a timeout
	outcomeStreamError  = "stream_error"   // the decode failed after the first byte
	outcomeClientGone   = "client_gone"    // the client left (499 in logs)
	outcomeRouterBusy   = "max_inflight"   // refused at Config.MaxInflight, before the body was read
)

// metrics are the router's Prometheus series, all prefixed pdplane_router_.
type metrics struct {
	requests           *prometheus.CounterVec   // route, outcome
	ttft               *prometheus.HistogramVec // route, model
	duration           *prometheus.HistogramVec // route, model
	promptTokens       *prometheus.CounterVec   // route, model
	completionTokens   *prometheus.CounterVec   // route, model
	prefillDuration    *prometheus.HistogramVec // protocol, result
	decodeDuration     *prometheus.HistogramVec // protocol, result
	retries            *prometheus.CounterVec   // reason
	breakerState       *prometheus.GaugeVec     // peer
	breakerTransitions *prometheus.CounterVec   // kind, state
	pairBreakersOpen   prometheus.Gauge
	selections         *prometheus.CounterVec // role, peer
	staleMarks         *prometheus.CounterVec // cause
	quarantines        prometheus.Counter
	inflight           prometheus.Gauge
}

// latencyBuckets span loopback (sub-millisecond) to long prefills.
func latencyBuckets() []float64 {
	return []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}
}

// ttftBuckets span a cached short prompt (milliseconds) to a long prompt
// queued behind others (a minute).
func ttftBuckets() []float64 {
	return []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60}
}

// requestBuckets span a refused or one-token request to a long generation
// (ten minutes).
func requestBuckets() []float64 {
	return []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "pdplane", "router"
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Generation requests by route and outcome.",
		}, []string{"route", "outcome"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "ttft_seconds",
			Help:    "Time from dispatch to the first decode byte sent to the client, retries included, by route and model.",
			Buckets: ttftBuckets(),
		}, []string{"route", "model"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "request_duration_seconds",
			Help: "End-to-end time of a generation request, from its arrival to the end of its answer (the last byte of a stream), " +
				"by route and model; requests refused before a model was resolved are not observed.",
			Buckets: requestBuckets(),
		}, []string{"route", "model"}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "prompt_tokens_total",
			Help: "Prompt tokens of successful requests as the decode engine reported them (usage.prompt_tokens; meta_info.prompt_tokens on /generate), " +
				"by route and model. A stream counts only when it reports usage (OpenAI routes: stream_options.include_usage); otherwise nothing is counted.",
		}, []string{"route", "model"}),
		completionTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "completion_tokens_total",
			Help: "Completion tokens of successful requests as the decode engine reported them (usage.completion_tokens; meta_info.completion_tokens on /generate), " +
				"by route and model. A stream counts only when it reports usage (OpenAI routes: stream_options.include_usage); otherwise nothing is counted.",
		}, []string{"route", "model"}),
		prefillDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "prefill_duration_seconds",
			Help:    "Duration of the prefill leg, from dispatch to the end of its answer.",
			Buckets: latencyBuckets(),
		}, []string{"protocol", "result"}),
		decodeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "decode_duration_seconds",
			Help:    "Duration of the decode leg, from dispatch to the end of its stream.",
			Buckets: latencyBuckets(),
		}, []string{"protocol", "result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "retries_total",
			Help: "Attempts made on another pair after a failed one, by the failure that caused them; a failure with no pair left to try is not a retry.",
		}, []string{"reason"}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "breaker_state",
			Help: "Circuit breaker state per peer: 0 closed, 1 open, 2 half-open; deleted when the peer leaves the routing snapshot.",
		}, []string{"peer"}),
		breakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "breaker_transitions_total",
			Help: "Circuit breaker transitions by kind (peer, pair) and new state.",
		}, []string{"kind", "state"}),
		pairBreakersOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "pair_breakers_not_closed",
			Help: "Pair circuit breakers currently open or half-open.",
		}),
		selections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "selections_total",
			Help: "Times a peer was selected, by role; deleted when the peer leaves the routing snapshot.",
		}, []string{"role", "peer"}),
		staleMarks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "stale_marks_total",
			Help: "Stale marks the registry applied on the router's reports, by cause.",
		}, []string{"cause"}),
		quarantines: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "quarantines_total",
			Help: "Quarantines the registry decided on the router's reports.",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "inflight_requests",
			Help: "Generation requests being served.",
		}),
	}
	for _, c := range []prometheus.Collector{
		m.requests, m.ttft, m.duration, m.promptTokens, m.completionTokens, m.prefillDuration, m.decodeDuration, m.retries, m.breakerState,
		m.breakerTransitions, m.pairBreakersOpen, m.selections, m.staleMarks, m.quarantines, m.inflight,
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register router metrics: %w", err)
		}
	}
	return m, nil
}

// forgetPeer deletes the series of a peer that left the routing snapshot,
// so that a departed peer does not linger on dashboards.
func (m *metrics) forgetPeer(name string) {
	m.breakerState.DeleteLabelValues(name)
	m.selections.DeletePartialMatch(prometheus.Labels{"peer": name})
}

// transitionCounter returns a function that counts a breaker of the given
// kind ("peer" or "pair") entering a state; the counters are resolved once.
func (m *metrics) transitionCounter(kind string) func(to breakerState) {
	opened := m.breakerTransitions.WithLabelValues(kind, breakerOpen.String())
	halfOpened := m.breakerTransitions.WithLabelValues(kind, breakerHalfOpen.String())
	closed := m.breakerTransitions.WithLabelValues(kind, breakerClosed.String())
	return func(to breakerState) {
		switch to {
		case breakerOpen:
			opened.Inc()
		case breakerHalfOpen:
			halfOpened.Inc()
		default:
			closed.Inc()
		}
	}
}
