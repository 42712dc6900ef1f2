// Package agent is pdplane's host agent: it registers the local engine's
// ranks with the control plane, probes the engine's health and load and
// heartbeats with them, reports transfer errors, and carries out
// re-registration when the control plane asks for it. It talks to
// the control plane only through the generated client (server/api) and keeps
// the engine serving while the control plane is unreachable.
package agent

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
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
	// JoinToken admits the peer when it has no credential yet (or lost
	// it): the control plane's join token, or its admin token. Empty for an
	// open control plane.
	JoinToken string
	// CredentialFile, if set, keeps the credential the control plane issues
	// at registration (mode 0600), so that a restarted agent re-registers
	// its name at once. Without it, a restarted agent reclaims its name with
	// the join token once the old lease has run out.
	CredentialFile string
	HTTPClient     *http.Client
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
	// Heal is the action that restarts the engine when the control plane's
	// heal plan asks for it (see ParseHealAction); nil means none.
	Heal HealAction
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
	c.MinBackoff = cmp.Or(c.MinBackoff, 100*time.Millisecond)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, 5*time.Second)
	c.FailbackMin = cmp.Or(c.FailbackMin, time.Second)
	c.FailbackMax = cmp.Or(c.FailbackMax, 30*time.Second)
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
// removed, or the embedded store restarted) or no longer takes its
// credential: register again.
var errPeerGone = errors.New("control plane does not know the peer")

// errNameHeld means the peer's name is held under another credential; the
// registration is retried until the holder's lease runs out.
var errNameHeld = errors.New("the peer's name is held by another credential")

// Agent registers one engine and keeps it registered.
type Agent struct {
	cfg Config
	eng Engine
	cps *controlPlanes
	log zerolog.Logger

	probe     *EngineProbe // nil when probing is disabled
	reporting atomic.Bool  // a report of a recomputing decode is on its way

	mu         sync.Mutex
	peer       api.Peer
	interval   time.Duration
	leaseTTL   time.Duration // from the last registration; 0 before
	credential string
	// healErr is a failed heal action's report, sent with the next
	// heartbeat.
	healErr string
	// peerByAgent caches PeerOfAgent's answers: an agent name belongs to
	// one peer for its whole life.
	peerByAgent map[string]string
}

// New returns an agent for eng.
func New(cfg Config, eng Engine, log zerolog.Logger) (*Agent, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cps, err := newControlPlanes(cfg, nil, log)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a := &Agent{cfg: cfg, eng: eng, cps: cps, log: log, interval: registry.DefaultHeartbeatInterval}
	if !cfg.Probe.Disabled {
		if a.probe, err = NewEngineProbe(cfg.Probe, log.With().Str("component", "engine_probe").Logger()); err != nil {
			return nil, err
		}
	}
	if a.credential, err = loadCredential(cfg.CredentialFile); err != nil {
		return nil, err
	}
	return a, nil
}

// bearer sends token as the request's bearer token.
func bearer(token string) api.RequestEditorFn {
	return func(_ context.Context, r *http.Request) error {
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		return nil
	}
}

