package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

// TestPairPreflight is issue 15's "done when": three real agent processes
// (a prefill and two decodes, engines are sims) with --preflight nixl (UCX
// over TCP) and --preflight tcp; the pair to the healthy decode shows a
// passed preflight with GB/s, the pair to the decode whose probe region is
// deregistered turns red with the backend's error as its reason, and
// chat completions through the router avoid that decode.
func TestPairPreflight(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"tcp", "nixl"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			var env []string
			if backend == "nixl" {
				transfertest.RequireNIXL(t)
				env = []string{"PDPLANE_NIXL_LIB=" + os.Getenv("PDPLANE_NIXL_LIB"), "UCX_NET_DEVICES=lo"}
			}
			testPairPreflight(t, backend, env)
		})
	}
}

type preflightPair struct {
	Prefill, Decode struct{ Name string }
	Routable        bool
	Reason          string
	Preflight       *struct {
		State     string
		Backend   string
		Gbps      float64
		LatencyUs float64 `json:"latency_us"`
		Error     string
		Current   bool
	}
}

func testPairPreflight(t *testing.T, backend string, env []string) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	cp, err := startControlPlane(ctx, serveConfig{
		addr: "127.0.0.1:0", joinTokens: "peer-tok", adminToken: "admin-tok",
		heartbeat: registry.DefaultHeartbeatInterval, leaseTTL: registry.DefaultLeaseTTL,
		prefillPolicy: "round_robin", decodePolicy: "round_robin",
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- cp.wait(ctx) }()
	t.Cleanup(func() { cancel(); <-errc })

	sims := map[string]*sim.Sim{}
	for _, c := range []sim.Config{
		simtest.Config("p0", registry.RolePrefill, registry.EngineSGLang),
		simtest.Config("good", registry.RoleDecode, registry.EngineSGLang),
		simtest.Config("broken", registry.RoleDecode, registry.EngineSGLang),
	} {
		sims[c.Name] = simtest.Start(t, c)
	}
	for _, name := range []string{"p0", "good", "broken"} {
		args := []string{"agent", "--control-plane", cp.BaseURL, "--join-token", "peer-tok", "--engine", "sglang",
			"--engine-url", sims[name].URL(), "--name", name, "--preflight", backend, "--preflight-ucx-tls", "tcp",
			"--preflight-gap", "10ms", "--preflight-failed-interval", "1h", "--log-level", "debug"}
		if name == "broken" {
			args = append(args, "--preflight-fault", "deregister-probe")
		}
		startProcessEnv(t, "agent-"+name, env, args...)
	}

	pairs := func() map[string]preflightPair {
		var out struct{ Pairs []preflightPair }
		getJSON(t, cp.BaseURL+"/api/v1/pairs", &out)
		m := map[string]preflightPair{}
		for _, p := range out.Pairs {
			m[p.Decode.Name] = p
		}
		return m
	}
	waitFor(t, "both pairs preflighted", 60*time.Second, func() bool {
		m := pairs()
		return m["good"].Preflight != nil && m["broken"].Preflight != nil
	})
	m := pairs()
	good, broken := m["good"], m["broken"]
	if good.Preflight.State != "passed" || good.Preflight.Gbps <= 0 || good.Preflight.LatencyUs <= 0 || !good.Routable ||
		good.Preflight.Backend != backend || !good.Preflight.Current {
		t.Fatalf("healthy pair: %+v %+v", good, *good.Preflight)
	}
	if broken.Preflight.State != "failed" || broken.Routable || broken.Preflight.Error == "" ||
		!strings.Contains(broken.Reason, broken.Preflight.Error) {
		t.Fatalf("broken pair: %+v %+v", broken, *broken.Preflight)
	}
	t.Logf("%s preflight p0 -> good: %.3f GB/s, %.1f µs; p0 -> broken: %s", backend, good.Preflight.Gbps, good.Preflight.LatencyUs, broken.Reason)

	client := openai.NewClient(option.WithBaseURL(cp.BaseURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	for i := 0; i < 6; i++ {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := client.Chat.Completions.New(cctx, openai.ChatCompletionNewParams{
			Model: "sim-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			MaxTokens: openai.Int(2),
		})
		ccancel()
		if err != nil {
			t.Fatalf("chat completion %d: %v", i, err)
		}
	}
	if g, b := sims["good"].Stats().Requests, sims["broken"].Stats().Requests; g < 6 || b != 0 {
		t.Fatalf("decode requests: good %d, broken %d; want every one on the good decode", g, b)
	}
}
