package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/cli"
	"github.com/pdplane/pdplane/devfleet"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
)

func simFlags(fs *cli.FlagSet, c *sim.Config, role, engine *string) {
	fs.Str(role, "role", "prefill", "prefill or decode")
	fs.Str(engine, "engine", "sglang", "protocol to speak: sglang or vllm")
	fs.Str(&c.Name, "name", "", "engine name (default: <role>-<pid>)")
	fs.Str(&c.Model, "model", sim.DefaultModel, "served model name")
	fs.Str(&c.Addr, "sim-addr", "127.0.0.1:0", "listen address of the simulated engine")
	fs.Str(&c.Transfer, "transfer", sim.TransferTCP, "KV transfer backend: tcp or nixl")
	fs.Dur(&c.PrefillTimePerToken, "prefill-time-per-token", 0, "simulated prefill time per prompt token (the prefix cache's hits take none)")
	fs.Int(&c.PrefillSlots, "prefill-slots", 0, "prompts the engine computes at once; the others wait their turn, counted as queued in its load "+
		"(0: no limit, every prompt computes as it comes)")
	fs.Dur(&c.DecodeTimePerToken, "decode-time-per-token", 0, "simulated decode time per generated token (an SGLang decode sends its first, the prefill's, at once)")
	fs.Int(&c.Pages, "kv-pages", sim.DefaultPages, "pages in the KV pool (page_size tokens each); a request holds its prompt's pages "+
		"until its answer ends, so held streams need as many")
	fs.Int(&c.PrefixCachePages, "prefix-cache-pages", 0, "a prefill's prefix cache in pages, if fewer than --kv-pages: "+
		"a cache under pressure while the pool still fits the requests in flight (0: the whole pool)")
	fs.Int(&c.PageSize, "page-size", sim.DefaultPageSize, "tokens per KV page")
	fs.Int(&c.NumLayers, "num-layers", sim.DefaultNumLayers, "model layers: the KV pool has a K and a V region per layer")
	fs.Int(&c.NumKVHeads, "num-kv-heads", sim.DefaultNumKVHeads, "KV heads")
	fs.Int(&c.HeadDim, "head-dim", sim.DefaultHeadDim, "size of one head; with the dtype, page size, heads and layers it sets how many bytes a page moves")
	fs.Dur(&c.RoomTimeout, "room-timeout", sim.DefaultRoomTimeout, "how long either side of a transfer waits for the other "+
		"(SGLang's bootstrap and waiting timeouts, vLLM's held-blocks timeout) before failing the request")
	fs.Str(&c.KVEventsAddr, "kv-events-addr", "", "HOST:PORT where a prefill publishes its prefix cache's KV events on a ZeroMQ PUB socket, "+
		"as vLLM's --kv-events-config endpoint (port 0 picks one); empty publishes none")
	fs.Str(&c.KVEventsReplayAddr, "kv-events-replay-addr", "", "HOST:PORT of the prefill's ZeroMQ ROUTER socket that replays recent KV events "+
		"(vLLM's replay_endpoint); empty serves none")
	fs.Str(&c.KVEventsTopic, "kv-events-topic", "", "topic the KV events are published under (vLLM's topic)")
	fs.Bool(&c.CheapTransfer, "cheap-transfer", false, "keep the PD protocol (bootstrap, transfer notifications, per-token times) "+
		"but compute and verify no KV and move one page per request: for load tests where the engine must not be the bottleneck")
}

