package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
)

// ProbeConfig configures how the agent watches its engine. The thresholds
// default to those of SGLang's router (sgl-router HealthCheckConfig: 3
// failures, 2 successes, 5 s timeout); the interval follows the heartbeats
// rather than its 60 s, because the probes are the only way a crashed
// engine leaves routing for good, the router's breakers being the fast path
// between them.
type ProbeConfig struct {
	// Disabled turns probing off: heartbeats then say nothing about the
	// engine (the control plane takes it as healthy) and carry no load.
	Disabled bool
	// Interval is the time between the end of one probe and the start of
	// the next. Zero follows the heartbeat interval the control plane gives
	// the agent: the heartbeats carry what the probes find, so probing
	// more often is wasted and less often makes heartbeats repeat old news.
	Interval time.Duration
	// Timeout bounds each request to the engine.
	Timeout time.Duration
	// FailureThreshold failed /health probes in a row make the engine
	// unhealthy; SuccessThreshold passing ones in a row make it healthy
	// again.
	FailureThreshold int
	SuccessThreshold int
	// HTTPClient talks to the engine; Timeout applies per request.
	HTTPClient *http.Client
	// A vLLM decode that computed more than RecomputeThreshold of the
	// prompt tokens it took in over RecomputeWindow, at least
	// RecomputeMinTokens of them, is recomputing KV (recompute.go).
	RecomputeWindow    time.Duration
	RecomputeThreshold float64
	RecomputeMinTokens int
}

// Probe defaults.
const (
	DefaultProbeTimeout          = 5 * time.Second
	DefaultProbeFailureThreshold = 3
	DefaultProbeSuccessThreshold = 2
)

// WithDefaults fills in unset fields.
func (c ProbeConfig) WithDefaults() ProbeConfig {
	c.Timeout = cmp.Or(c.Timeout, DefaultProbeTimeout)
	c.FailureThreshold = cmp.Or(c.FailureThreshold, DefaultProbeFailureThreshold)
	c.SuccessThreshold = cmp.Or(c.SuccessThreshold, DefaultProbeSuccessThreshold)
	c.RecomputeWindow = cmp.Or(c.RecomputeWindow, DefaultRecomputeWindow)
	c.RecomputeThreshold = cmp.Or(c.RecomputeThreshold, DefaultRecomputeThreshold)
	c.RecomputeMinTokens = cmp.Or(c.RecomputeMinTokens, DefaultRecomputeMinTokens)
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute}}
	}
	return c
}

func (c ProbeConfig) validate() error {
	switch {
	case c.Interval < 0:
		return fmt.Errorf("agent: probe interval %s is negative", c.Interval)
	case c.Timeout < 0:
		return fmt.Errorf("agent: probe timeout %s is negative", c.Timeout)
	case c.FailureThreshold < 1:
		return fmt.Errorf("agent: probe failure threshold %d must be at least 1", c.FailureThreshold)
	case c.RecomputeWindow < 0 || !(c.RecomputeThreshold > 0 && c.RecomputeThreshold < 1) || c.RecomputeMinTokens < 1:
		return fmt.Errorf("agent: recompute window %s, threshold %v, minimum %d tokens: want a positive window, a threshold in (0, 1) and at least 1 token",
			c.RecomputeWindow, c.RecomputeThreshold, c.RecomputeMinTokens)
	case c.SuccessThreshold < 1:
		return fmt.Errorf("agent: probe success threshold %d must be at least 1", c.SuccessThreshold)
	}
	return nil
}

// EngineStatus is what the probes know about the engine.
type EngineStatus struct {
	// Healthy is the verdict. An engine is healthy from its first passing
	// probe (before it, it is starting or gone: not healthy); after that it
	// turns unhealthy after FailureThreshold failed probes in a row and
	// healthy again after SuccessThreshold passing ones.
	Healthy bool
	// Error is the last failed probe's error while unhealthy.
	Error string
	// Load is the engine's work as it last reported it; zero when it did
	// not answer.
	Load registry.Load
	// Probes counts the probes run so far.
	Probes int64
	// Recompute is what a vLLM engine's counters say of the prompt tokens
	// it computed rather than loaded over the recent window; Recomputing,
	// that the share is past the threshold (a decode recomputing KV its
	// prefills sent).
	Recompute   Recompute
	Recomputing bool
}

