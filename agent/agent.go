// Package agent is pdplane's host agent: it registers the local engine's
// ranks with the control plane, heartbeats, reports transfer errors, and
// carries out re-registration when the control plane asks for it. It talks to
// the control plane only through the generated client (server/api) and keeps
// the engine serving while the control plane is unreachable.
package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/transfer"
)

// Engine is what the agent needs from the engine it represents.
type Engine interface {
	// Spec describes the engine as it is now: identity, geometry, NIXL
	// agent names and metadata of every rank.
	Spec(ctx context.Context) (registry.PeerSpec, error)
	// Reregister gives every rank a fresh NIXL agent (a new name, memory
	// registered again, new metadata), so that the next Spec starts a new
	// generation. SGLang ignores a re-registration under an old name.
	Reregister(ctx context.Context, reason string) error
}

// restartWatcher is an Engine that can tell that its process restarted
// since the instance the agent registered (PublishedEngine: a stock engine
// does not re-register itself); the agent then registers the new instance,
// which starts a new generation.
type restartWatcher interface {
	Restarted(ctx context.Context, registeredInstance string) bool
}

// Config configures an Agent.
type Config struct {
	// ControlPlane is the base URL of `pdplane serve`, or the URLs of
	// several replicas separated by commas, in order of preference (see
	// ParseControlPlanes). The agent fails over between them.
	ControlPlane string
	// Token is the peer (or admin) bearer token, if the control plane has one.
	Token      string
	HTTPClient *http.Client
	// MinBackoff and MaxBackoff bound the retry delay while the control
	// plane is unreachable.
	MinBackoff, MaxBackoff time.Duration
	// FailbackMin and FailbackMax bound how long a control-plane replica
	// that refused a connection or answered 5xx is passed over before the
	// agent tries it again (doubling while it keeps failing): how soon the
	// agent returns to the replica it prefers.
	FailbackMin, FailbackMax time.Duration
	// LookupHost resolves a control-plane URL's host name; a name with
	// several addresses counts as several replicas. The system resolver
	// when nil.
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// OnRegistered, if set, is called after every successful registration.
	OnRegistered func(api.Peer)
	// Probe configures the probes of the engine at the registered peer's
	// URL, whose verdict and load every heartbeat carries.
	Probe ProbeConfig
}

// WithDefaults fills in unset fields.
func (c Config) WithDefaults() Config {
	if c.HTTPClient == nil {
		// A short dial timeout: a replica whose host is gone must not hold
		// a heartbeat for long when another replica could take it. Go's
		// dialer tries every address a name resolves to in turn.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		c.HTTPClient = &http.Client{Timeout: 10 * time.Second, Transport: tr}
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.FailbackMin == 0 {
		c.FailbackMin = time.Second
	}
	if c.FailbackMax == 0 {
		c.FailbackMax = 30 * time.Second
	}
	if c.LookupHost == nil {
		c.LookupHost = net.DefaultResolver.LookupHost
	}
	return c
}

func (c Config) validate() error {
	if _, err := ParseControlPlanes(c.ControlPlane); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if c.MinBackoff > c.MaxBackoff {
		return fmt.Errorf("agent: min backoff %s exceeds max backoff %s", c.MinBackoff, c.MaxBackoff)
	}
	if c.FailbackMin <= 0 || c.FailbackMin > c.FailbackMax {
		return fmt.Errorf("agent: failback min %s must be positive and at most failback max %s", c.FailbackMin, c.FailbackMax)
	}
	return nil
}

// RefusedError is the control plane refusing the agent for good (a 4xx other
// than 404): a geometry it will not accept, or a wrong token. Retrying would
// not help.
type RefusedError struct {
	Status  int
	Problem api.Problem
}

func (e *RefusedError) Error() string {
	field := ""
	if e.Problem.Field != nil {
		field = " (field " + *e.Problem.Field + ")"
	}
	return fmt.Sprintf("control plane refused the peer: %d %s: %s%s", e.Status, e.Problem.Title, e.Problem.Detail, field)
}

// errPeerGone means the control plane no longer knows the peer (it was
// removed, or the embedded store restarted): register again.
var errPeerGone = errors.New("control plane does not know the peer")

// Agent registers one engine and keeps it registered.
type Agent struct {
	cfg Config
	eng Engine
	cps *controlPlanes
	log zerolog.Logger

	probe *EngineProbe // nil when probing is disabled

	mu       sync.Mutex
	peer     api.Peer
	interval time.Duration
	leaseTTL time.Duration // from the last registration; 0 before
}

// New returns an agent for eng.
func New(cfg Config, eng Engine, log zerolog.Logger) (*Agent, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var opts []api.ClientOption
	if cfg.Token != "" {
		opts = append(opts, api.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+cfg.Token)
			return nil
		}))
	}
	cps, err := newControlPlanes(cfg, opts, log)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a := &Agent{cfg: cfg, eng: eng, cps: cps, log: log, interval: registry.DefaultHeartbeatInterval}
	if !cfg.Probe.Disabled {
		if a.probe, err = NewEngineProbe(cfg.Probe, log.With().Str("component", "engine_probe").Logger()); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// ControlPlane names the control-plane replica that answered the agent
// last: its URL, followed by the address in parentheses when the URL's name
// resolves to several; empty before any answered.
func (a *Agent) ControlPlane() string { return a.cps.current() }

// Peer returns the peer as last registered (zero before the first
// registration).
func (a *Agent) Peer() api.Peer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peer
}

