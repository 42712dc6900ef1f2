package router

import (
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
)

// Valid reports whether p is a known policy.
func (p Policy) Valid() bool {
	switch p {
	case PolicyRoundRobin, PolicyRandom, PolicyPowerOfTwo, PolicyCacheAware, PolicyLeastLoad:
		return true
	}
	return false
}

// DefaultDecodeFirstByteTimeout is Config.DecodeFirstByteTimeout's default.
const DefaultDecodeFirstByteTimeout = 30 * time.Second

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
	// MaxInflight caps the generation requests this router serves at once;
	// 4096 by default. Over it, a request is answered 503 with Retry-After
	// before its body is read, and counted with outcome max_inflight.
	MaxInflight int
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
	// its answer; 10 min by default. The decode leg is bounded only by the
	// client, since a long generation is legitimate.
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

	// ReportTimeout bounds each call to the PeerReporter; 5 s by default.
	ReportTimeout time.Duration

	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// WithDefaults returns a copy of c with every unset field filled in.
func (c Config) WithDefaults() Config {
	if c.Replica == "" {
		c.Replica, _ = os.Hostname()
		if c.Replica == "" {
			c.Replica = "unnamed"
		}
	}
	if c.PrefillPolicy == "" {
		c.PrefillPolicy = PolicyCacheAware
	}
	if c.DecodePolicy == "" {
		c.DecodePolicy = PolicyPowerOfTwo
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 32 << 20
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = 4096
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = 64 << 20
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 3
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = 5 * time.Millisecond
	}
	if c.RetryBackoffMax == 0 {
		c.RetryBackoffMax = 100 * time.Millisecond
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = 5
	}
	if c.BreakerCooldown == 0 {
		c.BreakerCooldown = 5 * time.Second
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 3 * time.Second
	}
	if c.PrefillTimeout == 0 {
		c.PrefillTimeout = 10 * time.Minute
	}
	if c.DecodeFirstByteTimeout == 0 {
		c.DecodeFirstByteTimeout = DefaultDecodeFirstByteTimeout
	}
	if c.MaxIdleConnsPerHost == 0 {
		c.MaxIdleConnsPerHost = 512
	}
	if c.CacheAwarePrefixBytes == 0 {
		c.CacheAwarePrefixBytes = 512
	}
	if c.CacheAwareBalanceAbs == 0 {
		c.CacheAwareBalanceAbs = 8
	}
	if c.CacheAwareBalanceRel == 0 {
		c.CacheAwareBalanceRel = 1.5
	}
	if c.CacheAwareVirtualNodes == 0 {
		c.CacheAwareVirtualNodes = 32
	}
	if c.ReportTimeout == 0 {
		c.ReportTimeout = 5 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate names the first field of a defaulted config that is wrong.
func (c *Config) validate() error {
	switch {
	case !c.PrefillPolicy.Valid():
		return fmt.Errorf("PrefillPolicy: unknown policy %q (want round_robin, random, power_of_two, least_load or cache_aware)", c.PrefillPolicy)
	case !c.DecodePolicy.Valid():
		return fmt.Errorf("DecodePolicy: unknown policy %q (want round_robin, random, power_of_two, least_load or cache_aware)", c.DecodePolicy)
	case c.MaxBodyBytes < 0:
		return fmt.Errorf("MaxBodyBytes: must be positive, got %d", c.MaxBodyBytes)
	case c.MaxInflight < 1:
		return fmt.Errorf("MaxInflight: must be at least 1, got %d", c.MaxInflight)
	case c.MaxResponseBytes < 0:
		return fmt.Errorf("MaxResponseBytes: must be positive, got %d", c.MaxResponseBytes)
	case c.MaxAttempts < 1:
		return fmt.Errorf("MaxAttempts: must be at least 1, got %d", c.MaxAttempts)
	case c.RetryBackoff < 0 || c.RetryBackoffMax < 0:
		return fmt.Errorf("RetryBackoff: must not be negative")
	case c.BreakerFailures < 1:
		return fmt.Errorf("BreakerFailures: must be at least 1, got %d", c.BreakerFailures)
	case c.BreakerCooldown < 0:
		return fmt.Errorf("BreakerCooldown: must not be negative")
	case c.ConnectTimeout < 0 || c.PrefillTimeout < 0:
		return fmt.Errorf("ConnectTimeout, PrefillTimeout: must not be negative")
	case c.DecodeFirstByteTimeout < 0:
		return fmt.Errorf("DecodeFirstByteTimeout: must not be negative, got %s", c.DecodeFirstByteTimeout)
	case c.MaxIdleConnsPerHost < 0:
		return fmt.Errorf("MaxIdleConnsPerHost: must not be negative")
	case c.CacheAwarePrefixBytes < 0:
		return fmt.Errorf("CacheAwarePrefixBytes: must not be negative")
	case c.CacheAwareBalanceAbs < 0 || c.CacheAwareBalanceRel < 1:
		return fmt.Errorf("CacheAwareBalanceAbs, CacheAwareBalanceRel: want >= 0 and >= 1, got %d and %g", c.CacheAwareBalanceAbs, c.CacheAwareBalanceRel)
	case c.CacheAwareVirtualNodes < 1 || c.CacheAwareVirtualNodes > 1024:
		return fmt.Errorf("CacheAwareVirtualNodes: want 1..1024, got %d", c.CacheAwareVirtualNodes)
	}
	for i, k := range c.APIKeys {
		if k == "" {
			return fmt.Errorf("APIKeys[%d]: empty key", i)
		}
	}
	return nil
}
