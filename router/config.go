package router

import (
	"cmp"
	"fmt"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Policy names how the router picks a peer for one role of a pair.
type Policy string

// Selection policies. Each costs O(1) or O(log n) in the number of peers.
const (
	// PolicyRoundRobin cycles through the candidates in order.
	PolicyRoundRobin Policy = "round_robin"
	// PolicyRandom picks a candidate uniformly at random.
	PolicyRandom Policy = "random"
	// PolicyPowerOfTwo draws two candidates at random and keeps the less
	// loaded, by the load least_load compares.
	PolicyPowerOfTwo Policy = "power_of_two"
	// PolicyLeastLoad picks the least loaded candidate: fewest requests
	// (the engine's running and queued ones from its last heartbeat, moved
	// by this router's own in-flight count since), then the lowest KV
	// usage. It compares every candidate up to 8, and 8 consecutive ones
	// from a random start beyond, so a pick stays O(1).
	PolicyLeastLoad Policy = "least_load"
	// PolicyCacheAware maps a hash of the prompt's first bytes to a peer by
	// consistent hashing, so that requests sharing a prefix meet the same
	// prefix cache, and falls back to power_of_two when the favoured peer is
	// markedly busier than the alternative.
	PolicyCacheAware Policy = "cache_aware"
	// PolicyPrecise scores prefills by the blocks of the prompt their KV
	// events say they hold, weighed against their queues: the prompt's
	// uncached tokens plus the work queued ahead of it, least first. The
	// prompt is tokenized by an engine of the model. Prefills that publish
	// no KV events count as holding nothing; a model none of whose prefills
	// publishes them, or a prompt no engine tokenized, is routed as
	// cache_aware routes it.
	PolicyPrecise Policy = "precise"
)

// Valid reports whether p is a known policy.
func (p Policy) Valid() bool {
	switch p {
	case PolicyRoundRobin, PolicyRandom, PolicyPowerOfTwo, PolicyCacheAware, PolicyLeastLoad, PolicyPrecise:
		return true
	}
	return false
}

// DefaultDecodeFirstByteTimeout is Config.DecodeFirstByteTimeout's default.
const DefaultDecodeFirstByteTimeout = 30 * time.Second

// DefaultPrefillTimeout is Config.PrefillTimeout's default: two minutes.
// A prefill answers once it computed the whole prompt (and, SGLang, sent
// its KV): a 128k-token prompt on a large model takes tens of seconds, so
// a long real prompt stays well inside it, while a wedged engine (it
// accepts and never answers) no longer holds a client for the ten minutes
// the old default allowed.
const DefaultPrefillTimeout = 2 * time.Minute

// Config configures a Router. The zero value is usable: WithDefaults fills
// in every unset field.
type Config struct {
	// Replica names this router in the stale reports it makes
	// ("router:<replica>" in the event log); the host name by default.
	Replica string

	// PrefillPolicy picks the prefill of a pair; cache_aware by default.
	PrefillPolicy Policy
	// DecodePolicy picks the decode among those compatible with the chosen
	// prefill; power_of_two by default.
	DecodePolicy Policy

	// APIKeys, when not empty, are the bearer tokens clients must present on
	// /v1/* and /generate. They are client keys, distinct from the control
	// plane's admin tokens, and are never forwarded to engines.
	APIKeys []string
	// UpstreamAPIKey, when set, is sent to engines as a bearer token.
	UpstreamAPIKey string

	// MaxBodyBytes bounds a request body; larger bodies get 413. 32 MiB by
	// default.
	MaxBodyBytes int64
	// RouteReceipt adds RouteReceiptHeader to every routed answer: the
	// pair that served it with both generations, and the attempts that
	// failed before it. The request's log line carries the same always.
	RouteReceipt bool
	// DisableTakeover keeps every stream on net/http's connection for its
	// whole life (takeover.go): a held stream then costs ~45 KiB instead
	// of ~19 (router/BENCHMARKS.md). For comparison and for platforms
	// where the takeover misbehaves.
	DisableTakeover bool
	// MaxInflight caps the generation requests this router serves at once;
	// 4096 by default. Over it, a request is answered 503 with Retry-After
	// before its body is read, and counted with outcome max_inflight.
	MaxInflight int
	// LogServedEvery says which served requests (outcome ok) get their
	// "request" line at info level: 0, none (they log at debug, so the
	// default info level shows only failures and refusals); 1, every one;
	// N, one in N, with sampled_1_in=N on the line. A request that was not
	// served is always logged. (On a loopback benchmark, every line at
	// info cost less than the noise: under 10 µs of ~200-300 µs a request.)
	LogServedEvery int
	// MaxResponseBytes bounds what the router buffers of an engine's answer
	// when it has to rewrite it (the logprob merge). 64 MiB by default.
	MaxResponseBytes int64

	// MaxAttempts bounds how many pairs one request may try before its first
	// byte reaches the client. 3 by default.
	MaxAttempts int
	// RetryBackoff is the base pause before the second attempt; it doubles
	// with every further attempt, up to RetryBackoffMax, with ±50 % jitter.
	// 5 ms and 100 ms by default.
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration

	// BreakerFailures is how many consecutive failures open a peer's or a
	// pair's circuit breaker; 5 by default. Overload answers (429, 503 with
	// Retry-After) do not count.
	BreakerFailures int
	// BreakerCooldown is how long an open breaker waits before it lets one
	// probe request through (half-open); 5 s by default.
	BreakerCooldown time.Duration

	// ConnectTimeout bounds dialling an engine; 3 s by default.
	ConnectTimeout time.Duration
	// PrefillTimeout bounds the whole prefill leg, from dispatch to the end of
	// its answer (DefaultPrefillTimeout). Past it the attempt fails as the
	// prefill's timeout (its breaker counts it) and the request moves to
	// another pair. The decode leg is bounded only by its first byte
	// (DecodeFirstByteTimeout) and the client, since a long generation is
	// legitimate.
	PrefillTimeout time.Duration
	// DecodeFirstByteTimeout bounds how long a streamed decode may send
	// nothing once its prefill answered in full (SGLang) or once it was
	// sent its prefill's kv_transfer_params (vLLM): SGLang's decode waits
	// out its own SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s) when the KV
	// never comes. Past it both legs are cancelled and the pair takes a
	// breaker failure; the request moves to another pair. 30 s by default.
	// A non-streamed answer's first byte is its last, so only the client
	// bounds it.
	DecodeFirstByteTimeout time.Duration
	// MaxIdleConnsPerHost is the idle keep-alive pool per engine; 512 by
	// default, because every request opens two upstream legs.
	MaxIdleConnsPerHost int
	// TracerProvider, when set, traces every routed request: a server span
	// (continuing the client's traceparent), a span per attempt on a pair
	// and one per leg, whose W3C trace context goes to the engines. Nil
	// (the default) turns tracing off at no cost on the request path; the
	// client's traceparent is then passed to the engines unchanged.
	TracerProvider trace.TracerProvider
	// Transport, when set, replaces the router's own tuned transport (tests).
	Transport http.RoundTripper

	// CacheAwarePrefixBytes is how many leading bytes of the prompt (the raw
	// JSON of messages, prompt, text or input_ids) the cache_aware policy
	// hashes; 512 by default.
	CacheAwarePrefixBytes int
	// CacheAwareBalanceAbs and CacheAwareBalanceRel decide when the favoured
	// peer is busy: when its in-flight count exceeds the alternative's by
	// more than Abs and by a factor of more than Rel. 8 and 1.5 by default.
	CacheAwareBalanceAbs int
	CacheAwareBalanceRel float64
	// CacheAwareVirtualNodes is how many points each peer takes on the hash
	// ring; 32 by default.
	CacheAwareVirtualNodes int
	// KVIndexMaxBlocks caps the blocks the precise policy's index keeps for
	// one engine, whatever its events say; 1<<20 by default (16 M tokens
	// of 16-token blocks).
	KVIndexMaxBlocks int

	// ReportTimeout bounds each call to the PeerReporter; 5 s by default.
	ReportTimeout time.Duration
	// ExchangeReportInterval is how often the pairs served are sent to a
	// PeerReporter that is an ExchangeReporter; 1 s by default (one
	// statement a second per replica), so that an agent that finds its
	// decode recomputing can tell whose KV it was; negative for never.
	ExchangeReportInterval time.Duration

	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// WithDefaults returns a copy of c with every unset field filled in.
func (c Config) WithDefaults() Config {
	if c.Replica == "" {
		c.Replica, _ = os.Hostname()
		c.Replica = cmp.Or(c.Replica, "unnamed")
	}
	c.PrefillPolicy = cmp.Or(c.PrefillPolicy, PolicyCacheAware)
	c.DecodePolicy = cmp.Or(c.DecodePolicy, PolicyPowerOfTwo)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, 32<<20)
	c.MaxInflight = cmp.Or(c.MaxInflight, 4096)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, 64<<20)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 3)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, 5*time.Millisecond)
	c.RetryBackoffMax = cmp.Or(c.RetryBackoffMax, 100*time.Millisecond)
	c.BreakerFailures = cmp.Or(c.BreakerFailures, 5)
	c.BreakerCooldown = cmp.Or(c.BreakerCooldown, 5*time.Second)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, 3*time.Second)
	c.PrefillTimeout = cmp.Or(c.PrefillTimeout, DefaultPrefillTimeout)
	c.DecodeFirstByteTimeout = cmp.Or(c.DecodeFirstByteTimeout, DefaultDecodeFirstByteTimeout)
	c.MaxIdleConnsPerHost = cmp.Or(c.MaxIdleConnsPerHost, 512)
	c.CacheAwarePrefixBytes = cmp.Or(c.CacheAwarePrefixBytes, 512)
	c.CacheAwareBalanceAbs = cmp.Or(c.CacheAwareBalanceAbs, 8)
	c.CacheAwareBalanceRel = cmp.Or(c.CacheAwareBalanceRel, 1.5)
	c.CacheAwareVirtualNodes = cmp.Or(c.CacheAwareVirtualNodes, 32)
	c.KVIndexMaxBlocks = cmp.Or(c.KVIndexMaxBlocks, 1<<20)
	c.ReportTimeout = cmp.Or(c.ReportTimeout, 5*time.Second)
	c.ExchangeReportInterval = cmp.Or(c.ExchangeReportInterval, time.Second)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate names the first field of a defaulted config that is wrong.
