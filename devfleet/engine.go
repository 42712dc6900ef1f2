package devfleet

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/sim"
)

// reportTimeout bounds one stale report to the control plane.
const reportTimeout = 5 * time.Second

// EngineConfig is one simulated engine and where its agent registers it.
type EngineConfig struct {
	// Sim is the simulator's configuration. Its OnTransferError, if set,
	// is called before the failure is reported; its TransferSecrets is
	// replaced when ControlPlane is set.
	Sim sim.Config
	// ControlPlane is the base URL of the control plane the agent
	// registers with, or several replicas' URLs separated by commas
	// (failover in order). Empty runs the engine alone, with no agent.
	ControlPlane string
	// JoinToken admits the peer (the control plane's join or admin token).
	JoinToken string
}

// Engine is a running simulator and, when it has a control plane, the
// agent that registers it. Its heal action restarts the simulator as a
// real engine restarts: the old one is closed, a new instance (fresh NIXL
// agent, no fault) starts on the same address, and the agent registers it
// at the next generation — the path a real SGLang decode takes, since it
// gets a fresh agent only by restarting.
type Engine struct {
	cfg sim.Config // with the hooks set
	log zerolog.Logger
	ctx context.Context // the engine's life

	mu      sync.Mutex
	sim     *sim.Sim
	retired []sim.Stats // the statistics of the instances restarts replaced

	agent *agent.Agent // nil without a control plane

	cancel context.CancelFunc // stops the agent
	done   chan struct{}      // closed when the agent's Run returned
	err    error              // the agent's Run result, set before done closes
}

// StartEngine starts the simulator and, when cfg.ControlPlane is set, its
// agent, which runs until ctx ends or Close. The simulator's transfer
// errors go to the control plane as stale reports, it learns its peer ID
// from each registration, and the agent's heal action restarts it.
func StartEngine(ctx context.Context, cfg EngineConfig, log zerolog.Logger) (*Engine, error) {
	ctx, cancel := context.WithCancel(ctx)
	e := &Engine{cancel: cancel, done: make(chan struct{}), ctx: ctx, log: log}
	sc := cfg.Sim
	also := sc.OnTransferError
	sc.OnTransferError = func(peerID, agentName string, err error) {
		if also != nil {
			also(peerID, agentName, err)
		}
		if e.agent == nil {
			return
		}
		go func() {
			rctx, cancel := context.WithTimeout(ctx, reportTimeout)
			defer cancel()
			decodeID, lerr := e.peerOf(rctx, peerID, agentName)
			if lerr != nil {
				log.Warn().Err(lerr).Str("decode_agent", agentName).Msg("report stale peer: no registered decode has the agent")
				return
			}
			r := agent.ReportFor(err, decodeID, e.agent.Peer().Id, e.Sim().AgentName())
			if rerr := e.agent.ReportTransferFailure(rctx, r); rerr != nil {
				log.Warn().Err(rerr).Str("peer_id", decodeID).Msg("report stale peer")
			}
		}()
	}
	if cfg.ControlPlane != "" {
		// The TCP transfer plane is closed: a remote agent's secret comes
		// from the control plane, asked with this peer's credential.
		sc.TransferSecrets = func(ctx context.Context, peerID, agentName string) ([]byte, error) {
			if e.agent == nil {
				return nil, errors.New("no agent to ask the control plane")
			}
			peerID, err := e.peerOf(ctx, peerID, agentName)
			if err != nil {
				return nil, err
			}
			return e.agent.TransferSecret(ctx, peerID, agentName)
		}
	}
	e.cfg = sc
	s, err := sim.New(sc, log.With().Str("sim", sc.Name).Logger())
	if err != nil {
		cancel()
		return nil, err
	}
	// Both are set before the sim starts: its transfer errors read them.
	e.sim = s
	if cfg.ControlPlane != "" {
		e.agent, err = agent.New(agent.Config{
			ControlPlane: cfg.ControlPlane, JoinToken: cfg.JoinToken,
			OnRegistered: func(p api.Peer) { e.Sim().SetPeerID(p.Id) },
			Heal:         restartAction{e},
		}, e, log.With().Str("agent", sc.Name).Logger())
		if err != nil {
			cancel()
			s.Close()
			return nil, err
		}
	}
	if err := s.Start(ctx); err != nil {
		cancel()
		s.Close()
		return nil, fmt.Errorf("start sim %s: %w", sc.Name, err)
	}
	if e.agent == nil {
		close(e.done)
		return e, nil
	}
	go func() {
		e.err = e.agent.Run(ctx)
		close(e.done)
	}()
	return e, nil
}