// asPeer authenticates a call as this peer: its credential, or the join
// token before it has one (an open control plane checks nothing).
func (a *Agent) asPeer() api.RequestEditorFn {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.credential != "" {
		return bearer(a.credential)
	}
	return bearer(a.cfg.JoinToken)
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
	body := apiconv.Registration(&spec)
	a.mu.Lock()
	cred := a.credential
	a.mu.Unlock()
	token := a.cfg.JoinToken
	if cred != "" {
		token = cred
	}
	resp, err := callFor(ctx, a.cps, "register "+spec.Name, 0, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
		return c.RegisterPeer(ctx, body, bearer(token))
	}, api.ParseRegisterPeerResponse)
	if err != nil {
		return api.Peer{}, err
	}
	if st := resp.StatusCode(); cred != "" && (st == http.StatusUnauthorized || st == http.StatusForbidden) {
		// The credential was revoked (the peer was removed, or an operator
		// or a claim reissued it): start over as a new agent.
		a.log.Warn().Int("status", st).Msg("the control plane no longer accepts this peer's credential; registering with the join token")
		a.mu.Lock()
		if a.credential == cred {
			a.credential = ""
		}
		a.mu.Unlock()
		resp, err = callFor(ctx, a.cps, "register "+spec.Name, 0, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
			return c.RegisterPeer(ctx, body, bearer(a.cfg.JoinToken))
		}, api.ParseRegisterPeerResponse)
		if err != nil {
			return api.Peer{}, err
		}
	}
	p := resp.JSON201
	if p == nil {
		p = resp.JSON200
	}
	if p == nil {
		err := refusal(resp.HTTPResponse, resp.Body)
		if resp.StatusCode() == http.StatusForbidden {
			// The name is held under a credential this agent does not have
			// (it restarted without --credential-file): the control plane lets
			// the join token claim it once the old lease runs out.
			return api.Peer{}, fmt.Errorf("%w: %w", errNameHeld, err)
		}
		return api.Peer{}, err
	}
	if p.Credential != nil {
		if err := saveCredential(a.cfg.CredentialFile, *p.Credential); err != nil {
			a.log.Error().Err(err).Str("file", a.cfg.CredentialFile).Msg("keep the peer credential; a restart will wait for the lease to expire")
		}
		a.mu.Lock()
		a.credential = *p.Credential
		a.mu.Unlock()
		p.Credential = nil // the credential stays in the agent
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
		}, func(st EngineStatus) { a.reportRecompute(ctx, st) })
	}
	if err := a.registerRetrying(ctx); err != nil {
		return err
	}
	restarted, registered := a.watchRestarts(ctx)
	backoff := a.cfg.MinBackoff
	for {
		a.mu.Lock()
		wait := a.interval
		a.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-restarted:
			t.Stop()
			a.log.Info().Msg("engine restarted; registering the new instance")
			if err := a.registerRetrying(ctx); err != nil {
				return err
			}
			registered <- struct{}{}
			continue
		case <-t.C:
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
		case reply.Action == api.Heal:
			backoff = a.cfg.MinBackoff
			if err := a.heal(ctx, apiconv.Deref(reply.Reason)); err != nil {
				return err
			}
		case reply.Action == api.Reregister:
			backoff = a.cfg.MinBackoff
			reason := apiconv.Deref(reply.Reason)
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

// reportRecompute tells the control plane when the decode recomputes KV
// its prefills sent (recompute.go), as a failed transfer the decode
// reports of itself, the way a vLLM decode's failed KV load is reported:
// the registry's rule for those takes it from there (the decode stale,
// re-registered with fresh NIXL agents). It runs after each probe and
// sends the report in the background, one at a time, so that a slow
// control plane never holds the probes; once a report is taken, the window
// starts afresh and a second one needs new evidence.
func (a *Agent) reportRecompute(ctx context.Context, st EngineStatus) {
	p := a.Peer()
	// A peer that prefills as well computes prompts by rights.
	if !st.Recomputing || registry.Role(p.Role) != registry.RoleDecode || !a.reporting.CompareAndSwap(false, true) {
		return
	}
	r := TransferReport{DecodeID: p.Id, Reason: RecomputeReason, Error: st.Recompute.String()}
	if ranks := apiconv.Deref(p.Ranks); len(ranks) == 1 {
		r.DecodeAgent = ranks[0].AgentName
	}
	a.log.Warn().Str("recompute", r.Error).Msg("the decode recomputes KV its prefills sent; reporting it")
	go func() {
		defer a.reporting.Store(false)
		rctx, cancel := context.WithTimeout(ctx, recomputeReportTimeout)
		defer cancel()
		// The pair is a refinement: its lookup may not eat the report's time.
		lctx, lcancel := context.WithTimeout(rctx, partnerLookupTimeout)
		prefill, ok := a.onlyPartner(lctx, p.Id, st.Recompute.Window)
		lcancel()
		if ok {
			// The pair's failure: the registry's rule can quarantine it.
			r.PrefillID = prefill.Id
			r.Reason += " from prefill " + prefill.Name + ", the only one it exchanged KV with meanwhile"
		}
		if err := a.ReportTransferFailure(rctx, r); err != nil {
			a.log.Warn().Err(err).Msg("report the recomputing decode; the next probe tries again")
			return
		}
		a.probe.forgetRecompute()
	}()
}

// onlyPartner returns the prefill the decode exchanged KV with over the
// last window, as the routers reported their served pairs to the registry
// (/api/v1/pairs' last_exchange_at), when there was exactly one: the
// decode's counters cannot say whose KV it recomputed, but with one
// partner the pair is known. ok is false with several, none, or no answer.
func (a *Agent) onlyPartner(ctx context.Context, self string, window time.Duration) (prefill api.PeerRef, ok bool) {
	resp, err := callFor(ctx, a.cps, "list pairs", 0, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
		return c.ListPairs(ctx, &api.ListPairsParams{Limit: apiconv.Opt(100000)})
	}, api.ParseListPairsResponse)
	if err != nil || resp.JSON200 == nil {
		return prefill, false
	}
	// The routers report every second: a window's exchanges may be that
	// much late.
	since := time.Now().Add(-window - exchangeReportSlack)
	n := 0
	for _, pr := range resp.JSON200.Pairs {
		if pr.Decode.Id == self && pr.LastExchangeAt != nil && pr.LastExchangeAt.After(since) {
			prefill, n = pr.Prefill, n+1
		}
	}
	return prefill, n == 1
}

