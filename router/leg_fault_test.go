package router_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// The reliability core's faults of one leg, each through real sims: an
// engine that answers garbage, one that accepts and never answers, and a
// prefill whose transfer stalls. Another pair could serve every request,
// so no client sees a failure, nothing but a well-formed answer reaches a
// client, and no client waits much past the leg's deadline.

const (
	chatStream = `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`
	chatUnary  = `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
)

// wantAnswer fails unless the answer is a 200 of the route's shape: SSE
// ended by [DONE] when streamed, a JSON object otherwise.
func wantAnswer(t *testing.T, what string, resp *http.Response, body []byte, stream bool) {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", what, resp.StatusCode, body)
	}
	if stream {
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Fatalf("%s: %q %q", what, resp.Header.Get("Content-Type"), body)
		}
		return
	}
	var v map[string]any
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || json.Unmarshal(body, &v) != nil {
		t.Fatalf("%s: %q %q", what, resp.Header.Get("Content-Type"), body)
	}
}

// TestGarbageIsNeverRelayed: a decode answers 200 with bytes that are
// neither JSON nor SSE. With another decode, every request is served by it
// (the garbage attempt retried, counted as a protocol failure); with none,
// the client gets the router's 502 error, never the engine's bytes.
func TestGarbageIsNeverRelayed(t *testing.T) {
	t.Parallel()
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		t.Run(string(engine), func(t *testing.T) {
			t.Parallel()
			b, _, ds := simFleet(t, engine, router.Config{}, nil)
			setFault(t, ds[0], sim.FaultGarbage)
			for i := range 4 {
				stream := i%2 == 0
				body := chatUnary
				if stream {
					body = chatStream
				}
				resp, got := b.post(t, "/v1/chat/completions", body)
				wantAnswer(t, "with a healthy decode beside it", resp, got, stream)
			}
			if n := b.metric(t, "pdplane_router_retries_total", map[string]string{"reason": "protocol"}); n == 0 {
				t.Fatal("no garbage answer was counted as a failed attempt")
			}
			setFault(t, ds[1], sim.FaultGarbage)
			for _, body := range []string{chatUnary, chatStream} {
				resp, got := b.post(t, "/v1/chat/completions", body)
				var e struct {
					Error struct{ Code string } `json:"error"`
				}
				if resp.StatusCode != http.StatusBadGateway || json.Unmarshal(got, &e) != nil || e.Error.Code != "upstream_error" {
					t.Fatalf("every decode answering garbage: %d %q, want the router's 502", resp.StatusCode, got)
				}
			}
		})
	}
}

// TestWedgedOrStalledPrefillIsCut: one of two prefills accepts and never
// answers (hang: a wedged engine, its /health too), or computes and never
// sends its KV (stall-transfer). Every request is served, none waits much
// past the prefill's deadline, and the wedged prefill's breaker counts the
// timeouts, so that it soon takes no more requests.
func TestWedgedOrStalledPrefillIsCut(t *testing.T) {
	t.Parallel()
	const deadline = 300 * time.Millisecond
	for _, fault := range []sim.Fault{sim.FaultHang, sim.FaultStallTransfer} {
		t.Run(string(fault), func(t *testing.T) {
			t.Parallel()
			p1 := simtest.Start(t, simtest.Config("p1", registry.RolePrefill, registry.EngineSGLang))
			p2 := simtest.Start(t, simtest.Config("p2", registry.RolePrefill, registry.EngineSGLang))
			dc := simtest.Config("d1", registry.RoleDecode, registry.EngineSGLang)
			dc.RoomTimeout = time.Minute // only the router's cancel frees the cut attempt's room
			d := simtest.Start(t, dc)
			b := setupSims(t, router.Config{PrefillPolicy: router.PolicyRoundRobin, PrefillTimeout: deadline, BreakerFailures: 2,
				BreakerCooldown: time.Hour}, p1, p2, d)
			setFault(t, p1, fault)
			for i := range 8 {
				start := time.Now()
				resp, got := b.post(t, "/v1/chat/completions", chatStream)
				wantAnswer(t, "a request", resp, got, true)
				// The deadline, then one attempt on the healthy pair.
				if took := time.Since(start); took > deadline+2*time.Second {
					t.Fatalf("request %d took %v, past the prefill's deadline (%v) and one retry", i, took, deadline)
				}
			}
			if got := b.metric(t, "pdplane_router_breaker_state", map[string]string{"peer": "p1"}); got != 1 {
				t.Fatalf("the wedged prefill's breaker is %v after its timeouts, want open (1)", got)
			}
			if n := b.metric(t, "pdplane_router_retries_total", map[string]string{"reason": "timeout"}); n != 2 {
				t.Fatalf("%v requests retried after the prefill's timeout, want 2 (then its breaker is open)", n)
			}
		})
	}
}
