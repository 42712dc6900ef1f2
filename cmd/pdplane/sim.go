package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/sim"
)

// engineWithAgent is a simulator and the agent that registers it.
type engineWithAgent struct {
	sim   *sim.Sim
	agent *agent.Agent
	done  chan error // the agent's Run result
}

// startSimWithAgent starts a simulator and, when controlPlane is set, its
// agent. The simulator's transfer errors go to the control plane as stale
// reports, and it learns its peer ID from each registration.
func startSimWithAgent(ctx context.Context, cfg sim.Config, controlPlane, token string, log zerolog.Logger) (*engineWithAgent, error) {
	e := &engineWithAgent{done: make(chan error, 1)}
	also := cfg.OnTransferError
	cfg.OnTransferError = func(peerID, agentName string, err error) {
		if also != nil {
			also(peerID, agentName, err)
		}
		if e.agent == nil {
			return
		}
		go func() {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			decodeID := peerID
			if decodeID == "" {
				// SGLang names the decode by its NIXL agent only.
				var lerr error
				if decodeID, lerr = e.agent.PeerOfAgent(rctx, agentName); lerr != nil {
					log.Warn().Err(lerr).Str("decode_agent", agentName).Msg("report stale peer: the decode is not known")
					return
				}
			}
			r := agent.ReportFor(err, decodeID, e.agent.Peer().Id, e.sim.AgentName())
			if rerr := e.agent.ReportTransferFailure(rctx, r); rerr != nil {
				log.Warn().Err(rerr).Str("peer_id", decodeID).Msg("report stale peer")
			}
		}()
	}
	if controlPlane != "" {
		// The TCP transfer plane is closed: a remote agent's secret comes
		// from the control plane, asked with this peer's credential.
		cfg.TransferSecrets = func(ctx context.Context, peerID, agentName string) ([]byte, error) {
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
	s, err := sim.New(cfg, log.With().Str("sim", cfg.Name).Logger())
	if err != nil {
		return nil, err
	}
	// Both are set before the sim starts: its transfer errors read them.
	e.sim = s
	if controlPlane != "" {
		e.agent, err = agent.New(agent.Config{
			ControlPlane: controlPlane, JoinToken: token,
			OnRegistered: func(p api.Peer) { s.SetPeerID(p.Id) },
		}, s, log.With().Str("agent", cfg.Name).Logger())
		if err != nil {
			s.Close()
			return nil, err
		}
	}
	if err := s.Start(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("start sim %s: %w", cfg.Name, err)
	}
	if e.agent == nil {
		close(e.done)
		return e, nil
	}
	go func() { e.done <- e.agent.Run(ctx) }()
	return e, nil
}

func simFlags(fs *flagSet, c *sim.Config, role, engine *string) {
	fs.str(role, "role", "prefill", "prefill or decode")
	fs.str(engine, "engine", "sglang", "protocol to speak: sglang or vllm")
	fs.str(&c.Name, "name", "", "engine name (default: <role>-<pid>)")
	fs.str(&c.Model, "model", sim.DefaultModel, "served model name")
	fs.str(&c.Addr, "sim-addr", "127.0.0.1:0", "listen address of the simulated engine")
	fs.str(&c.Transfer, "transfer", sim.TransferTCP, "KV transfer backend: tcp or nixl")
	fs.dur(&c.PrefillTimePerToken, "prefill-time-per-token", 0, "simulated prefill time per prompt token")
	fs.dur(&c.DecodeTimePerToken, "decode-time-per-token", 0, "simulated decode time per generated token")
}

// runSim runs one simulated engine and, with --control-plane, its agent.
func runSim(ctx context.Context, args []string) error {
	var c sim.Config
	var role, engine, controlPlane, token, legacyToken, logLevel, sharedSecret string
	fs := newFlagSet("sim")
	simFlags(fs, &c, &role, &engine)
	fs.IntVar(&c.BootstrapPort, "bootstrap-port", 0, "SGLang bootstrap port of a prefill (0 picks a free one)")
	fs.str(&controlPlane, "control-plane", "", "base URL of pdplane serve to register with, or several replicas' URLs "+
		"separated by commas (failover in order); empty runs the engine alone")
	fs.str(&token, "join-token", "", "join token of the control plane (or its admin token)")
	fs.str(&legacyToken, "token", "", "deprecated: the same as --join-token")
	fs.str(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.str(&sharedSecret, "transfer-secret", "", "without --control-plane: the TCP transfer secret (16 to 64 bytes) shared by "+
		"the sims that move KV between them, e.g. behind another router; prefer the environment variable, which ps does not show")
	if err := fs.parse(args); err != nil {
		return err
	}
	if token == "" {
		token = legacyToken
	}
	if sharedSecret != "" {
		if controlPlane != "" {
			return errors.New("--transfer-secret is for sims without --control-plane; with one, secrets come from the control plane")
		}
		c.SharedTransferSecret = []byte(sharedSecret)
	}
	token = firstToken(token)
	c.Role, c.Engine = registry.Role(role), registry.Engine(engine)
	if c.Name == "" {
		c.Name = fmt.Sprintf("%s-%d", role, os.Getpid())
	}
	log, err := newLogger(logLevel, false)
	if err != nil {
		return err
	}
	e, err := startSimWithAgent(ctx, c, controlPlane, token, log)
	if err != nil {
		return err
	}
	defer e.sim.Close()
	fmt.Fprintf(os.Stderr, "%s %s (%s) serving at %s\n", c.Name, role, engine, e.sim.URL())
	select {
	case err := <-e.done:
		var refused *agent.RefusedError
		if errors.As(err, &refused) {
			return err // prints the problem detail and exits non-zero
		}
		if err == nil && controlPlane == "" {
			<-ctx.Done()
		}
		return nil
	case <-ctx.Done():
		return nil
	}
}

// runDev runs the quick start: serve on the embedded store (or
// --database-url) plus simulated prefills and decodes with their agents.
func runDev(ctx context.Context, args []string) error {
	var c serveConfig
	var prefills, decodes int
	var engine, transferName, model string
	fs := newFlagSet("dev")
	c.flags(fs)
	fs.IntVar(&prefills, "prefills", 1, "simulated prefill engines")
	fs.IntVar(&decodes, "decodes", 1, "simulated decode engines")
	fs.str(&engine, "engine", "sglang", "protocol the simulators speak: sglang or vllm")
	fs.str(&transferName, "transfer", sim.TransferTCP, "KV transfer backend: tcp or nixl")
	fs.str(&model, "model", sim.DefaultModel, "model the simulators serve")
	if err := fs.parse(args); err != nil {
		return err
	}
	if prefills < 1 || decodes < 1 {
		return errors.New("--prefills and --decodes must be at least 1")
	}
	log, err := newLogger(c.logLevel, true)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cp, err := startControlPlane(ctx, c, log)
	if err != nil {
		return err
	}
	var engines []*engineWithAgent
	defer func() {
		for _, e := range engines {
			e.sim.Close()
		}
	}()
	for i := 0; i < prefills+decodes; i++ {
		role, n := registry.RolePrefill, i
		if i >= prefills {
			role, n = registry.RoleDecode, i-prefills
		}
		cfg := sim.Config{Name: fmt.Sprintf("%s-%d", role, n), Role: role, Engine: registry.Engine(engine),
			Model: model, Transfer: transferName}
		e, err := startSimWithAgent(ctx, cfg, cp.BaseURL, c.agentToken(), log)
		if err != nil {
			return err
		}
		engines = append(engines, e)
	}
	waitReady(ctx, cp.BaseURL+"/readyz", 10*time.Second)
	var engineList strings.Builder
	for _, e := range engines {
		fmt.Fprintf(&engineList, "    %-12s %s\n", e.sim.Config().Name, e.sim.URL())
	}
	fmt.Fprintf(os.Stderr, `
  pdplane dev is running: %d prefill and %d decode simulated %s engines (%s transfer)

  OpenAI base URL: %s/v1
  Status page:     %s/

  Engines (POST <url>/_sim/fault {"fault": "missing-mem-kind"} breaks one):
%s
  Try: curl %s/v1/chat/completions -H 'Content-Type: application/json' \
         -d '{"model": "%s", "messages": [{"role": "user", "content": "hello"}], "stream": true}'

`, prefills, decodes, engine, transferName, cp.BaseURL, cp.BaseURL, engineList.String(), cp.BaseURL, model)
	return cp.wait(ctx)
}

// waitReady polls url until it answers 200 or the timeout passes.
func waitReady(ctx context.Context, url string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
