package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
	"github.com/pdplane/pdplane/transfer"
)

// PreflightConfig configures the agent's preflights: the transfer worker it
// hosts, with a probe region that counterparts write to and read back, and
// on a prefill the checks it runs against its candidate decodes.
type PreflightConfig struct {
	// Backend names the transfer backend ("nixl" or "tcp") in reports.
	Backend string
	// Ladder is the size ladder and deadline of each preflight.
	Ladder transfer.PreflightConfig
	// Interval is how old a passed preflight may grow before its pair is
	// checked again; default 10m.
	Interval time.Duration
	// FailedInterval is how soon a failed pair is checked again; default
	// 30s.
	FailedInterval time.Duration
	// Gap is the least time between two preflights this agent starts: the
	// per-host rate limit (one preflight at a time, at most one per Gap);
	// default 1s.
	Gap time.Duration
	// Poll is how often the agent looks for due pairs (one listing of its
	// own pairs) and drains its probe notifications; default 10s.
	Poll time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// WithDefaults fills in unset fields.
func (c PreflightConfig) WithDefaults() PreflightConfig {
	c.Ladder = c.Ladder.WithDefaults()
	if c.Interval <= 0 {
		c.Interval = 10 * time.Minute
	}
	if c.FailedInterval <= 0 {
		c.FailedInterval = 30 * time.Second
	}
	if c.Gap <= 0 {
		c.Gap = time.Second
	}
	if c.Poll <= 0 {
		c.Poll = 10 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Preflighter is an agent's preflight worker. It publishes the probe host's
// region for the agent's peer (again after every registration), and on a
// prefill preflights each candidate decode that has none, whose last one is
// older than its window, or whose last one was of an earlier registration
// (after a heal), one at a time, and reports each result.
type Preflighter struct {
	a     *Agent
	cfg   PreflightConfig
	host  *transfer.ProbeHost
	local transfer.ProbeMemory // the initiator's registered region
	log   zerolog.Logger

	mu      sync.Mutex
	secrets map[string][]byte // probe agent name -> transfer secret, from the probes read
	agentOf map[string]string // decode ID -> its probe agent's name, so that a decode's next agent replaces the last one's secret
	secret  []byte            // this probe host's own secret (TCP backend)
}

// NewPreflighter returns a preflight worker for a; host is the probe region
// other agents preflight, local a registered region of at least twice
// cfg.Ladder.MaxSize that this agent writes from and reads back into.
// secret is the host backend's transfer secret, published with the probe
// (nil for NIXL).
func (a *Agent) NewPreflighter(cfg PreflightConfig, host *transfer.ProbeHost, local transfer.ProbeMemory, secret []byte) *Preflighter {
	return &Preflighter{a: a, cfg: cfg.WithDefaults(), host: host, local: local, secret: secret, secrets: map[string][]byte{}, agentOf: map[string]string{},
		log: a.log.With().Str("component", "preflight").Logger()}
}

// RemoteSecret returns the transfer secret of a probe agent read from the
// control plane; the TCP backend asks it before connecting.
func (p *Preflighter) RemoteSecret(_ context.Context, agent string) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.secrets[agent]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("no transfer secret known for probe agent %s", agent)
}

// Run publishes the probe and runs due preflights until ctx ends. Errors
// are logged, never fatal: preflights must not take the agent down.
func (p *Preflighter) Run(ctx context.Context) {
	// published is the registration the probe was last published for: a
	// new peer ID (deleted and joined again), a new generation, or a new
	// record under the same ID (a control plane that restarted empty)
	// each needs it published again.
	type registration struct {
		id         string
		generation int64
		created    int64 // Unix ns of the record's creation
	}
	var published registration
	last := time.Time{}
	for {
		if !sleep(ctx, p.cfg.Poll) {
			return
		}
		if _, err := p.host.DrainNotifs(); err != nil {
			p.log.Warn().Err(err).Msg("drain probe notifications")
		}
		peer := p.a.Peer()
		if peer.Id == "" {
			continue
		}
		if reg := (registration{peer.Id, peer.Generation, peer.CreatedAt.UnixNano()}); reg != published {
			if err := p.publish(ctx, peer.Id); err != nil {
				p.log.Warn().Err(err).Msg("publish probe region; retrying")
				continue
			}
			published = reg
		}
		if !registry.Role(peer.Role).Prefills() {
			continue
		}
		due, err := p.due(ctx, peer.Id)
		if err != nil {
			p.log.Warn().Err(err).Msg("list pairs to preflight")
			continue
		}
		for _, d := range due {
			if wait := p.cfg.Gap - p.cfg.Now().Sub(last); wait > 0 && !sleep(ctx, wait) {
				return
			}
			last = p.cfg.Now()
			p.check(ctx, peer.Id, d)
		}
	}
}

// publish sends the probe host's region to the control plane.
func (p *Preflighter) publish(ctx context.Context, peerID string) error {
	pr, err := p.host.Peer()
	if err != nil {
		return err
	}
	d := pr.Region.Descs[0]
	body := api.Probe{AgentName: pr.Agent, Backend: p.cfg.Backend, MemKind: api.MemKind(pr.Region.Kind.String()),
		Metadata: pr.Metadata, Addr: d.Addr, Len: d.Len, DevId: apiconv.Opt(d.DevID)}
	if len(p.secret) > 0 {
		body.TransferSecret = &p.secret
	}
	auth := p.a.asPeer()
	resp, err := callFor(ctx, p.a.cps, "publish probe", 0, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
		return c.PublishProbe(ctx, peerID, body, auth)
	}, api.ParsePublishProbeResponse)
	if err != nil {
		return err
	}
	if resp.JSON200 == nil {
		return fmt.Errorf("publish probe: %w", refusal(resp.HTTPResponse, resp.Body))
	}
	p.log.Info().Str("probe_agent", pr.Agent).Uint64("len", d.Len).Msg("probe region published")
	return nil
}

// due lists the decodes this prefill should preflight now: compatible
// pairs that are routable or kept out only by their preflight, whose last
// preflight is missing, of an earlier registration, or older than its
// window.
func (p *Preflighter) due(ctx context.Context, self string) ([]string, error) {
	resp, err := callFor(ctx, p.a.cps, "list pairs", 0, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
		return c.ListPairs(ctx, &api.ListPairsParams{Limit: apiconv.Opt(100000), Prefill: &self})
	}, api.ParseListPairsResponse)
	if err != nil {
		return nil, err
	}
	if resp.JSON200 == nil {
		return nil, fmt.Errorf("list pairs: %w", refusal(resp.HTTPResponse, resp.Body))
	}
	now := p.cfg.Now()
	var out []string
	for _, pr := range resp.JSON200.Pairs {
		if pr.Prefill.Id != self || !pr.Compatible {
			continue
		}
		pf := pr.Preflight
		blocked := pf != nil && pf.State == api.PairPreflightStateFailed && apiconv.Deref(pf.Current)
		if !pr.Routable && !blocked {
			continue // not ready, or quarantined: nothing to prove now
		}
		window := p.cfg.Interval
		if pf != nil && pf.State == api.PairPreflightStateFailed {
			window = p.cfg.FailedInterval
		}
		if pf == nil || !apiconv.Deref(pf.Current) || now.Sub(pf.CheckedAt) >= window {
			out = append(out, pr.Decode.Id)
		}
	}
	return out, nil
}

