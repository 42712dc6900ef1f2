package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/cli"
	"github.com/pdplane/pdplane/registry"
)

// runAgent registers a real engine, from its spec file (completed from the
// engine's /server_info) or, with no spec, from what the engine publishes,
// and keeps it registered.
func runAgent(ctx context.Context, args []string) error {
	var controlPlane, token, legacyToken, credentialFile, logLevel, engineKind, role string
	var eng agent.SpecFileEngine
	var pub agent.PublishedConfig
	fs := cli.NewFlagSet("agent")
	fs.List(&controlPlane, "control-plane", "http://127.0.0.1:8080", "base URL of pdplane serve, or several replicas' URLs "+
		"separated by commas: the agent uses the first that answers and fails over on connection errors and 5xx")
	fs.List(&token, "join-token", "", "join token of the control plane (or its admin token): admits the peer when it has no credential")
	fs.DeprecatedStr(&legacyToken, "token", "join-token")
	fs.Str(&credentialFile, "credential-file", "", "file that keeps the peer's credential (mode 0600), so that a restarted agent re-registers at once; "+
		"without it a restarted agent waits for its old lease to run out")
	fs.Str(&eng.Path, "spec", "", "JSON registration of the engine (the body of POST /api/v1/peers) written by its launcher: "+
		"KV regions, memory kinds, NIXL agents")
	fs.Str(&eng.EngineURL, "engine-url", "", "the engine's HTTP URL; with --spec, fields the spec leaves empty come from its /server_info")
	fs.Str(&eng.ReregisterCmd, "reregister-cmd", "", "deprecated, use --heal exec:CMD: shell command that gives the engine fresh NIXL agents "+
		"and rewrites --spec; it gets $PDPLANE_REREGISTER_REASON and $PDPLANE_SPEC_FILE, and is the heal action when --heal is not set")
	var healSpec string
	fs.Str(&healSpec, "heal", "", "how the agent restarts its engine when the control plane's heal plan asks (only a restart gives "+
		"a stock engine fresh NIXL agents): exec:CMD (/bin/sh -c CMD, with $PDPLANE_PEER_ID, $PDPLANE_PEER_NAME, $PDPLANE_GENERATION, "+
		"$PDPLANE_HEAL_REASON), systemd:UNIT (systemctl restart UNIT), kubernetes (delete the agent's own pod; needs RBAC delete on pods) "+
		"or none (an operator must restart it); default none, or exec: of --reregister-cmd")
	var probe agent.ProbeConfig
	fs.Dur(&probe.Interval, "probe-interval", 0, "time between probes of the engine's /health and load; 0 follows the heartbeat interval")
	fs.Dur(&probe.Timeout, "probe-timeout", agent.DefaultProbeTimeout, "time limit of each probe request to the engine")
	var recomputePercent int
	fs.Dur(&probe.RecomputeWindow, "recompute-window", agent.DefaultRecomputeWindow,
		"a vLLM decode's prompt tokens are judged over this window: computed rather than loaded by KV transfer past --recompute-percent, it is reported")
	fs.Int(&recomputePercent, "recompute-percent", int(100*agent.DefaultRecomputeThreshold),
		"share of a vLLM decode's prompt tokens it may recompute over --recompute-window before its agent reports it (1 to 99)")
	fs.Str(&engineKind, "engine", "", "without --spec: sglang or vllm, registered from what the engine publishes "+
		"(SGLang /server_info, /get_model_info, /v1/models; vLLM /v1/models, /metrics, /version); NIXL agents and KV regions stay unknown")
	fs.Str(&pub.ModelDir, "model-dir", "", "without --spec: local model directory or Hugging Face cache snapshot whose config.json "+
		"gives layers, KV heads, head dim and MLA (unknown without it)")
	fs.Str(&pub.Name, "name", "", "without --spec: peer name (default: the engine URL's host:port)")
	fs.Str(&role, "role", "", "without --spec: prefill, decode or both; required for vLLM, which does not publish it")
	fs.Int(&pub.TPSize, "tp-size", 0, "without --spec: tensor parallel size; required for vLLM, which does not publish it")
	fs.Str(&pub.BootstrapHost, "bootstrap-host", "", "without --spec: SGLang prefill bootstrap host as decodes reach it (default: the URL's host)")
	fs.Str(&pub.KVEvents.Endpoint, "kv-events-endpoint", "", "without --spec: the engine's KV events PUB socket as routers reach it, "+
		"tcp://HOST:PORT (the endpoint of its --kv-events-config with the engine's host for *); routers then route by the prefixes it holds")
	fs.Str(&pub.KVEvents.ReplayEndpoint, "kv-events-replay-endpoint", "", "without --spec: the engine's KV events replay socket, tcp://HOST:PORT")
	fs.Str(&pub.KVEvents.Topic, "kv-events-topic", "", "without --spec: the topic of its --kv-events-config")
	fs.Str(&logLevel, "log-level", "info", "debug, info, warn or error")
	var pre preflightFlags
	pre.register(fs)
	fs.ConfigFile()
	if err := fs.Parse(args); err != nil {
		return err
	}
	if recomputePercent < 1 || recomputePercent > 99 {
		return cli.Usagef("invalid value %d for --recompute-percent: want 1 to 99", recomputePercent)
	}
	probe.RecomputeThreshold = float64(recomputePercent) / 100
	heal, healAlias, err := parseHeal(healSpec, &eng)
	if err != nil {
		return err
	}
	var engine agent.Engine = &eng
	switch {
	case eng.Path != "" && engineKind != "":
		return errors.New("--spec and --engine exclude each other: a spec file declares the engine, --engine reads it")
	case eng.Path == "" && engineKind == "":
		return errors.New("--spec or --engine is required")
	case eng.Path == "":
		pub.Engine, pub.URL, pub.Role = registry.Engine(engineKind), eng.EngineURL, registry.Role(role)
		p, err := agent.NewPublishedEngine(pub)
		if err != nil {
			return err
		}
		engine = p
	}
	if token == "" {
		token = legacyToken
	}
	token = cli.FirstToken(token)
	log, err := newLogger(logLevel, false)
	if err != nil {
		return err
	}
	if healAlias {
		log.Warn().Msg("--reregister-cmd is deprecated: it is the heal action exec:CMD; use --heal")
	}
	log.Info().Str("heal", heal.Kind()).Msg("heal action")
	a, err := agent.New(agent.Config{ControlPlane: controlPlane, JoinToken: token, CredentialFile: credentialFile, Probe: probe, Heal: heal}, engine, log)
	if err != nil {
		return err
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); runPreflights(pctx, &pre, a, log) }()
	defer func() {
		stop()
		select {
		case <-done:
		case <-time.After(preflightStopWait):
			log.Warn().Dur("waited", preflightStopWait).Msg("preflight worker still busy at exit; leaving it")
		}
	}()
	if err := a.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// preflightStopWait bounds how long the agent's exit waits for its
