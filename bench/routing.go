package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// Routers the routing benchmark runs besides the peers (PeerSMG,
// PeerVLLMRouter).
const (
	// RouterPdplane is `pdplane serve --prefill-policy precise`: a prefill
	// picked from the sims' KV cache events.
	RouterPdplane = "pdplane"
	// RouterPdplaneRing is `pdplane serve --prefill-policy cache_aware`: a
	// consistent-hash ring over the prompt's first bytes.
	RouterPdplaneRing = "pdplane-ring"
	// RouterPdplaneP2C is `pdplane serve --prefill-policy power_of_two`:
	// the less loaded of two prefills drawn at random, blind to caches;
	// the reference on traffic that shares no prefix.
	RouterPdplaneP2C = "pdplane-power-of-two"
	// RouterOracle is the harness's own router that asks every prefill
	// for its cache and queue before each pick (oracle): the best a
	// router could do on the fleet, not a router to run.
	RouterOracle = "oracle"
)

// RoutingConfig configures Routing. Zero fields take defaults.
type RoutingConfig struct {
	// Pdplane is the pdplane binary (serve and sim). Required.
	Pdplane string
	// Routers are the routers to measure, each on a fleet of its own, in
	// this order: RouterPdplane, RouterPdplaneRing, RouterOracle, and the
	// peers PeerSMG and PeerVLLMRouter with their executables.
	Routers []Peer
	// Workloads lists WorkloadPrefixHeavy and/or WorkloadNoShared; default
	// prefix-heavy.
	Workloads []string
	// Requests is each workload's number of requests; default 600.
	Requests int
	// Duration, when set, sets Requests to what the offered rate sends in
	// that time.
	Duration time.Duration
	// Seed draws the workload and its arrivals; default 1.
	Seed uint64
	// Load is the offered rate as a fraction of the fleet's prefill
	// capacity with no cache hit (CapacityRPS); default 0.7.
	Load float64
	// Prefills and Decodes are each fleet's engines; default 4 and 2.
	Prefills, Decodes int
	// PrefillTimePerToken is the prefills' compute time per uncached
	// prompt token; default 100µs.
	PrefillTimePerToken time.Duration
	// PrefillSlots is how many prefills each prefill sim computes at
	// once; default 1.
	PrefillSlots int
	// PageSize is the tokens of a KV page, the prefix cache's block;
	// default 16.
	PageSize int
	// KVPages is each prefill's KV pool, so its prefix cache's capacity,
	// in pages; default 1024 (16,384 tokens), below the prefix-heavy
	// workload's working set.
	KVPages int
	// CachePages, when set, holds each prefill's prefix cache to fewer
	// pages than its pool (`pdplane sim --prefix-cache-pages`): a cache
	// under pressure, while the pool still fits the requests in flight.
	CachePages int
	// MaxTokens is each answer's length; default 8.
	MaxTokens int
	// Workload shapes the generated workloads beyond kind, seed and
	// number of requests.
	Workload WorkloadSpec
	// Progress, when set, receives a line per step and, every few
	// seconds, the requests done.
	Progress io.Writer
}