// peerOf is peerID, or, when the engine protocol did not name the peer
// (SGLang's bootstrap plane names only the NIXL agent), the peer the
// control plane knows agentName by.
func (e *Engine) peerOf(ctx context.Context, peerID, agentName string) (string, error) {
	if peerID != "" {
		return peerID, nil
	}
	return e.agent.PeerOfAgent(ctx, agentName)
}

// Agent is the engine's agent.
func (e *Engine) Agent() *agent.Agent { return e.agent }

// Sim is the running simulator; a heal replaces it.
func (e *Engine) Sim() *sim.Sim {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sim
}

// Retired returns the last statistics of every instance a restart
// replaced, oldest first: one per restart.
func (e *Engine) Retired() []sim.Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]sim.Stats(nil), e.retired...)
}

// Spec implements agent.Engine for the running simulator.
func (e *Engine) Spec(ctx context.Context) (registry.PeerSpec, error) { return e.Sim().Spec(ctx) }

// Reregister implements agent.Engine. The agent heals through the restart
// action instead; this serves an agent without one.
func (e *Engine) Reregister(ctx context.Context, reason string) error {
	return e.Sim().Reregister(ctx, reason)
}

// Restarted tells the agent that the simulator it registered was replaced
// by a restart, so that it registers the new instance.
func (e *Engine) Restarted(_ context.Context, registered string) bool {
	return e.Sim().InstanceID() != registered
}

// restart closes the simulator and starts a new instance of it on the
// same address (and bootstrap port), as an engine restart does.
func (e *Engine) restart(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.sim
	cfg := e.cfg
	u, err := url.Parse(old.URL())
	if err != nil {
		return fmt.Errorf("restart %s: %w", cfg.Name, err)
	}
	cfg.Addr = u.Host
	if p := old.BootstrapPort(); p != 0 {
		cfg.BootstrapPort = p
	}
	peerID := old.PeerID()
	old.Close()
	e.retired = append(e.retired, old.Stats())
	s, err := sim.New(cfg, e.log.With().Str("sim", cfg.Name).Logger())
	if err != nil {
		return fmt.Errorf("restart %s: %w", cfg.Name, err)
	}
	s.SetPeerID(peerID)
	if err := s.Start(e.ctx); err != nil {
		s.Close()
		return fmt.Errorf("restart %s: %w", cfg.Name, err)
	}
	e.sim = s
	e.log.Info().Str("sim", cfg.Name).Str("instance", s.InstanceID()).Str("agent", s.AgentName()).Msg("heal: simulator restarted")
	return ctx.Err()
}

// restartAction is the simulator's heal action: restart it.
type restartAction struct{ e *Engine }

func (restartAction) Kind() string { return "sim-restart" }

func (r restartAction) Run(ctx context.Context, _ agent.HealRequest) error { return r.e.restart(ctx) }

// Done is closed when the agent has stopped: at once for an engine
// without a control plane, otherwise when the agent's Run returns (its
// context ended, Close, or the control plane refused the peer).
func (e *Engine) Done() <-chan struct{} { return e.done }

// Err is the agent's Run result once Done is closed: nil without an
// agent, an *agent.RefusedError when the control plane refused the peer.
func (e *Engine) Err() error {
	select {
	case <-e.done:
		return e.err
	default:
		return nil
	}
}

// Close stops the agent, waits for it, and closes the simulator. It is
// idempotent.
func (e *Engine) Close() {
	e.cancel()
	<-e.done
	e.Sim().Close()
}
