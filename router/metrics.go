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
	outcomeInternal     = "internal_error" // the router itself failed it (a panic): its answer was cut, or none was sent
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
	takenOver          prometheus.Counter
	pairAttempts       *prometheus.CounterVec // prefill, decode, result
	pairKVBlocks       *prometheus.CounterVec // prefill, decode
	tokenize           struct{ ok, failed, unsupported prometheus.Counter }
	preciseTokens      struct{ prompt, cached prometheus.Counter }

	cache seriesCache // series.go
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
	r := &metricRegistrar{reg: reg}
	m := &metrics{
		requests: r.counterVec("requests_total", "Generation requests by route and outcome.", "route", "outcome"),
		ttft: r.histogramVec("ttft_seconds",
			"Time from dispatch to the first decode byte sent to the client, retries included, by route and model.",
			ttftBuckets(), "route", "model"),
		duration: r.histogramVec("request_duration_seconds",
			"End-to-end time of a generation request, from its arrival to the end of its answer (the last byte of a stream), "+
				"by route and model; requests refused before a model was resolved are not observed.",
			requestBuckets(), "route", "model"),
		promptTokens: r.counterVec("prompt_tokens_total",
			"Prompt tokens of successful requests as the decode engine reported them (usage.prompt_tokens; meta_info.prompt_tokens on /generate), "+
				"by route and model. A stream counts only when it reports usage (OpenAI routes: stream_options.include_usage); otherwise nothing is counted.",
			"route", "model"),
		completionTokens: r.counterVec("completion_tokens_total",
			"Completion tokens of successful requests as the decode engine reported them (usage.completion_tokens; meta_info.completion_tokens on /generate), "+
				"by route and model. A stream counts only when it reports usage (OpenAI routes: stream_options.include_usage); otherwise nothing is counted.",
			"route", "model"),
		prefillDuration: r.histogramVec("prefill_duration_seconds",
			"Duration of the prefill leg, from dispatch to the end of its answer.",
			latencyBuckets(), "protocol", "result"),
		decodeDuration: r.histogramVec("decode_duration_seconds",
			"Duration of the decode leg, from dispatch to the end of its stream.",
			latencyBuckets(), "protocol", "result"),
		retries: r.counterVec("retries_total",
			"Attempts made on another pair after a failed one, by the failure that caused them; a failure with no pair left to try is not a retry.",
			"reason"),
		breakerState: r.gaugeVec("breaker_state",
			"Circuit breaker state per peer: 0 closed, 1 open, 2 half-open; deleted when the peer leaves the routing snapshot.",
			"peer"),
		breakerTransitions: r.counterVec("breaker_transitions_total",
			"Circuit breaker transitions by kind (peer, pair) and new state.", "kind", "state"),
		pairBreakersOpen: r.gauge("pair_breakers_not_closed", "Pair circuit breakers currently open or half-open."),
		selections: r.counterVec("selections_total",
			"Times a peer was selected, by role; deleted when the peer leaves the routing snapshot.", "role", "peer"),
		staleMarks:  r.counterVec("stale_marks_total", "Stale marks the registry applied on the router's reports, by cause.", "cause"),
		quarantines: r.counter("quarantines_total", "Quarantines the registry decided on the router's reports."),
		inflight:    r.gauge("inflight_requests", "Generation requests being served."),
		takenOver: r.counter("streams_taken_over_total",
			"Slow streams the router took off net/http's connection (router/takeover.go); they stay in inflight_requests until they end."),
		pairAttempts: r.counterVec("pair_attempts_total",
			"Attempts on each pair, by result (ok, failed; a client that left counts neither); deleted when either peer leaves the routing snapshot.",
			"prefill", "decode", "result"),
		pairKVBlocks: r.counterVec("pair_kv_blocks_total",
			"KV blocks a vLLM prefill handed its decode for served requests (the block IDs of kv_transfer_params.remote_block_ids), by pair.",
			"prefill", "decode"),
	}
	tok := r.counterVec("tokenize_total", "Prompts the precise policy asked an engine to tokenize, by result: ok, failed "+
		"(the request was routed as cache_aware routes it), unsupported (no tokenize endpoint takes it: an SGLang chat, a batch).", "result")
	m.tokenize.ok, m.tokenize.failed, m.tokenize.unsupported = tok.WithLabelValues("ok"), tok.WithLabelValues("failed"), tok.WithLabelValues("unsupported")
	m.preciseTokens.prompt = r.counter("precise_prompt_tokens_total", "Prompt tokens of the requests the precise policy routed by their blocks (first attempts).")
	m.preciseTokens.cached = r.counter("precise_cached_tokens_total",
		"Of those, the tokens the router counted on the chosen prefill holding when the prompt computes (by its KV events and the prompts sent ahead): the hit rate the router predicted, to compare with the engines' own.")
	if r.err != nil {
		return nil, r.err
	}
	return m, nil
}

// metricRegistrar builds the router's series, named pdplane_router_<name>,
// and registers each as it is built; the first registration error is kept
// in err and later series are built but not registered.
type metricRegistrar struct {
	reg prometheus.Registerer
	err error
}

func (r *metricRegistrar) opts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: "pdplane", Subsystem: "router", Name: name, Help: help}
}

// register registers c unless an earlier series failed, and returns it.
func register[C prometheus.Collector](r *metricRegistrar, c C) C {
	if r.err != nil {
		return c
	}
	if err := r.reg.Register(c); err != nil {
		r.err = fmt.Errorf("register router metrics: %w", err)
	}
	return c
}

func (r *metricRegistrar) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return register(r, prometheus.NewCounterVec(prometheus.CounterOpts(r.opts(name, help)), labels))
}

func (r *metricRegistrar) counter(name, help string) prometheus.Counter {
	return register(r, prometheus.NewCounter(prometheus.CounterOpts(r.opts(name, help))))
}

func (r *metricRegistrar) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts(r.opts(name, help)), labels))
}

func (r *metricRegistrar) gauge(name, help string) prometheus.Gauge {
	return register(r, prometheus.NewGauge(prometheus.GaugeOpts(r.opts(name, help))))
}

func (r *metricRegistrar) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	o := r.opts(name, help)
	return register(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: o.Namespace, Subsystem: o.Subsystem, Name: o.Name, Help: o.Help, Buckets: buckets,
	}, labels))
}

// forgetPeer deletes the series of a peer that left the routing snapshot,
// so that a departed peer does not linger on dashboards.
func (m *metrics) forgetPeer(name string) {
	m.breakerState.DeleteLabelValues(name)
	m.selections.DeletePartialMatch(prometheus.Labels{"peer": name})
	for _, role := range [...]string{"prefill", "decode"} {
		for _, vec := range [...]*prometheus.CounterVec{m.pairAttempts, m.pairKVBlocks} {
			vec.DeletePartialMatch(prometheus.Labels{role: name})
		}
	}
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