// check preflights one decode and reports the result. A decode that
// published no probe is skipped (its agent runs without preflights).
func (p *Preflighter) check(ctx context.Context, self, decodeID string) {
	probe, err := p.probe(ctx, decodeID)
	if errors.Is(err, errPeerGone) { // 404: no probe, or the decode is gone
		p.log.Debug().Str("decode", decodeID).Msg("decode published no probe region; not preflighted")
		return
	}
	if err != nil {
		p.log.Warn().Err(err).Str("decode", decodeID).Msg("read the decode's probe region")
		return
	}
	res := transfer.RunPreflight(ctx, p.host.Backend(), p.local, probe, p.cfg.Ladder)
	if ctx.Err() != nil {
		return
	}
	p.logResult(decodeID, res)
	if err := p.report(ctx, self, decodeID, res); err != nil {
		p.log.Warn().Err(err).Str("decode", decodeID).Msg("report preflight")
	}
}

func (p *Preflighter) logResult(decodeID string, res transfer.PreflightResult) {
	ev := p.log.Info()
	if !res.Passed() {
		ev = p.log.Warn().Err(res.Err)
	}
	ev.Str("decode", decodeID).Str("remote", res.Remote).Float64("gbps", res.GBps).
		Dur("latency", res.Latency).Bool("passed", res.Passed()).Msg("preflight")
}

