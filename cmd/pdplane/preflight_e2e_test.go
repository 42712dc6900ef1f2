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

// TestPairPreflight is issue 15's "done when": real agent processes (a
// prefill and its decodes, engines are sims) with --preflight nixl (UCX
// over TCP) and --preflight tcp; the pair to the healthy decode shows a
// passed preflight with GB/s, the pair to a broken decode turns red with
// the backend's error as its reason, and chat completions through the
// router avoid it. Broken is a probe region deregistered
// (--preflight-fault deregister-probe).
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
	cp := testControlPlane(t, "", log)

	names := []string{"p0", "good", "broken"} // the prefill, then its decodes: healthy first
	sims := map[string]*sim.Sim{}
	for _, name := range names {
		role := registry.RoleDecode
		if name == "p0" {
			role = registry.RolePrefill
		}
		sims[name] = simtest.Start(t, simtest.Config(name, role, registry.EngineSGLang))
	}
	for _, name := range names {
		args := []string{"agent", "--control-plane", cp.BaseURL, "--join-token", "peer-tok", "--engine", "sglang",
			"--engine-url", sims[name].URL(), "--name", name, "--preflight", backend, "--preflight-ucx-tls", "tcp",
			"--preflight-gap", "10ms", "--preflight-poll", "300ms", "--preflight-failed-interval", "1h", "--log-level", "debug"}
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
	waitFor(t, "every pair preflighted", 60*time.Second, func() bool {
		m := pairs()
		for _, d := range names[1:] {
			if m[d].Preflight == nil {
				return false
			}
		}
		return true
	})
	m := pairs()
	good := m["good"]
	if good.Preflight.State != "passed" || good.Preflight.Gbps <= 0 || good.Preflight.LatencyUs <= 0 || !good.Routable ||
		good.Preflight.Backend != backend || !good.Preflight.Current {
		t.Fatalf("healthy pair: %+v %+v", good, *good.Preflight)
	}
	t.Logf("%s preflight p0 -> good: %.3f GB/s, %.1f µs", backend, good.Preflight.Gbps, good.Preflight.LatencyUs)
	for _, d := range names[2:] {
		broken := m[d]
		if broken.Preflight.State != "failed" || broken.Routable || broken.Preflight.Error == "" ||
			!strings.Contains(broken.Reason, broken.Preflight.Error) {
			t.Fatalf("%s pair: %+v %+v", d, broken, *broken.Preflight)
		}
		t.Logf("%s preflight p0 -> %s: %s", backend, d, broken.Reason)
	}

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
	if g := sims["good"].Stats().Requests; g < 6 {
		t.Fatalf("the good decode served %d of 6 requests", g)
	}
	for _, d := range names[2:] {
		if n := sims[d].Stats().Requests; n != 0 {
			t.Fatalf("decode %s, whose pair failed its preflight, served %d requests", d, n)
		}
	}
}