// runSim runs one simulated engine and, with --control-plane, its agent.
func runSim(ctx context.Context, args []string) error {
	var c sim.Config
	var role, engine, controlPlane, token, legacyToken, logLevel, sharedSecret, pprofAddr string
	var gcMinHeapMiB int
	fs := cli.NewFlagSet("sim")
	simFlags(fs, &c, &role, &engine)
	fs.Int(&c.BootstrapPort, "bootstrap-port", 0, "SGLang bootstrap port of a prefill (0 picks a free one)")
	fs.List(&controlPlane, "control-plane", "", "base URL of pdplane serve to register with, or several replicas' URLs "+
		"separated by commas (failover in order); empty runs the engine alone")
	fs.List(&token, "join-token", "", "join token of the control plane (or its admin token)")
	fs.DeprecatedStr(&legacyToken, "token", "join-token")
	fs.Str(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.Str(&sharedSecret, "transfer-secret", "", "without --control-plane: the TCP transfer secret (16 to 64 bytes) shared by "+
		"the sims that move KV between them, e.g. behind another router; prefer the environment variable, which ps does not show")
	gcMinHeapFlag(fs, &gcMinHeapMiB)
	fs.Str(&pprofAddr, "pprof-addr", "", "loopback HOST:PORT to serve Go runtime profiles on (/debug/pprof/), e.g. to profile the engine under a load test")
	fs.ConfigFile()
	if err := fs.Parse(args); err != nil {
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
	token = cli.FirstToken(token)
	c.Role, c.Engine = registry.Role(role), registry.Engine(engine)
	if c.Name == "" {
		c.Name = fmt.Sprintf("%s-%d", role, os.Getpid())
	}
	log, err := newLogger(logLevel, false)
	if err != nil {
		return err
	}
	stopGC, err := startGCFloorMiB(gcMinHeapMiB)
	if err != nil {
		return err
	}
	defer stopGC()
	if pprofAddr != "" {
		ps, err := startPprof(pprofAddr, log)
		if err != nil {
			return err
		}
		defer ps.Close()
	}
	e, err := devfleet.StartEngine(ctx, devfleet.EngineConfig{Sim: c, ControlPlane: controlPlane, JoinToken: token}, log)
	if err != nil {
		return err
	}
	defer e.Close()
	fmt.Fprintf(os.Stderr, "%s %s (%s) serving at %s\n", c.Name, role, engine, e.Sim().URL())
	if ep, replay := e.Sim().KVEventsEndpoints(); ep != "" {
		fmt.Fprintf(os.Stderr, "%s publishes KV events at %s (replay: %q, topic %q)\n", c.Name, ep, replay, c.KVEventsTopic)
	}
	select {
	case <-e.Done():
		err := e.Err()
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
	var prefillTime, decodeTime time.Duration
	fs := cli.NewFlagSet("dev")
	c.flags(fs)
	fs.Int(&prefills, "prefills", 1, "simulated prefill engines")
	fs.Int(&decodes, "decodes", 1, "simulated decode engines")
	fs.Str(&engine, "engine", "sglang", "protocol the simulators speak: sglang or vllm")
	fs.Str(&transferName, "transfer", sim.TransferTCP, "KV transfer backend: tcp or nixl")
	fs.Str(&model, "model", sim.DefaultModel, "model the simulators serve")
	fs.Dur(&prefillTime, "prefill-time-per-token", 0, "simulated prefill time per prompt token")
	fs.Dur(&decodeTime, "decode-time-per-token", 0, "simulated decode time per generated token (slow streams, e.g. to watch a shutdown drain)")
	if err := fs.Parse(args); err != nil {
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
	// The sims outlive the signal that ends ctx: the requests in flight
	// on them finish (within --shutdown-grace) before they close.
	fleetCtx, cancelFleet := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelFleet()
	fleet, err := devfleet.Start(fleetCtx, devfleet.Config{
		ControlPlanes: []string{cp.BaseURL}, JoinToken: c.agentToken(), Prefills: prefills, Decodes: decodes,
		Sim: sim.Config{Engine: registry.Engine(engine), Model: model, Transfer: transferName,
			PrefillTimePerToken: prefillTime, DecodeTimePerToken: decodeTime},
	}, log)
	if err != nil {
		_ = cp.hs.Close()
		cp.close()
		return err
	}
	defer fleet.Close()
	// As before: the banner comes after at most this wait, routable or not.
	_ = devfleet.WaitReady(ctx, cp.BaseURL, 10*time.Second)
	var engineList strings.Builder
	for _, e := range fleet.Engines() {
		fmt.Fprintf(&engineList, "    %-12s %s\n", e.Sim().Config().Name, e.Sim().URL())
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
	if err := cp.serveUntil(ctx); err != nil {
		return err
	}
	// One grace for both: the control plane drains first (the completions
	// it routes end on the sims), then what was sent to the sims directly.
	drain, stop := cp.drainContext()
	defer stop()
	cp.shutdown(drain)
	if cut := fleet.Shutdown(drain); cut > 0 {
		log.Warn().Int("requests_cut", cut).Str("reason", context.Cause(drain).Error()).
			Msgf("shutdown: the simulators cut %d request(s) still in flight", cut)
	}
	return nil
}