// probe reads a decode's probe from the control plane.
func (p *Preflighter) probe(ctx context.Context, decodeID string) (transfer.PreflightPeer, error) {
	auth := p.a.asPeer()
	resp, err := callFor(ctx, p.a.cps, "probe of peer "+decodeID, 0, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
		return c.GetProbe(ctx, decodeID, auth)
	}, api.ParseGetProbeResponse)
	if err != nil {
		return transfer.PreflightPeer{}, err
	}
	if resp.JSON200 == nil {
		return transfer.PreflightPeer{}, fmt.Errorf("probe of peer %s: %w", decodeID, refusal(resp.HTTPResponse, resp.Body))
	}
	pr, err := apiconv.Probe(decodeID, resp.JSON200)
	if err != nil {
		return transfer.PreflightPeer{}, err
	}
	if len(pr.TransferSecret) > 0 {
		p.learnSecret(decodeID, pr.AgentName, pr.TransferSecret)
	}
	return transfer.PreflightPeer{Agent: pr.AgentName, Metadata: pr.Metadata,
		Region: transfer.DescList{Kind: pr.MemKind, Descs: []transfer.Desc{{Addr: pr.Addr, Len: pr.Len, DevID: pr.DevID}}}}, nil
}

// learnSecret keeps the transfer secret of decodeID's probe agent. A decode
// that restarted has a new agent: its previous agent's secret is dropped,
// so that the map holds one secret a decode however often decodes restart
// (a heal restarts one each time).
func (p *Preflighter) learnSecret(decodeID, agent string, secret []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.agentOf[decodeID]; ok && old != agent {
		delete(p.secrets, old)
	}
	p.agentOf[decodeID] = agent
	p.secrets[agent] = secret
}

// report sends a preflight's result to the control plane.
func (p *Preflighter) report(ctx context.Context, self, decodeID string, res transfer.PreflightResult) error {
	body := api.PairPreflight{State: api.PairPreflightStatePassed, Backend: p.cfg.Backend, MemKind: api.MemKind(res.MemKind.String()),
		Gbps: res.GBps, LatencyUs: float64(res.Latency.Nanoseconds()) / 1e3, CheckedAt: p.cfg.Now().UTC()}
	if !res.Passed() {
		body.State, body.Error = api.PairPreflightStateFailed, apiconv.Opt(registry.CleanText(res.Err.Error(), registry.MaxPreflightError))
	}
	auth := p.a.asPeer()
	resp, err := callFor(ctx, p.a.cps, "report preflight", 0, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
		return c.ReportPreflight(ctx, self, decodeID, body, auth)
	}, api.ParseReportPreflightResponse)
	if err != nil {
		return err
	}
	if resp.JSON200 == nil {
		return fmt.Errorf("report preflight: %w", refusal(resp.HTTPResponse, resp.Body))
	}
	return nil
}