// WithDefaults returns the config with unset fields filled in.
func (c RoutingConfig) WithDefaults() RoutingConfig {
	if len(c.Workloads) == 0 {
		c.Workloads = []string{WorkloadPrefixHeavy}
	}
	c.Requests = cmp.Or(c.Requests, 600)
	c.Seed = cmp.Or(c.Seed, 1)
	c.Load = cmp.Or(c.Load, 0.7)
	c.Prefills = cmp.Or(c.Prefills, 4)
	c.Decodes = cmp.Or(c.Decodes, 2)
	c.PrefillTimePerToken = cmp.Or(c.PrefillTimePerToken, 100*time.Microsecond)
	c.PrefillSlots = cmp.Or(c.PrefillSlots, 1)
	c.PageSize = cmp.Or(c.PageSize, 16)
	c.KVPages = cmp.Or(c.KVPages, 1024)
	c.CachePages = cmp.Or(c.CachePages, c.KVPages)
	c.MaxTokens = cmp.Or(c.MaxTokens, 8)
	c.Workload = c.Workload.WithDefaults()
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

func (c RoutingConfig) validate() error {
	switch {
	case c.Pdplane == "":
		return errors.New("routing config: pdplane: the binary is required")
	case c.Requests < 1:
		return fmt.Errorf("routing config: requests: at least 1, got %d", c.Requests)
	case c.Duration < 0:
		return fmt.Errorf("routing config: duration: not negative, got %v", c.Duration)
	case c.Load <= 0:
		return fmt.Errorf("routing config: load: above 0, got %v", c.Load)
	case c.Prefills < 1 || c.Decodes < 1:
		return fmt.Errorf("routing config: prefills and decodes: at least 1 each, got %d and %d", c.Prefills, c.Decodes)
	case c.PrefillTimePerToken < time.Microsecond:
		return fmt.Errorf("routing config: prefill_time_per_token: at least 1µs, got %v", c.PrefillTimePerToken)
	case c.PrefillSlots < 1:
		return fmt.Errorf("routing config: prefill_slots: at least 1, got %d", c.PrefillSlots)
	case c.PageSize < 1 || c.KVPages < 1:
		return fmt.Errorf("routing config: page_size and kv_pages: at least 1 each, got %d and %d", c.PageSize, c.KVPages)
	case c.CachePages < 1 || c.CachePages > c.KVPages:
		return fmt.Errorf("routing config: cache_pages: 1 to kv_pages (%d), got %d", c.KVPages, c.CachePages)
	case c.MaxTokens < 1:
		return fmt.Errorf("routing config: max_tokens: at least 1, got %d", c.MaxTokens)
	case len(c.Routers) == 0:
		return errors.New("routing config: routers: at least one")
	}
	for _, w := range c.Workloads {
		if w != WorkloadPrefixHeavy && w != WorkloadNoShared {
			return fmt.Errorf("routing config: workloads: %s or %s, got %q", WorkloadPrefixHeavy, WorkloadNoShared, w)
		}
	}
	for _, r := range c.Routers {
		switch r.Name {
		case RouterPdplane, RouterPdplaneRing, RouterPdplaneP2C, RouterOracle:
		case PeerSMG, PeerVLLMRouter:
			if r.Bin == "" {
				return fmt.Errorf("routing config: routers: %s needs its executable", r.Name)
			}
		default:
			return fmt.Errorf("routing config: routers: %s, %s, %s, %s, %s or %s, got %q",
				RouterPdplane, RouterPdplaneRing, RouterPdplaneP2C, RouterOracle, PeerSMG, PeerVLLMRouter, r.Name)
		}
	}
	shape := c.Workload // its kind and length are the config's
	shape.Kind, shape.Requests = WorkloadPrefixHeavy, c.Requests
	return shape.validate()
}

// CapacityRPS is the requests a second the fleet's prefills compute when
// no prompt token is found in a cache: every prefill's slots busy with
// prompts of meanTokens tokens.
func (c RoutingConfig) CapacityRPS(meanTokens float64) float64 {
	return float64(c.Prefills*c.PrefillSlots) / (meanTokens * c.PrefillTimePerToken.Seconds())
}

// RouterResult is one router's figures on one workload.
type RouterResult struct {
	Router string
	Engine string // "sglang" or "vllm"
	// Policy is how the router was told to pick, in words.
	Policy string
	// Err is why the router was not measured ("" when it was).
	Err      string
	Requests int // sent
	OK       int
	// Failed counts the requests answered with a status other than 200,
	// a stream that broke or carried an error, or never sent.
	Failed     int
	FirstError string
	// PromptTokens and CachedTokens are the prefills' counters over the
	// workload (GET /_sim/stats prompt_tokens, cached_prompt_tokens).
	PromptTokens, CachedTokens int64
	Elapsed                    time.Duration // from the first request sent to the last answer
	TTFT                       []time.Duration
	E2E                        []time.Duration
}

// HitRate is the share of the prompt tokens the prefills found cached.
func (r RouterResult) HitRate() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return float64(r.CachedTokens) / float64(r.PromptTokens)
}

// PrefillTokensPerRequest is the prompt tokens the prefills computed, per
// request sent.
func (r RouterResult) PrefillTokensPerRequest() float64 {
	if r.Requests == 0 {
		return 0
	}
	return float64(r.PromptTokens-r.CachedTokens) / float64(r.Requests)
}

// RPS is requests completed per second of the run.
func (r RouterResult) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.OK) / r.Elapsed.Seconds()
}

// TTFTPercentile and E2EPercentile are the p-th percentiles of the
// completed requests' client-side times to first token and to the end.
func (r RouterResult) TTFTPercentile(p float64) time.Duration { return percentile(r.TTFT, p) }

// E2EPercentile is the p-th percentile of the time to the answer's end.
func (r RouterResult) E2EPercentile(p float64) time.Duration { return percentile(r.E2E, p) }

// WorkloadRun is every router's figures on one workload.
type WorkloadRun struct {
	Workload *Workload
	// Rate is the offered rate (requests a second), Load × CapacityRPS.
	Rate, CapacityRPS float64
	Results           []RouterResult
}

// RoutingReport is what Routing measured.
type RoutingReport struct {
	Config RoutingConfig
	Runs   []WorkloadRun
}

// Failed reports whether a router was not measured or a request failed.
func (r *RoutingReport) Failed() bool {
	for _, run := range r.Runs {
		for _, res := range run.Results {
			if res.Err != "" || res.Failed > 0 {
				return true
			}
		}
	}
	return false
}