// EngineProbe probes an engine's /health and reads its load: SGLang's
// /v1/loads (/get_load on older versions), vLLM's /metrics.
type EngineProbe struct {
	cfg ProbeConfig
	log zerolog.Logger

	mu        sync.Mutex
	st        EngineStatus
	fails     int  // failed probes in a row
	oks       int  // passing probes in a row
	seenUp    bool // a probe of target has passed
	target    string
	legacyGet bool // the SGLang engine at target has no /v1/loads
	recompute recomputeWindow
}

// NewEngineProbe returns a probe; Probe or Run use it.
func NewEngineProbe(cfg ProbeConfig, log zerolog.Logger) (*EngineProbe, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &EngineProbe{cfg: cfg, log: log, st: notProbed(0), recompute: recomputeWindow{window: cfg.RecomputeWindow}}, nil
}

// notProbed is the status before a probe of the engine passed.
func notProbed(probes int64) EngineStatus {
	return EngineStatus{Error: "the engine has not answered a health probe yet", Probes: probes}
}

// Status returns what the probes know now.
func (p *EngineProbe) Status() EngineStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}

// ProbeTarget is the engine a probe loop watches.
type ProbeTarget struct {
	URL    string // "" while there is nothing to probe (before registration)
	Engine registry.Engine
	// Interval is used when ProbeConfig.Interval is zero.
	Interval time.Duration
}

// Run probes the engine that target names, every interval, until ctx ends;
// after, when not nil, is given what each probe found.
func (p *EngineProbe) Run(ctx context.Context, target func() ProbeTarget, after func(EngineStatus)) {
	for {
		t := target()
		if t.URL != "" {
			st := p.Probe(ctx, t.URL, t.Engine)
			if after != nil {
				after(st)
			}
		}
		wait := p.cfg.Interval
		if wait == 0 {
			wait = t.Interval
		}
		if !sleep(ctx, max(wait, 10*time.Millisecond)) {
			return
		}
	}
}

// Probe runs one probe of the engine at url now: /health, then, when it
// passes, the load. A failure to read the load is not a health failure: the
// engine serves, only its figures are missing.
func (p *EngineProbe) Probe(ctx context.Context, url string, engine registry.Engine) EngineStatus {
	url = strings.TrimRight(url, "/")
	p.mu.Lock()
	if url != p.target { // a new engine: nothing learnt about the old one holds
		p.target, p.legacyGet, p.fails, p.oks, p.seenUp = url, false, 0, 0, false
		p.recompute.reset()
		p.st = notProbed(p.st.Probes)
	}
	legacy := p.legacyGet
	p.mu.Unlock()

	herr := p.health(ctx, url)
	var load registry.Load
	var sources *promptSources
	var lerr error
	if herr == nil {
		if engine.Protocol() == registry.EngineVLLM {
			load, sources, lerr = p.vllmLoad(ctx, url)
		} else {
			load, legacy, lerr = p.sglangLoad(ctx, url, legacy)
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if url != p.target {
		return p.st
	}
	p.st.Probes++
	p.legacyGet = legacy
	p.st.Load = load
	if sources != nil {
		p.st.Recompute = p.recompute.add(time.Now(), *sources)
		p.st.Recomputing = p.st.Recompute.Prompt >= int64(p.cfg.RecomputeMinTokens) && p.st.Recompute.Fraction() > p.cfg.RecomputeThreshold
	}
	if herr != nil {
		p.fails, p.oks = p.fails+1, 0
		if p.st.Healthy && p.fails >= p.cfg.FailureThreshold {
			p.st.Healthy = false
			p.log.Warn().Err(herr).Int("failures", p.fails).Msg("engine unhealthy")
		}
		if !p.st.Healthy {
			p.st.Error = probeErrorText(herr)
		}
		return p.st
	}
	p.fails, p.oks = 0, p.oks+1
	switch {
	case !p.seenUp:
		p.seenUp, p.st.Healthy, p.st.Error = true, true, ""
		p.log.Info().Msg("engine answers its health probe")
	case !p.st.Healthy && p.oks >= p.cfg.SuccessThreshold:
		p.st.Healthy, p.st.Error = true, ""
		p.log.Info().Int("successes", p.oks).Msg("engine healthy again")
	}
	if lerr != nil {
		p.log.Debug().Err(lerr).Msg("read engine load")
	}
	return p.st
}

// health is one GET /health. SGLang (http_server.py health /
// health_generate) and vLLM (api_server.py health) both answer 200 when
// the engine serves and 503 while it starts, drains or is dead; anything
// but 200, or no answer within the timeout, fails the probe.
func (p *EngineProbe) health(ctx context.Context, url string) error {
	resp, err := p.get(ctx, url+"/health")
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /health: %s", resp.Status)
	}
	return nil
}

func (p *EngineProbe) get(ctx context.Context, url string) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// maxLoadBody bounds what the agent reads of a load answer; vLLM's
// /metrics with histograms runs to a few hundred KiB.
const maxLoadBody = 8 << 20

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxLoadBody))
	resp.Body.Close()
}

