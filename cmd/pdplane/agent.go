package main

import (
	"context"
	"errors"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
)

// runAgent registers a real engine, from its spec file (completed from the
// engine's /server_info) or, with no spec, from what the engine publishes,
// and keeps it registered.
func runAgent(ctx context.Context, args []string) error {
	var controlPlane, token, legacyToken, credentialFile, logLevel, engineKind, role string
	var eng agent.SpecFileEngine
	var pub agent.PublishedConfig
	fs := newFlagSet("agent")
	fs.str(&controlPlane, "control-plane", "http://127.0.0.1:8080", "base URL of pdplane serve, or several replicas' URLs "+
		"separated by commas: the agent uses the first that answers and fails over on connection errors and 5xx")
	fs.str(&token, "join-token", "", "join token of the control plane (or its admin token): admits the peer when it has no credential")
	fs.str(&legacyToken, "token", "", "deprecated: the same as --join-token")
	fs.str(&credentialFile, "credential-file", "", "file that keeps the peer's credential (mode 0600), so that a restarted agent re-registers at once; "+
		"without it a restarted agent waits for its old lease to run out")
	fs.str(&eng.Path, "spec", "", "JSON registration of the engine (the body of POST /api/v1/peers) written by its launcher: "+
		"KV regions, memory kinds, NIXL agents")
	fs.str(&eng.EngineURL, "engine-url", "", "the engine's HTTP URL; with --spec, fields the spec leaves empty come from its /server_info")
	fs.str(&eng.ReregisterCmd, "reregister-cmd", "", "shell command that gives the engine fresh NIXL agents and rewrites --spec; "+
		"it gets $PDPLANE_REREGISTER_REASON and $PDPLANE_SPEC_FILE")
	var probe agent.ProbeConfig
	fs.dur(&probe.Interval, "probe-interval", 0, "time between probes of the engine's /health and load; 0 follows the heartbeat interval")
	fs.dur(&probe.Timeout, "probe-timeout", agent.DefaultProbeTimeout, "time limit of each probe request to the engine")
	fs.str(&engineKind, "engine", "", "without --spec: sglang or vllm, registered from what the engine publishes "+
		"(SGLang /server_info, /get_model_info, /v1/models; vLLM /v1/models, /metrics, /version); NIXL agents and KV regions stay unknown")
	fs.str(&pub.ModelDir, "model-dir", "", "without --spec: local model directory or Hugging Face cache snapshot whose config.json "+
		"gives layers, KV heads, head dim and MLA (unknown without it)")
	fs.str(&pub.Name, "name", "", "without --spec: peer name (default: the engine URL's host:port)")
	fs.str(&role, "role", "", "without --spec: prefill, decode or both; required for vLLM, which does not publish it")
	fs.int(&pub.TPSize, "tp-size", 0, "without --spec: tensor parallel size; required for vLLM, which does not publish it")
	fs.str(&pub.BootstrapHost, "bootstrap-host", "", "without --spec: SGLang prefill bootstrap host as decodes reach it (default: the URL's host)")
	fs.str(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.parse(args); err != nil {
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
	token = firstToken(token)
	log, err := newLogger(logLevel, false)
	if err != nil {
		return err
	}
	a, err := agent.New(agent.Config{ControlPlane: controlPlane, JoinToken: token, CredentialFile: credentialFile, Probe: probe}, engine, log)
	if err != nil {
		return err
	}
	if err := a.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
