package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
)

// specFileEngine is a real engine (SGLang, vLLM) described by a registration
// file that the engine's launcher writes: full KV geometry, NIXL agent names
// and metadata per rank. Re-registration runs the operator's command, which
// must make the engine create fresh NIXL agents and rewrite the file.
type specFileEngine struct {
	path          string
	reregisterCmd string
}

func (e *specFileEngine) Spec(context.Context) (registry.PeerSpec, error) {
	data, err := os.ReadFile(e.path)
	if err != nil {
		return registry.PeerSpec{}, fmt.Errorf("read peer spec: %w", err)
	}
	var s registry.PeerSpec
	if err := json.Unmarshal(data, &s); err != nil {
		return registry.PeerSpec{}, fmt.Errorf("parse peer spec %s: %w", e.path, err)
	}
	return s, nil
}

func (e *specFileEngine) Reregister(ctx context.Context, reason string) error {
	if e.reregisterCmd == "" {
		return errors.New("the control plane asks for re-registration with fresh NIXL agents, but no --reregister-cmd is set")
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", e.reregisterCmd)
	cmd.Env = append(os.Environ(), "PDPLANE_REREGISTER_REASON="+reason, "PDPLANE_SPEC_FILE="+e.path)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("run --reregister-cmd: %w", err)
	}
	return nil
}

func (e *specFileEngine) Load() registry.Load { return registry.Load{} }

// runAgent registers a real engine from its spec file and keeps it
// registered.
func runAgent(ctx context.Context, args []string) error {
	var controlPlane, token, specPath, reregisterCmd, logLevel string
	fs := newFlagSet("agent")
	fs.str(&controlPlane, "control-plane", "http://127.0.0.1:8080", "base URL of pdplane serve")
	fs.str(&token, "token", "", "peer token of the control plane")
	fs.str(&specPath, "spec", "", "JSON registration of the engine (the body of POST /api/v1/peers), written by its launcher")
	fs.str(&reregisterCmd, "reregister-cmd", "", "shell command that gives the engine fresh NIXL agents and rewrites --spec; "+
		"it gets $PDPLANE_REREGISTER_REASON and $PDPLANE_SPEC_FILE")
	fs.str(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.parse(args); err != nil {
		return err
	}
	if specPath == "" {
		return errors.New("--spec is required")
	}
	log, err := newLogger(logLevel, false)
	if err != nil {
		return err
	}
	a, err := agent.New(agent.Config{ControlPlane: controlPlane, Token: token},
		&specFileEngine{path: specPath, reregisterCmd: reregisterCmd}, log)
	if err != nil {
		return err
	}
	if err := a.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