// sglangLoads is SGLang's GET /v1/loads answer (entrypoints/v1_loads.py
// get_loads; per-rank fields from managers/load_snapshot.py
// LoadSnapshot.to_dict).
type sglangLoads struct {
	Loads []struct {
		DPRank         int     `json:"dp_rank"`
		NumRunningReqs int     `json:"num_running_reqs"`
		NumWaitingReqs int     `json:"num_waiting_reqs"`
		TokenUsage     float64 `json:"token_usage"`
	} `json:"loads"`
}

// sglangLegacyLoad is one DP rank of SGLang's deprecated GET /get_load
// answer (http_server.py get_load): num_reqs counts running and waiting
// requests together.
type sglangLegacyLoad struct {
	DPRank         int `json:"dp_rank"`
	NumReqs        int `json:"num_reqs"`
	NumWaitingReqs int `json:"num_waiting_reqs"`
}

// sglangLoad reads /v1/loads, or /get_load once /v1/loads answered 404; it
// returns whether the engine is of the older kind.
func (p *EngineProbe) sglangLoad(ctx context.Context, url string, legacy bool) (registry.Load, bool, error) {
	if !legacy {
		var v sglangLoads
		err := p.getJSON(ctx, url+"/v1/loads", &v)
		var status *statusError
		if !errors.As(err, &status) || status.code != http.StatusNotFound {
			if err != nil {
				return registry.Load{}, false, err
			}
			var l registry.Load
			for _, r := range v.Loads { // one per DP rank
				l.Running = addCount(l.Running, r.NumRunningReqs)
				l.Queued = addCount(l.Queued, r.NumWaitingReqs)
				l.KVUsage = max(l.KVUsage, r.TokenUsage)
			}
			l.KVUsage = clampUsage(l.KVUsage)
			return l, false, nil
		}
	}
	var ranks []sglangLegacyLoad
	if err := p.getJSON(ctx, url+"/get_load", &ranks); err != nil {
		return registry.Load{}, true, err
	}
	var l registry.Load
	for _, r := range ranks {
		l.Running = addCount(l.Running, r.NumReqs-r.NumWaitingReqs)
		l.Queued = addCount(l.Queued, r.NumWaitingReqs)
	}
	return l, true, nil
}

type statusError struct {
	path string
	code int
}

func (e *statusError) Error() string { return fmt.Sprintf("GET %s: %d", e.path, e.code) }

func (p *EngineProbe) getJSON(ctx context.Context, url string, v any) error {
	resp, err := p.get(ctx, url)
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return &statusError{path: resp.Request.URL.Path, code: resp.StatusCode}
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxLoadBody)).Decode(v); err != nil {
		return fmt.Errorf("parse %s: %w", resp.Request.URL.Path, err)
	}
	return nil
}

// vLLM's load gauges (v1/metrics/loggers.py PrometheusStatLogger), one
// series per engine (DP rank) with labels model_name and engine.
// gpu_cache_usage_perc is the name before kv_cache_usage_perc.
const (
	vllmRunning    = "vllm:num_requests_running"
	vllmWaiting    = "vllm:num_requests_waiting"
	vllmKVUsage    = "vllm:kv_cache_usage_perc"
	vllmGPUKVUsage = "vllm:gpu_cache_usage_perc"
)