// Routing runs each workload of cfg through each router, each on a fresh
// fleet of sims with cold caches, and reads what the prefills' caches
// found. A router that cannot be started is reported (RouterResult.Err)
// and the others still run; the error returned is the context's or the
// config's.
func Routing(ctx context.Context, cfg RoutingConfig) (*RoutingReport, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if _, err := RaiseFDLimit(); err != nil {
		return nil, err
	}
	rep := &RoutingReport{Config: cfg}
	for _, kind := range cfg.Workloads {
		run, err := routingRun(ctx, cfg, kind)
		if run != nil {
			rep.Runs = append(rep.Runs, *run)
		}
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// routingRun generates one workload and runs it through every router.
func routingRun(ctx context.Context, cfg RoutingConfig, kind string) (*WorkloadRun, error) {
	spec := cfg.Workload
	spec.Kind, spec.Seed, spec.Requests = kind, cfg.Seed, cfg.Requests
	run := &WorkloadRun{}
	if cfg.Duration > 0 {
		// The rate depends on the prompts' mean length: measure it on
		// a sample, then send what the rate sends in the duration.
		sample := spec
		sample.Requests = 1000
		w, err := GenerateWorkload(sample)
		if err != nil {
			return nil, err
		}
		rate := cfg.Load * cfg.CapacityRPS(w.MeanTokens())
		spec.Requests = max(1, int(rate*cfg.Duration.Seconds()+0.5))
	}
	w, err := GenerateWorkload(spec)
	if err != nil {
		return nil, err
	}
	run.Workload = w
	run.CapacityRPS = cfg.CapacityRPS(w.MeanTokens())
	run.Rate = cfg.Load * run.CapacityRPS
	arrivals := w.Arrivals(run.Rate)
	fmt.Fprintf(cfg.Progress, "routing: %s: %d requests, mean prompt %.0f tokens, %.2f req/s (%.2f × %.2f req/s of prefill capacity)\n",
		kind, len(w.Requests), w.MeanTokens(), run.Rate, cfg.Load, run.CapacityRPS)
	for _, p := range cfg.Routers {
		res := measureRouter(ctx, cfg, p, w, arrivals)
		if err := ctx.Err(); err != nil {
			return run, err
		}
		if res.Err != "" {
			fmt.Fprintf(cfg.Progress, "routing: %s, %s: not measured: %s\n", p.Name, kind, res.Err)
		} else {
			fmt.Fprintf(cfg.Progress, "routing: %s, %s: %d ok, %d failed, hit rate %.1f%%, TTFT p50 %s in %v\n",
				p.Name, kind, res.OK, res.Failed, 100*res.HitRate(), fmtDur(res.TTFTPercentile(50)), res.Elapsed.Round(time.Millisecond))
		}
		run.Results = append(run.Results, res)
	}
	return run, nil
}

// measureRouter starts a fleet for router p, sends the workload through it
// and reads its prefills' counters.
func measureRouter(ctx context.Context, cfg RoutingConfig, p Peer, w *Workload, arrivals []time.Duration) RouterResult {
	res := RouterResult{Router: p.Name, Engine: routerEngine(p.Name), Policy: routerPolicy(p.Name)}
	fmt.Fprintf(cfg.Progress, "routing: %s, %s: starting %d prefills and %d decodes (%s)\n",
		p.Name, w.Spec.Kind, cfg.Prefills, cfg.Decodes, res.Engine)
	f, err := startRoutingFleet(ctx, cfg, p)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer f.close()
	before, err := f.prefillCounters(ctx)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	d := drive(ctx, f.url, w, arrivals, cfg.MaxTokens, func(done, failed int, elapsed time.Duration) {
		fmt.Fprintf(cfg.Progress, "routing: %s, %s: %d/%d requests done (%d failed), %v\n",
			p.Name, w.Spec.Kind, done, len(w.Requests), failed, elapsed.Round(time.Second))
	})
	after, err := f.prefillCounters(ctx)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.Requests, res.OK, res.Failed, res.FirstError = len(w.Requests), d.ok, d.failed, d.firstError
	res.Elapsed, res.TTFT, res.E2E = d.elapsed, d.ttft, d.e2e
	res.PromptTokens = after.PromptTokens - before.PromptTokens
	res.CachedTokens = after.CachedPromptTokens - before.CachedPromptTokens
	if res.Failed > 0 && res.FirstError != "" {
		fmt.Fprintf(cfg.Progress, "routing: %s: first failure: %s\n%s\n", p.Name, res.FirstError, f.outputs())
	}
	return res
}

// routerEngine is the engine kind router name routes: vllm-router's
// fleet speaks vLLM's PD protocol, every other SGLang's.
func routerEngine(name string) string {
	if name == PeerVLLMRouter {
		return "vllm"
	}
	return "sglang"
}

// routerPolicy says how each router is told to pick.
func routerPolicy(name string) string {
	switch name {
	case RouterPdplane, RouterPdplaneRing, RouterPdplaneP2C:
		return "--prefill-policy " + pdplanePolicy(name)
	case PeerSMG, PeerVLLMRouter:
		return "--policy cache_aware"
	case RouterOracle:
		return "probes every prefill"
	}
	return ""
}

// pdplanePolicy is the serve's --prefill-policy of a pdplane router.
func pdplanePolicy(name string) string {
	switch name {
	case RouterPdplane:
		return "precise"
	case RouterPdplaneP2C:
		return "power_of_two"
	}
	return "cache_aware"
}