// partnerLookupTimeout bounds onlyPartner's read of the pairs, a part of
// recomputeReportTimeout: without an answer the report names the decode.
const partnerLookupTimeout = 2 * time.Second

// exchangeReportSlack is how late a router's report of the pairs it
// served may be (router.Config.ExchangeReportInterval, 1 s, and the
// report's own time, up to its timeout).
const exchangeReportSlack = 10 * time.Second

// recomputeReportTimeout bounds one report of a recomputing decode, over
// every control-plane replica.
const recomputeReportTimeout = 10 * time.Second

// watchRestarts asks an engine that can tell (a restartWatcher) whether it
// restarted since the instance the agent registered, once a heartbeat
// interval, in a goroutine of its own: the question reads the engine
// (/metrics, /health), which a busy or wedged engine may take seconds to
// answer, and the heartbeats must not wait for it — a real vLLM decode
// stuck in a failing KV transfer answered so slowly that its lease ran out
// while its agent was alive. A restart is sent on restarted; the watcher
// then waits on registered, which the loop sends once the new instance is
// registered, so that it never reports the same restart twice. Both are
// nil (never ready) for an engine that cannot tell.
func (a *Agent) watchRestarts(ctx context.Context) (restarted <-chan struct{}, registered chan<- struct{}) {
	w, ok := a.eng.(restartWatcher)
	if !ok {
		return nil, nil
	}
	found, done := make(chan struct{}), make(chan struct{})
	go func() {
		for {
			a.mu.Lock()
			wait := a.interval
			a.mu.Unlock()
			if !sleep(ctx, wait) || !w.Restarted(ctx, a.Peer().InstanceId) {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			select {
			case found <- struct{}{}:
			case <-ctx.Done():
				return
			}
			select {
			case <-done:
			case <-ctx.Done():
				return
			}
		}
	}()
	return found, done
}

// healTimeout bounds one run of a heal action.
const healTimeout = 5 * time.Minute

// heal runs the heal action the control plane asked for, once. With a
// configured action (--heal) it runs in the background while heartbeats
// go on: a restarted engine comes back as a new instance, which the agent
// registers (a stock engine's restart is noticed by its probes; any other
// engine is registered again right after the action). Without one, the
// engine's own Reregister gives an in-process engine (the simulator)
// fresh NIXL agents, and the new generation is registered at once. A
// failure is reported with the next heartbeat and the control plane marks
// the peer failed: the agent never retries a heal by itself. It returns an
// error only when the agent must stop.
func (a *Agent) heal(ctx context.Context, reason string) error {
	p := a.Peer()
	req := HealRequest{PeerID: p.Id, Name: p.Name, Generation: p.Generation, Reason: reason}
	if a.cfg.Heal == nil {
		a.log.Warn().Str("reason", reason).Msg("control plane asks to heal the engine: giving it fresh NIXL agents")
		if err := a.eng.Reregister(ctx, reason); err != nil {
			a.healFailed(err)
			return nil
		}
		return a.registerRetrying(ctx)
	}
	a.log.Warn().Str("reason", reason).Str("heal", a.cfg.Heal.Kind()).Msg("control plane asks to heal the engine: running the heal action once")
	go func() {
		hctx, cancel := context.WithTimeout(ctx, healTimeout)
		defer cancel()
		err := a.cfg.Heal.Run(hctx, req)
		switch {
		case errors.Is(err, ErrHealManual):
			a.log.Error().Str("peer", p.Name).Msg("the engine needs a restart and no heal action is configured (--heal none): an operator must restart it")
			return
		case err != nil:
			a.healFailed(err)
			return
		}
		a.log.Info().Str("heal", a.cfg.Heal.Kind()).Msg("heal action done; waiting for the engine's new instance")
		if _, ok := a.eng.(restartWatcher); ok {
			return // the probes notice the new instance and register it
		}
		if err := a.registerRetrying(ctx); err != nil && ctx.Err() == nil {
			a.log.Error().Err(err).Msg("register after the heal action")
		}
	}()
	return nil
}

// healFailed keeps a failed heal's report for the next heartbeat.
func (a *Agent) healFailed(err error) {
	a.log.Error().Err(err).Msg("heal action failed; the control plane will mark the peer failed")
	a.mu.Lock()
	a.healErr = truncateText(err.Error(), registry.MaxHealErrorLen)
	a.mu.Unlock()
}

// truncateText cuts s to at most n bytes of valid UTF-8, keeping its end
// (the tail of an action's output says most).
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + strings.ToValidUTF8(s[len(s)-n+len("…"):], "")
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
		case errors.Is(err, errNameHeld):
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
		load := apiconv.Load(st.Load)
		body.Load = &load
		body.EngineHealthy = &st.Healthy
		if !st.Healthy {
			body.EngineError = &st.Error
		}
	}
	a.mu.Lock()
	healErr := a.healErr
	a.mu.Unlock()
	if healErr != "" {
		body.HealError = &healErr
	}
	auth := a.asPeer()
	a.mu.Lock()
	// A heartbeat that takes longer than two intervals is late anyway; the
	// next replica may still get it in time.
	attempt := max(2*a.interval, time.Second)
	a.mu.Unlock()
	resp, err := callFor(ctx, a.cps, "heartbeat", attempt, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
		return c.HeartbeatPeer(ctx, p.Id, body, auth)
	}, api.ParseHeartbeatPeerResponse)
	if err != nil {
		return api.HeartbeatReply{}, err
	}
	if st := resp.StatusCode(); st == http.StatusUnauthorized || st == http.StatusForbidden {
		return api.HeartbeatReply{}, fmt.Errorf("heartbeat answered %d: %w", st, errPeerGone)
	}
	if resp.JSON200 == nil {
		return api.HeartbeatReply{}, refusal(resp.HTTPResponse, resp.Body)
	}
	if healErr != "" {
		a.mu.Lock()
		if a.healErr == healErr {
			a.healErr = ""
		}
		a.mu.Unlock()
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
	auth := a.asPeer()
	resp, err := callFor(ctx, a.cps, "report peer "+r.DecodeID+" stale", 0, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
		return c.MarkPeerStale(ctx, r.DecodeID, body, auth)
	}, api.ParseMarkPeerStaleResponse)
	if err != nil {
		return err
	}
	if resp.JSON200 == nil {
		return fmt.Errorf("report peer %s stale: %w", r.DecodeID, refusal(resp.HTTPResponse, resp.Body))
	}
	return nil
}