// vllmLoad reads vLLM's /metrics.
func (p *EngineProbe) vllmLoad(ctx context.Context, url string) (registry.Load, *promptSources, error) {
	resp, err := p.get(ctx, url+"/metrics")
	if err != nil {
		return registry.Load{}, nil, err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return registry.Load{}, nil, &statusError{path: "/metrics", code: resp.StatusCode}
	}
	return parseVLLMMetrics(io.LimitReader(resp.Body, maxLoadBody))
}

// ParseVLLMMetrics reads the load from vLLM's Prometheus text: running and
// waiting requests summed over engines, KV usage the fullest engine's.
func ParseVLLMMetrics(r io.Reader) (registry.Load, error) {
	l, _, err := parseVLLMMetrics(r)
	return l, err
}

// vLLM's prompt-token and request counters (v1/metrics/loggers.py), as
// prometheus_client writes a counter: with the suffix _total.
const (
	vllmPromptTokensBySource = "vllm:prompt_tokens_by_source_total"
	vllmRequestSuccess       = "vllm:request_success_total"
)

// parseVLLMMetrics reads the load and, where the engine has them (vLLM
// 0.32 does; an engine without them is not judged), the prompt-token
// counters.
func parseVLLMMetrics(r io.Reader) (registry.Load, *promptSources, error) {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return registry.Load{}, nil, fmt.Errorf("parse vLLM metrics: %w", err)
	}
	if _, ok := fams[vllmRunning]; !ok {
		return registry.Load{}, nil, fmt.Errorf("parse vLLM metrics: no %s", vllmRunning)
	}
	// vLLM declares its series; a scrape without the TYPE line parses
	// them as untyped, which reads the same.
	value := func(m *dto.Metric) float64 {
		return m.GetGauge().GetValue() + m.GetUntyped().GetValue() + m.GetCounter().GetValue()
	}
	sum := func(name string, keep func(*dto.Metric) bool) (v float64) {
		for _, m := range fams[name].GetMetric() {
			if keep == nil || keep(m) {
				v += value(m)
			}
		}
		return v
	}
	running, waiting := sum(vllmRunning, nil), sum(vllmWaiting, nil)
	l := registry.Load{Running: clampCount(running), Queued: clampCount(waiting)}
	usage, ok := fams[vllmKVUsage]
	if !ok {
		usage = fams[vllmGPUKVUsage]
	}
	for _, m := range usage.GetMetric() {
		l.KVUsage = max(l.KVUsage, value(m))
	}
	l.KVUsage = clampUsage(l.KVUsage)
	if _, ok := fams[vllmPromptTokensBySource]; !ok {
		return l, nil, nil
	}
	source := func(src string) func(*dto.Metric) bool {
		return func(m *dto.Metric) bool {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "source" {
					return lp.GetValue() == src
				}
			}
			return false
		}
	}
	ps := &promptSources{
		computed:    sum(vllmPromptTokensBySource, source("local_compute")),
		transferred: sum(vllmPromptTokensBySource, source("external_kv_transfer")),
		requests:    sum(vllmRequestSuccess, nil),
		inFlight:    l.Running + l.Queued,
	}
	if !(ps.computed >= 0 && ps.transferred >= 0 && ps.requests >= 0) { // NaN, or a negative counter
		return l, nil, nil
	}
	return l, ps, nil
}

// addCount adds an engine's count to a total a heartbeat may carry.
func addCount(total, n int) int {
	return min(total+min(max(n, 0), registry.MaxLoadCount), registry.MaxLoadCount)
}

// clampCount turns a gauge into a request count a heartbeat may carry.
func clampCount(v float64) int {
	if !(v > 0) {
		return 0
	}
	return int(min(v, registry.MaxLoadCount))
}

// clampUsage keeps an engine's odd figure (NaN, or a rounding past 1) from
// failing the heartbeat that carries it.
func clampUsage(u float64) float64 {
	if !(u > 0) {
		return 0
	}
	return min(u, 1)
}

// probeErrorText is err as a heartbeat may carry it: one line, bounded.
func probeErrorText(err error) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, err.Error())
	if len(s) > registry.MaxEngineErrorLen {
		s = strings.ToValidUTF8(s[:registry.MaxEngineErrorLen-3], "") + "..."
	}
	return s
}
