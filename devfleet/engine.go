package devfleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
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
// agent that registers it.
type Engine struct {
	sim   *sim.Sim
	agent *agent.Agent // nil without a control plane

	cancel context.CancelFunc // stops the agent
	done   chan struct{}      // closed when the agent's Run returned
	err    error              // the agent's Run result, set before done closes
}

// StartEngine starts the simulator and, when cfg.ControlPlane is set, its
// agent, which runs until ctx ends or Close. The simulator's transfer
// errors go to the control plane as stale reports, and it learns its peer
// ID from each registration.
func StartEngine(ctx context.Context, cfg EngineConfig, log zerolog.Logger) (*Engine, error) {
	ctx, cancel := context.WithCancel(ctx)
	e := &Engine{cancel: cancel, done: make(chan struct{})}
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
			decodeID := peerID
			if decodeID == "" {
				// SGLang's bootstrap plane names the decode by its NIXL
				// agent only.
				var lerr error
				if decodeID, lerr = e.agent.PeerOfAgent(rctx, agentName); lerr != nil {
					log.Warn().Err(lerr).Str("decode_agent", agentName).Msg("report stale peer: no registered decode has the agent")
					return
				}
			}
			r := agent.ReportFor(err, decodeID, e.agent.Peer().Id, e.sim.AgentName())
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
			if peerID == "" {
				var err error
				if peerID, err = e.agent.PeerOfAgent(ctx, agentName); err != nil {
					return nil, err
				}
			}
			return e.agent.TransferSecret(ctx, peerID, agentName)
		}
	}
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
			OnRegistered: func(p api.Peer) { s.SetPeerID(p.Id) },
		}, s, log.With().Str("agent", sc.Name).Logger())
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

// Sim is the simulated engine.
func (e *Engine) Sim() *sim.Sim { return e.sim }

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
	e.sim.Close()
}