// Register registers the engine once. A refusal is a *RefusedError.
func (a *Agent) Register(ctx context.Context) (api.Peer, error) {
	spec, err := a.eng.Spec(ctx)
	if err != nil {
		return api.Peer{}, fmt.Errorf("describe engine: %w", err)
	}
	// registry.PeerSpec marshals to exactly the registration body.
	body, err := json.Marshal(spec)
	if err != nil {
		return api.Peer{}, fmt.Errorf("encode registration: %w", err)
	}
	var resp *api.RegisterPeerResponse
	err = a.cps.call(ctx, "register "+spec.Name, func(c *api.ClientWithResponses) (*http.Response, error) {
		var err error
		resp, err = c.RegisterPeerWithBodyWithResponse(ctx, "application/json", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		return resp.HTTPResponse, nil
	})
	if err != nil {
		return api.Peer{}, err
	}
	p := resp.JSON201
	if p == nil {
		p = resp.JSON200
	}
	if p == nil {
		return api.Peer{}, refusal(resp.HTTPResponse, resp.Body)
	}
	a.mu.Lock()
	a.peer = *p
	if p.HeartbeatIntervalSeconds > 0 {
		a.interval = time.Duration(p.HeartbeatIntervalSeconds * float64(time.Second))
	}
	a.leaseTTL = time.Duration(p.LeaseTtlSeconds * float64(time.Second))
	a.mu.Unlock()
	a.log.Info().Str("peer", p.Name).Str("id", p.Id).Int64("generation", p.Generation).Str("state", string(p.State)).Msg("registered")
	if a.cfg.OnRegistered != nil {
		a.cfg.OnRegistered(*p)
	}
	return *p, nil
}

// refusal turns a non-2xx answer into an error: *RefusedError for 4xx
// (except 404, which is errPeerGone), a plain error for 5xx.
func refusal(resp *http.Response, body []byte) error {
	if resp.StatusCode == http.StatusNotFound {
		return errPeerGone
	}
	var p api.Problem
	_ = json.Unmarshal(body, &p)
	if p.Detail == "" {
		p.Detail = string(bytes.TrimSpace(body))
	}
	if resp.StatusCode >= 400 && resp.StatusCode < 500 {
		return &RefusedError{Status: resp.StatusCode, Problem: p}
	}
	return fmt.Errorf("control plane answered %d: %s", resp.StatusCode, p.Detail)
}

// Run registers the engine (retrying while the control plane is
// unreachable), then heartbeats until ctx ends. It re-registers when the
// control plane asks (with fresh NIXL agents from the engine) or has
// forgotten the peer. It returns only when ctx ends or on a *RefusedError.
func (a *Agent) Run(ctx context.Context) error {
	if a.probe != nil {
		// The probes watch whatever engine the agent last registered; a
		// failed probe never stops the heartbeats (the agent is alive).
		go a.probe.Run(ctx, func() ProbeTarget {
			a.mu.Lock()
			defer a.mu.Unlock()
			return ProbeTarget{URL: a.peer.Url, Engine: registry.Engine(a.peer.Engine), Interval: a.interval}
		})
	}
	if err := a.registerRetrying(ctx); err != nil {
		return err
	}
	backoff := a.cfg.MinBackoff
	for {
		a.mu.Lock()
		wait := a.interval
		a.mu.Unlock()
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
		if w, ok := a.eng.(restartWatcher); ok && w.Restarted(ctx, a.Peer().InstanceId) {
			a.log.Info().Msg("engine restarted; registering the new instance")
			if err := a.registerRetrying(ctx); err != nil {
				return err
			}
			continue
		}
		reply, err := a.heartbeat(ctx)
		var refused *RefusedError
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &refused):
			return err
		case errors.Is(err, errPeerGone):
			a.log.Warn().Msg("control plane forgot the peer; registering again")
			if err := a.registerRetrying(ctx); err != nil {
				return err
			}
		case err != nil:
			backoff = min(backoff, a.maxHeartbeatBackoff())
			a.log.Warn().Err(err).Dur("retry_in", backoff).Msg("heartbeat failed; the engine keeps serving")
			if !sleep(ctx, jitter(backoff)) {
				return ctx.Err()
			}
			backoff = min(backoff*2, a.cfg.MaxBackoff)
		case reply.Action == api.Reregister:
			backoff = a.cfg.MinBackoff
			reason := deref(reply.Reason)
			a.log.Warn().Str("reason", reason).Msg("control plane asks to re-register; creating fresh NIXL agents")
			if err := a.eng.Reregister(ctx, reason); err != nil {
				a.log.Error().Err(err).Msg("re-register engine memory")
				continue
			}
			if err := a.registerRetrying(ctx); err != nil {
				return err
			}
		default:
			backoff = a.cfg.MinBackoff
		}
	}
}

