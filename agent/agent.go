// Package agent is pdplane's host agent: it registers the local engine's
// ranks with the control plane, probes the engine's health and load and
// heartbeats with them, reports transfer errors, and carries out
// re-registration when the control plane asks for it. It talks to
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

// Config configures an Agent.
type Config struct {
	// ControlPlane is the base URL of `pdplane serve`.
	ControlPlane string
	// Token is the peer (or admin) bearer token, if the control plane has one.
	Token      string
	HTTPClient *http.Client
	// MinBackoff and MaxBackoff bound the retry delay while the control
	// plane is unreachable.
	MinBackoff, MaxBackoff time.Duration
	// OnRegistered, if set, is called after every successful registration.
	OnRegistered func(api.Peer)
	// Probe configures the probes of the engine at the registered peer's
	// URL, whose verdict and load every heartbeat carries.
	Probe ProbeConfig
}

// WithDefaults fills in unset fields.
func (c Config) WithDefaults() Config {
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	return c
}

func (c Config) validate() error {
	if c.ControlPlane == "" {
		return errors.New("agent: control plane URL is required")
	}
	if c.MinBackoff > c.MaxBackoff {
		return fmt.Errorf("agent: min backoff %s exceeds max backoff %s", c.MinBackoff, c.MaxBackoff)
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
	cfg    Config
	eng    Engine
	client *api.ClientWithResponses
	log    zerolog.Logger

	probe *EngineProbe // nil when probing is disabled

	mu       sync.Mutex
	peer     api.Peer
	interval time.Duration
}

// New returns an agent for eng.
func New(cfg Config, eng Engine, log zerolog.Logger) (*Agent, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	opts := []api.ClientOption{api.WithHTTPClient(cfg.HTTPClient)}
	if cfg.Token != "" {
		opts = append(opts, api.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+cfg.Token)
			return nil
		}))
	}
	client, err := api.NewClientWithResponses(cfg.ControlPlane, opts...)
	if err != nil {
		return nil, fmt.Errorf("agent: control plane client: %w", err)
	}
	a := &Agent{cfg: cfg, eng: eng, client: client, log: log, interval: registry.DefaultHeartbeatInterval}
	if !cfg.Probe.Disabled {
		if a.probe, err = NewEngineProbe(cfg.Probe, log.With().Str("component", "engine_probe").Logger()); err != nil {
			return nil, err
		}
	}
	return a, nil
}

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
	resp, err := a.client.RegisterPeerWithBodyWithResponse(ctx, "application/json", bytes.NewReader(body))
	if err != nil {
		return api.Peer{}, fmt.Errorf("register %s: %w", spec.Name, err)
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
		if st.Probes == 0 && p.Url != "" {
			// The first heartbeat of a registration waits for a verdict
			// rather than report a starting engine as down, or a dead one
			// as up.
			st = a.probe.Probe(ctx, p.Url, registry.Engine(p.Engine))
		}
		body.Load = &api.Load{Running: st.Load.Running, Queued: st.Load.Queued, KvUsage: st.Load.KVUsage}
		body.EngineHealthy = &st.Healthy
		if !st.Healthy {
			body.EngineError = &st.Error
		}
	}
	resp, err := a.client.HeartbeatPeerWithResponse(ctx, p.Id, body)
	if err != nil {
		return api.HeartbeatReply{}, err
	}
	if resp.JSON200 == nil {
		return api.HeartbeatReply{}, refusal(resp.HTTPResponse, resp.Body)
	}
	return *resp.JSON200, nil
}

// EngineStatus is what the agent's probes know about its engine (healthy
// when probing is disabled).
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
	r := TransferReport{DecodeID: decodeID, Reason: "KV transfer failed", Error: err.Error()}
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
	resp, err := a.client.MarkPeerStaleWithResponse(ctx, r.DecodeID, body)
	if err != nil {
		return fmt.Errorf("report peer %s stale: %w", r.DecodeID, err)
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