// preflight worker: a transfer library call that hangs must not keep the
// process from ending.
const preflightStopWait = 5 * time.Second

// runPreflights starts the preflight worker and runs it until ctx ends,
// beside the agent's registration and heartbeats: a worker that cannot
// start (a transport setting UCX refuses) or whose setup hangs (a wedged
// GPU in cudaMalloc, a NIXL agent that never comes up) costs the
// preflights, not the engine's place in the fleet.
func runPreflights(ctx context.Context, pre *preflightFlags, a *agent.Agent, log zerolog.Logger) {
	w, err := pre.start(a, log)
	if err != nil {
		log.Error().Err(err).Msg("preflight worker not started; this peer's pairs are not preflighted")
		return
	}
	if w == nil {
		return
	}
	defer w.close()
	log.Info().Str("backend", pre.backend).Int("max_size", pre.maxSize).Msg("preflight worker started")
	w.p.Run(ctx)
}

// parseHeal parses --heal, so that a bad value stops the agent before it
// starts. Without --heal, --reregister-cmd (deprecated) is the exec action,
// and otherwise the action is none: pdplane cannot guess how an engine is
// run. With a spec file, an exec action also gets $PDPLANE_SPEC_FILE and
// $PDPLANE_REREGISTER_REASON, as --reregister-cmd did. alias says that the
// action came from --reregister-cmd.
func parseHeal(spec string, eng *agent.SpecFileEngine) (heal agent.HealAction, alias bool, err error) {
	if spec == "" {
		spec = "none"
		if eng.ReregisterCmd != "" {
			spec, alias = "exec:"+eng.ReregisterCmd, true
		}
	}
	var opts []agent.HealOption
	if eng.Path != "" {
		path := eng.Path
		opts = append(opts, agent.WithExecEnv(func(r agent.HealRequest) []string {
			return []string{"PDPLANE_SPEC_FILE=" + path, "PDPLANE_REREGISTER_REASON=" + r.Reason}
		}))
	}
	heal, err = agent.ParseHealAction(spec, opts...)
	if err != nil {
		flag := "--heal"
		if alias {
			flag = "--reregister-cmd"
		}
		return nil, false, fmt.Errorf("%s: %w", flag, err)
	}
	return heal, alias, nil
}