func (c *Config) validate() error {
	err := cmp.Or(
		validPolicy("PrefillPolicy", c.PrefillPolicy),
		validPolicy("DecodePolicy", c.DecodePolicy),
		notPrecise("DecodePolicy", c.DecodePolicy),
		notNegative("MaxBodyBytes", c.MaxBodyBytes),
		atLeast("MaxInflight", c.MaxInflight, 1),
		notNegative("MaxResponseBytes", c.MaxResponseBytes),
		notNegative("LogServedEvery", c.LogServedEvery),
		atLeast("MaxAttempts", c.MaxAttempts, 1),
		notNegative("RetryBackoff", c.RetryBackoff),
		notNegative("RetryBackoffMax", c.RetryBackoffMax),
		atLeast("BreakerFailures", c.BreakerFailures, 1),
		notNegative("BreakerCooldown", c.BreakerCooldown),
		notNegative("ConnectTimeout", c.ConnectTimeout),
		notNegative("PrefillTimeout", c.PrefillTimeout),
		notNegative("DecodeFirstByteTimeout", c.DecodeFirstByteTimeout),
		notNegative("MaxIdleConnsPerHost", c.MaxIdleConnsPerHost),
		notNegative("CacheAwarePrefixBytes", c.CacheAwarePrefixBytes),
		notNegative("CacheAwareBalanceAbs", c.CacheAwareBalanceAbs),
		atLeast("CacheAwareBalanceRel", c.CacheAwareBalanceRel, 1),
		atLeast("CacheAwareVirtualNodes", c.CacheAwareVirtualNodes, 1),
		atMost("CacheAwareVirtualNodes", c.CacheAwareVirtualNodes, 1024),
		atLeast("KVIndexMaxBlocks", c.KVIndexMaxBlocks, 1),
	)
	if err != nil {
		return err
	}
	for i, k := range c.APIKeys {
		if k == "" {
			return fmt.Errorf("APIKeys[%d]: empty key", i)
		}
	}
	return nil
}

// notPrecise refuses precise for a role that has no KV events to match.
func notPrecise(field string, p Policy) error {
	if p == PolicyPrecise {
		return fmt.Errorf("%s: precise picks prefills by the blocks they hold; decodes are picked by load", field)
	}
	return nil
}

func validPolicy(field string, p Policy) error {
	if p.Valid() {
		return nil
	}
	return fmt.Errorf("%s: unknown policy %q (want round_robin, random, power_of_two, least_load, cache_aware or precise)", field, p)
}

func atLeast[T cmp.Ordered](field string, v, least T) error {
	if v < least {
		return fmt.Errorf("%s: must be at least %v, got %v", field, least, v)
	}
	return nil
}

func atMost[T cmp.Ordered](field string, v, most T) error {
	if v > most {
		return fmt.Errorf("%s: must be at most %v, got %v", field, most, v)
	}
	return nil
}

func notNegative[T cmp.Ordered](field string, v T) error {
	var zero T
	if v < zero {
		return fmt.Errorf("%s: must not be negative, got %v", field, v)
	}
	return nil
}