// maxHeartbeatBackoff caps the pause between failed heartbeats at a
// quarter of the lease: when the control plane comes back from an outage it
// grants every lease one TTL (see registry.LeaseSweeper), and an agent that
// backed off for longer than that would lose a lease it could have kept.
func (a *Agent) maxHeartbeatBackoff() time.Duration {
	a.mu.Lock()
	ttl := a.leaseTTL
	a.mu.Unlock()
	if ttl <= 0 {
		return a.cfg.MaxBackoff
	}
	return min(a.cfg.MaxBackoff, ttl/4)
}

func (a *Agent) registerRetrying(ctx context.Context) error {
	backoff := a.cfg.MinBackoff
	for {
		_, err := a.Register(ctx)
		var refused *RefusedError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &refused):
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		}
		a.log.Warn().Err(err).Dur("retry_in", backoff).Msg("registration failed; retrying")
		if !sleep(ctx, jitter(backoff)) {
			return ctx.Err()
		}
		backoff = min(backoff*2, a.cfg.MaxBackoff)
	}
}

// Heartbeat sends one heartbeat now, with the probes' verdict on the
// engine and its load, and returns the control plane's answer.
func (a *Agent) heartbeat(ctx context.Context) (api.HeartbeatReply, error) {
	p := a.Peer()
	body := api.Heartbeat{InstanceId: p.InstanceId}
	if a.probe != nil {
		st := a.probe.Status()
		body.Load = &api.Load{Running: st.Load.Running, Queued: st.Load.Queued, KvUsage: st.Load.KVUsage}
		body.EngineHealthy = &st.Healthy
		if !st.Healthy {
			body.EngineError = &st.Error
		}
	}
	var resp *api.HeartbeatPeerResponse
	err := a.cps.call(ctx, "heartbeat", func(c *api.ClientWithResponses) (*http.Response, error) {
		var err error
		resp, err = c.HeartbeatPeerWithResponse(ctx, p.Id, body)
		if err != nil {
			return nil, err
		}
		return resp.HTTPResponse, nil
	})
	if err != nil {
		return api.HeartbeatReply{}, err
	}
	if resp.JSON200 == nil {
		return api.HeartbeatReply{}, refusal(resp.HTTPResponse, resp.Body)
	}
	return *resp.JSON200, nil
}

