package router_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// simFleet starts one prefill and two decodes of engine as simulated
// engines (real protocols, real KV moved) and a router over them that
// takes decodes in turn. adjust, when set, changes decode-0's config.
func simFleet(t *testing.T, engine registry.Engine, cfg router.Config, adjust func(*sim.Config)) (*bundle, *sim.Sim, []*sim.Sim) {
	t.Helper()
	p := simtest.Start(t, simtest.Config("prefill-0", registry.RolePrefill, engine))
	dc := simtest.Config("decode-0", registry.RoleDecode, engine)
	if adjust != nil {
		adjust(&dc)
	}
	ds := []*sim.Sim{simtest.Start(t, dc), simtest.Start(t, simtest.Config("decode-1", registry.RoleDecode, engine))}
	cfg.DecodePolicy = router.PolicyRoundRobin
	return setupSims(t, cfg, append([]*sim.Sim{p}, ds...)...), p, ds
}

// TestSGLangMemKindFailureFormats is the memory-kind failure injected on a
// decode, in each of the three forms SGLang reports it (the simulator
// produces them; pdproto pins them against SGLang's sources): a 500 body
// (not streamed), an error event after 200 (OpenAI stream), an abort
// event after 200 (/generate stream). In each, no client sees the failure,
// the decode is reported stale, and the traffic is served by the other
// decode.
func TestSGLangMemKindFailureFormats(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, path, body string
		stream           bool
	}{
		{"non-stream", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":3}`, false},
		{"openai stream", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":3,"stream":true}`, true},
		{"generate stream", "/generate", `{"text":"hello","sampling_params":{"max_new_tokens":3},"stream":true}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, p, ds := simFleet(t, registry.EngineSGLang, router.Config{}, nil)
			if err := ds[0].SetFault(sim.FaultMissingMemKind); err != nil {
				t.Fatal(err)
			}
			// Round robin takes decode-0 within the first two requests.
			for i := range 4 {
				resp, body := b.post(t, tc.path, tc.body)
				if resp.StatusCode != http.StatusOK || strings.Contains(string(body), "Missing NIXL") ||
					strings.Contains(string(body), `"error"`) || strings.Contains(string(body), `"abort"`) {
					t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
				}
				if tc.stream && !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
					t.Fatalf("request %d: stream not ended: %s", i, body)
				}
			}
			if n := p.Stats().MissingMemKind; n != 1 {
				t.Fatalf("the prefill raised the memory-kind error %d times, want 1", n)
			}
			m := b.reg.waitStale(t, "decode-0")
			if !strings.Contains(m.Error, "Missing NIXL destination KV memory kind") {
				t.Fatalf("stale mark %+v", m)
			}
			if got := b.metric(t, "pdplane_router_retries_total", map[string]string{"reason": "missing_mem_kind"}); got != 1 {
				t.Fatalf("memory-kind retries %v", got)
			}
			if s := ds[1].Stats(); s.Transfers < 4 {
				t.Fatalf("decode-1 served %d transfers of 4 requests", s.Transfers)
			}
		})
	}
}

// TestDecodeFirstByteDeadline: a streamed decode that stays silent after its
// prefill succeeded (here, a vLLM decode that takes a minute a token: it
// computes its first token, where an SGLang decode sends the prefill's at
// once) is cut at the router's deadline; the request is served by another
// pair and the pair takes the failure.
func TestDecodeFirstByteDeadline(t *testing.T) {
	t.Parallel()
	b, _, ds := simFleet(t, registry.EngineVLLM, router.Config{DecodeFirstByteTimeout: time.Second},
		func(c *sim.Config) { c.DecodeTimePerToken = time.Minute })
	for i := range 2 {
		// Bounded, so that a router without the deadline fails the test
		// instead of hanging it.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp := b.send(t, ctx, "/v1/completions", `{"model":"sim-model","prompt":"hello","max_tokens":2,"stream":true}`)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Fatalf("request %d: %v %d %s", i, err, resp.StatusCode, body)
		}
	}
	// Every request decode-0 took (its KV arrived, then it stayed silent)
	// was cut and retried as a failure of the pair.
	st := ds[0].Stats()
	if got := b.metric(t, "pdplane_router_retries_total", map[string]string{"reason": "pair"}); st.Requests == 0 || got != float64(st.Requests) || st.Transfers != st.Requests {
		t.Fatalf("%v pair retries; decode-0 stats %+v", got, st)
	}
	simtest.WaitFor(t, "decode-0 let go of the cut request", func() bool { return ds[0].Load().Running == 0 })
}

// TestVLLMDecodeFailureFromTheSimulator: a vLLM decode whose KV load fails
// answers vLLM's error ("Internal server error" under
// kv_load_failure_policy=fail: vllm entrypoints/openai/engine/serving.py
// _raise_if_error); the router moves the request to the other decode, the
// pair (not the decode's breaker) takes the failure, and the failure is
// reported to the registry, whose rule starts the decode's heal (its only
// prefill cannot reach it; a real vLLM decode that cached a restarted
// prefill's NIXL agent fails this way until it restarts: realengine's
// heal step). It is never counted as SGLang's memory-kind error.
func TestVLLMDecodeFailureFromTheSimulator(t *testing.T) {
	t.Parallel()
	b, _, ds := simFleet(t, registry.EngineVLLM, router.Config{Replica: "r7"}, nil)
	if err := ds[0].SetFault(sim.FaultMissingMemKind); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":2}`,
		`{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":2,"stream":true}`,
	} {
		for i := range 2 {
			resp, out := b.post(t, "/v1/chat/completions", body)
			if resp.StatusCode != http.StatusOK || strings.Contains(string(out), `"error"`) {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, out)
			}
		}
	}
	if got := b.metric(t, "pdplane_router_retries_total", map[string]string{"reason": "pair"}); got < 1 {
		t.Fatalf("pair retries %v", got)
	}
	if got := b.metric(t, "pdplane_router_stale_marks_total", map[string]string{"cause": "missing_mem_kind"}); got != 0 {
		t.Fatalf("stale marks %v", got)
	}
	if got := b.metric(t, "pdplane_router_breaker_state", map[string]string{"peer": "decode-0"}); got != 0 {
		t.Fatalf("decode-0's own breaker moved (%v); the failure is the pair's", got)
	}
	m := b.reg.waitStale(t, "decode-0")
	if !strings.Contains(m.Message, "could not load the KV of prefill prefill-0") || !strings.Contains(m.Message, "(reported by router:r7)") ||
		!strings.Contains(m.Error, pdproto.VLLMGenerationError) {
		t.Fatalf("stale mark %+v", m)
	}
	b.waitMetric(t, "pdplane_router_stale_marks_total", map[string]string{"cause": "kv_load"}, 1)
}

func TestDecodeFirstByteTimeoutConfig(t *testing.T) {
	t.Parallel()
	if got := (router.Config{}).WithDefaults().DecodeFirstByteTimeout; got != router.DefaultDecodeFirstByteTimeout {
		t.Fatalf("default %s", got)
	}
	_, err := router.New(router.Config{DecodeFirstByteTimeout: -time.Second}, newTestRegistry(t).mirror, nil,
		zerolog.New(zerolog.NewTestWriter(t)), prometheus.NewRegistry())
	if err == nil || !strings.Contains(err.Error(), "DecodeFirstByteTimeout") {
		t.Fatalf("negative timeout: %v", err)
	}
}