// Registration returns another peer's full registration (its agents'
// metadata and transfer secrets), which this peer's transfer agent needs to
// connect to it. The control plane answers only to a peer credential.
func (a *Agent) Registration(ctx context.Context, peerID string) (api.Peer, error) {
	auth := a.asPeer()
	resp, err := callFor(ctx, a.cps, "registration of peer "+peerID, 0, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
		return c.GetPeerRegistration(ctx, peerID, auth)
	}, api.ParseGetPeerRegistrationResponse)
	if err != nil {
		return api.Peer{}, err
	}
	if resp.JSON200 == nil {
		return api.Peer{}, fmt.Errorf("registration of peer %s: %w", peerID, refusal(resp.HTTPResponse, resp.Body))
	}
	return *resp.JSON200, nil
}

// TransferSecret returns the transfer secret of agentName, a rank of peer
// peerID, from the control plane. It fails when the peer has no rank of
// that name any more (it re-registered), or the rank has no secret.
func (a *Agent) TransferSecret(ctx context.Context, peerID, agentName string) ([]byte, error) {
	p, err := a.Registration(ctx, peerID)
	if err != nil {
		return nil, err
	}
	for _, r := range apiconv.Deref(p.Ranks) {
		if r.AgentName != agentName {
			continue
		}
		if r.TransferSecret == nil || len(*r.TransferSecret) == 0 {
			return nil, fmt.Errorf("agent %s of peer %s registered no transfer secret", agentName, peerID)
		}
		return *r.TransferSecret, nil
	}
	return nil, fmt.Errorf("peer %s has no agent %s (generation %d)", peerID, agentName, p.Generation)
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