// EngineStatus is what the agent's probes know about its engine (the zero
// value, healthy, when probing is disabled).
func (a *Agent) EngineStatus() EngineStatus {
	if a.probe == nil {
		return EngineStatus{Healthy: true}
	}
	return a.probe.Status()
}

// TransferReport is a failed KV transfer as an engine's transfer worker saw
// it.
type TransferReport struct {
	DecodeID    string // the peer whose registration looks broken
	DecodeAgent string // its NIXL agent the transfer targeted, when known
	PrefillID   string // the sending prefill, when known
	Reason      string
	Error       string
}

// ReportFor turns a transfer worker's error about peer decodeID into a
// report from the engine whose peer ID is self and whose current NIXL agent
// is selfAgent. A prefill reports the decode it could not write to, naming
// the decode agent the failed plan targeted; a decode that could not pull KV
// (vLLM) reports itself, naming its own current agent.
func ReportFor(err error, decodeID, self, selfAgent string) TransferReport {
	// A transfer error may quote remote bytes; cleaned, the registry
	// cannot refuse the report for them.
	r := TransferReport{DecodeID: decodeID, Reason: "KV transfer failed", Error: registry.CleanText(err.Error(), registry.MaxErrorLen)}
	var mk *transfer.MissingMemKindError
	if errors.As(err, &mk) {
		r.Reason = "KV transfer failed: destination memory kind missing"
	}
	switch {
	case decodeID == self:
		r.DecodeAgent = selfAgent
	case mk != nil:
		r.PrefillID, r.DecodeAgent = self, mk.Agent
	default:
		r.PrefillID = self
	}
	return r
}

// ReportTransferFailure tells the control plane that a KV transfer to a
// decode failed, so that every replica stops routing to it and it is told to
// re-register — or, on a repeat right after it re-registered, so that the
// pair is quarantined.
func (a *Agent) ReportTransferFailure(ctx context.Context, r TransferReport) error {
	body := api.StaleReport{Reason: r.Reason, Error: &r.Error}
	if r.PrefillID != "" {
		body.PrefillId = &r.PrefillID
	}
	if r.DecodeAgent != "" {
		body.AgentName = &r.DecodeAgent
	}
	var resp *api.MarkPeerStaleResponse
	err := a.cps.call(ctx, "report peer "+r.DecodeID+" stale", func(c *api.ClientWithResponses) (*http.Response, error) {
		var err error
		resp, err = c.MarkPeerStaleWithResponse(ctx, r.DecodeID, body)
		if err != nil {
			return nil, err
		}
		return resp.HTTPResponse, nil
	})
	if err != nil {
		return err
	}
	if resp.JSON200 == nil {
		return fmt.Errorf("report peer %s stale: %w", r.DecodeID, refusal(resp.HTTPResponse, resp.Body))
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// jitter spreads retries of many agents over ±20 %.
func jitter(d time.Duration) time.Duration {
	return d - d/5 + time.Duration(rand.Int64N(int64(d)*2/5+1))
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
