package sim

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// Transfer backends a simulator can move KV pages with.
const (
	// TransferTCP is the pure-Go backend (transfer/tcp); the default.
	TransferTCP = "tcp"
	// TransferNIXL is the purego NIXL binding (transfer/nixl); it needs
	// libnixl_capi.so (see $PDPLANE_NIXL_LIB).
	TransferNIXL = "nixl"
)

// FakeBootstrapHost is the bootstrap host that makes an SGLang decode fake
// the KV transfer: it generates without a prefill, as SGLang does for
// decode-only health probes.
const FakeBootstrapHost = "2.2.2.2"

// Config configures a Sim. Durations of zero mean "no pause" for the
// per-token times and the default for the timeouts.
type Config struct {
	// Name names the engine; agent names and the registration derive from
	// it. Required.
	Name string
	// Role is registry.RolePrefill or registry.RoleDecode. Required.
	Role registry.Role
	// Engine is the protocol the simulator speaks: registry.EngineSGLang
	// (the default) or registry.EngineVLLM.
	Engine registry.Engine
	// Model is the served model name; default "sim-model".
	Model string
	// Addr is the HTTP listen address; default "127.0.0.1:0".
	Addr string
	// AdvertiseHost is the host put in URLs others reach this engine at
	// (the registration's url, vLLM's remote_host); default the host of
	// the HTTP listener.
	AdvertiseHost string
	// BootstrapPort is where a prefill serves its bootstrap server: SGLang's
	// disaggregation bootstrap (decodes post their KV destinations there)
	// and vLLM's NIXL side channel (decodes fetch the prefill's agent
	// metadata there). 0 picks a free port. Decodes run no bootstrap
	// server.
	BootstrapPort int
	// Transfer is the KV transfer backend: TransferTCP (default) or
	// TransferNIXL.
	Transfer string
	// TransferAddr is where the TCP backend listens; default "127.0.0.1:0".
	TransferAddr string
	// UCXTLS restricts UCX's transports for the NIXL backend (e.g. "tcp"
	// on a CPU-only host); empty lets UCX choose.
	UCXTLS string

	// PageSize is the number of tokens per KV page; default 16.
	PageSize int
	// NumLayers is the number of model layers; default 4. The pool has one
	// K region and one V region per layer.
	NumLayers int
	// NumKVHeads is the number of KV heads; default 2.
	NumKVHeads int
	// HeadDim is the size of one head; default 64.
	HeadDim int
	// DType is the KV dtype: "bfloat16" (default), "float16", "float32" or
	// "fp8_e4m3".
	DType string
	// Pages is the number of pages in the KV pool, and the number of
	// blocks a prefill's prefix cache holds; default 512.
	Pages int
	// PrefixCachePages, when set, holds the prefix cache to fewer blocks
	// than the pool's pages: a cache under pressure (a working set far
	// above it) while the pool still fits the requests in flight, where an
	// engine would make them wait for pages and the simulator fails them.
	PrefixCachePages int
	// CheapTransfer keeps the PD protocol (bootstrap, rooms, the transfer
	// with its notification, the per-token times) but computes no KV,
	// verifies none and moves one page per request instead of the
	// prompt's: for load tests where the engines must not be the
	// bottleneck. Transfers still fail as they would (a missing memory
	// kind, an unknown agent); a corrupt-kv fault goes unnoticed.
	CheapTransfer bool

	// PrefillTimePerToken is how long a prefill "computes" per prompt
	// token it does not find in its prefix cache.
	PrefillTimePerToken time.Duration
	// PrefillSlots is how many prompts the engine computes at once; those
	// that come on top wait their turn, first come first served, and count
	// as queued in Load. 0: no limit, every prompt computes as it comes.
	PrefillSlots int
	// DecodeTimePerToken is the pause before each generated token, but an
	// SGLang decode's first: that one is the prefill's, carried with the
	// KV, and leaves as soon as the KV is in (Sim.tokenPause).
	DecodeTimePerToken time.Duration
	// MaxTokensDefault is the number of tokens generated when a request
	// sets no limit; default 16.
	MaxTokensDefault int
	// MaxTokensLimit caps max_tokens; default 4096.
	MaxTokensLimit int

	// RoomTimeout bounds how long a room (SGLang) or a set of held blocks
	// (vLLM) waits for its counterpart before its pages are freed;
	// default 30s.
	RoomTimeout time.Duration
	// TransferTimeout bounds one KV transfer; default 30s.
	TransferTimeout time.Duration
	// NotifPollInterval is how often the notification poller drains the
	// backend while rooms wait; default 200µs.
	NotifPollInterval time.Duration

	// TransferGroup and Labels are copied into the registration.
	TransferGroup string
	Labels        map[string]string

	// OnTransferError, if set, is called when a KV transfer fails: by an
	// SGLang prefill for every failed transfer to a decode agent that is
	// still its endpoint's latest (peerID is "": SGLang's bootstrap plane
	// names the decode's NIXL agent, not its peer, so the wiring finds the
	// peer by agentName), and by a vLLM decode with its own peer ID (see
	// SetPeerID) and agent when its read-side preparation raises
	// *transfer.MissingMemKindError. It is not called for cancellations.
	// Classify err with errors.As. The wiring turns it into
	// agent.ReportFor and sends that to agent.ReportTransferFailure. It runs
	// on the request's goroutine, so it must not block for long.
	OnTransferError func(peerID, agentName string, err error)
	// TransferSecrets returns the transfer secret of agent from the control
	// plane (the wiring asks the agent, which holds a credential). peerID
	// is the agent's peer when the engine protocol names it (a vLLM side
	// channel) and "" when it does not (SGLang): the wiring then finds the
	// peer by the agent's name. With it, each generation of the TCP
	// transfer agent draws a random secret, registered with the peer
	// (Spec).
	TransferSecrets func(ctx context.Context, peerID, agent string) ([]byte, error)
	// SharedTransferSecret, when TransferSecrets is nil, is the secret of
	// this engine's TCP agents and of every remote one: sims started
	// together without a control plane (tests). With neither, the TCP
	// agent's secret is random and known to nobody, so no other engine can
	// transfer with this one.
	SharedTransferSecret []byte
	// KVEventsAddr is where a prefill publishes its prefix cache's KV
	// events on a ZeroMQ PUB socket, as vLLM's --kv-events-config endpoint
	// does (host:port; "127.0.0.1:0" picks a port); "" publishes none.
	// See kv_events.go.
	KVEventsAddr string
	// KVEventsReplayAddr is where the prefill's ROUTER replay socket
	// listens (vLLM's replay_endpoint); "" serves no replay. It needs
	// KVEventsAddr.
	KVEventsReplayAddr string
	// KVEventsTopic is the topic the events go out under (vLLM's topic;
	// default "").
	KVEventsTopic string

	// LogRequests keeps every generation request received (path, headers,
	// body) for Received, as an engine's request log would show them.
	LogRequests bool
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Defaults.
const (
	DefaultModel             = "sim-model"
	DefaultPageSize          = 16
	DefaultNumLayers         = 4
	DefaultNumKVHeads        = 2
	DefaultHeadDim           = 64
	DefaultDType             = "bfloat16"
	DefaultPages             = 512
	DefaultMaxTokens         = 16
	DefaultMaxTokensLimit    = 4096
	DefaultRoomTimeout       = 30 * time.Second
	DefaultTransferTimeout   = 30 * time.Second
	DefaultNotifPollInterval = 200 * time.Microsecond
)

// WithDefaults returns the config with unset fields filled in.
func (c Config) WithDefaults() Config {
	c.Engine = cmp.Or(c.Engine, registry.EngineSGLang)
	c.Model = cmp.Or(c.Model, DefaultModel)
	c.Addr = cmp.Or(c.Addr, "127.0.0.1:0")
	c.Transfer = cmp.Or(c.Transfer, TransferTCP)
	c.TransferAddr = cmp.Or(c.TransferAddr, "127.0.0.1:0")
	c.PageSize = cmp.Or(c.PageSize, DefaultPageSize)
	c.NumLayers = cmp.Or(c.NumLayers, DefaultNumLayers)
	c.NumKVHeads = cmp.Or(c.NumKVHeads, DefaultNumKVHeads)
	c.HeadDim = cmp.Or(c.HeadDim, DefaultHeadDim)
	c.DType = cmp.Or(c.DType, DefaultDType)
	c.Pages = cmp.Or(c.Pages, DefaultPages)
	c.MaxTokensDefault = cmp.Or(c.MaxTokensDefault, DefaultMaxTokens)
	c.MaxTokensLimit = cmp.Or(c.MaxTokensLimit, DefaultMaxTokensLimit)
	c.RoomTimeout = cmp.Or(c.RoomTimeout, DefaultRoomTimeout)
	c.TransferTimeout = cmp.Or(c.TransferTimeout, DefaultTransferTimeout)
	c.NotifPollInterval = cmp.Or(c.NotifPollInterval, DefaultNotifPollInterval)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// dtypeBytes is the size of one element of a supported KV dtype, 0 for
// others.
func dtypeBytes(dtype string) int {
	switch dtype {
	case "bfloat16", "float16":
		return 2
	case "float32":
		return 4
	case "fp8_e4m3":
		return 1
	}
	return 0
}

// maxPoolBytes bounds the KV pool a simulator maps (16 GiB).
const maxPoolBytes = 16 << 30

// validate names the first wrong field.
func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("sim config: %s: %s", field, fmt.Sprintf(format, args...))
	}
	if n := len(c.SharedTransferSecret); n != 0 && (n < registry.MinTransferSecret || n > registry.MaxTransferSecret) {
		return bad("shared_transfer_secret", "must be %d to %d bytes, got %d", registry.MinTransferSecret, registry.MaxTransferSecret, n)
	}
	switch {
	case c.Name == "":
		return bad("name", "is required")
	case len(c.Name) > 200:
		return bad("name", "longer than 200 bytes")
	case c.Role != registry.RolePrefill && c.Role != registry.RoleDecode:
		return bad("role", "must be prefill or decode, got %q", c.Role)
	case c.Engine != registry.EngineSGLang && c.Engine != registry.EngineVLLM:
		return bad("engine", "must be sglang or vllm, got %q", c.Engine)
	case c.Transfer != TransferTCP && c.Transfer != TransferNIXL:
		return bad("transfer", "must be tcp or nixl, got %q", c.Transfer)
	case c.BootstrapPort < 0 || c.BootstrapPort > 65535:
		return bad("bootstrap_port", "must be in [0, 65535], got %d", c.BootstrapPort)
	case c.PageSize < 1:
		return bad("page_size", "must be at least 1, got %d", c.PageSize)
	case c.NumLayers < 1:
		return bad("num_layers", "must be at least 1, got %d", c.NumLayers)
	case c.NumKVHeads < 1:
		return bad("num_kv_heads", "must be at least 1, got %d", c.NumKVHeads)
	case c.HeadDim < 1:
		return bad("head_dim", "must be at least 1, got %d", c.HeadDim)
	case dtypeBytes(c.DType) == 0:
		return bad("dtype", "must be bfloat16, float16, float32 or fp8_e4m3, got %q", c.DType)
	case c.Pages < 1:
		return bad("pages", "must be at least 1, got %d", c.Pages)
	case c.PrefixCachePages < 0 || c.PrefixCachePages > c.Pages:
		return bad("prefix_cache_pages", "must be 0 (all the pool's pages) to pages (%d), got %d", c.Pages, c.PrefixCachePages)
	case c.PrefillTimePerToken < 0:
		return bad("prefill_time_per_token", "must not be negative")
	case c.PrefillSlots < 0:
		return bad("prefill_slots", "must not be negative, got %d", c.PrefillSlots)
	case c.KVEventsReplayAddr != "" && c.KVEventsAddr == "":
		return bad("kv_events_replay_addr", "needs kv_events_addr: a replay socket replays what the PUB socket published")
	case c.KVEventsAddr != "" && c.Role != registry.RolePrefill:
		return bad("kv_events_addr", "only a prefill keeps a prefix cache to publish")
	case len(c.KVEventsTopic) > maxKVEventsTopic:
		return bad("kv_events_topic", "longer than %d bytes", maxKVEventsTopic)
	case c.DecodeTimePerToken < 0:
		return bad("decode_time_per_token", "must not be negative")
	case c.MaxTokensDefault < 1:
		return bad("max_tokens_default", "must be at least 1, got %d", c.MaxTokensDefault)
	case c.MaxTokensLimit < c.MaxTokensDefault:
		return bad("max_tokens_limit", "must be at least max_tokens_default=%d, got %d", c.MaxTokensDefault, c.MaxTokensLimit)
	case c.RoomTimeout < 0:
		return bad("room_timeout", "must not be negative")
	case c.TransferTimeout < 0:
		return bad("transfer_timeout", "must not be negative")
	case c.NotifPollInterval < 0:
		return bad("notif_poll_interval", "must not be negative")
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return bad("addr", "%v", err)
	}
	for _, a := range []struct{ field, addr string }{{"kv_events_addr", c.KVEventsAddr}, {"kv_events_replay_addr", c.KVEventsReplayAddr}} {
		if a.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return bad(a.field, "%v", err)
		}
	}
	if !c.poolFits() {
		return bad("pages", "a pool of %d pages of %d tokens in %d layers' K and V, %d heads of %d %s values a token, exceeds %d bytes",
			c.Pages, c.PageSize, c.NumLayers, c.NumKVHeads, c.HeadDim, c.DType, maxPoolBytes)
	}
	return nil
}

// poolFits reports whether the pool's bytes stay within maxPoolBytes,
// checked factor by factor so that no product of the geometry overflows
// (the sizes below are computed only once it fits).
func (c Config) poolFits() bool {
	n := int64(1)
	for _, f := range []int{2, c.NumLayers, c.Pages, c.PageSize, c.NumKVHeads, c.HeadDim, dtypeBytes(c.DType)} {
		if n > maxPoolBytes/int64(f) {
			return false
		}
		n *= int64(f)
	}
	return true
}

// slotLen is the bytes of one token's K (or V) in one layer.
func (c Config) slotLen() int { return c.NumKVHeads * c.HeadDim * dtypeBytes(c.DType) }

// itemLen is the bytes of one page in one region.
func (c Config) itemLen() int { return c.PageSize * c.slotLen() }

// regions is the number of KV regions: K then V, one per layer.
func (c Config) regions() int { return 2 * c.NumLayers }

func (c Config) poolBytes() int64 {
	return int64(c.regions()) * int64(c.Pages) * int64(c.itemLen())
}
