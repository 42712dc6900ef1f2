package router_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestMaxInflightRefusesWithRetryAfter holds one long stream open at a cap
// of one: the next request is refused at once with 503, Retry-After and the
// OpenAI error code, counted under outcome max_inflight, and the slot comes
// back when the held stream ends.
func TestMaxInflightRefusesWithRetryAfter(t *testing.T) {
	t.Parallel()
	// 10 ms a token: the held request's 4096 tokens would take 40 s.
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = 10 * time.Millisecond })
	b := setupSims(t, router.Config{MaxInflight: 1}, p, d)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := b.send(t, ctx, "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4096,"stream":true}`)
	defer held.Body.Close()
	sr := &sseReader{bufio.NewReader(held.Body)}
	if c := sr.next(t); !strings.Contains(c, "chat.completion.chunk") { // the held request is in flight
		t.Fatalf("first chunk %s", c)
	}

	resp, out := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":1}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("over the cap: status %d, Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), out)
	}
	if e := decodeError(t, out); e.Error.Code == nil || *e.Error.Code != "router_busy" || e.Error.Type != "server_error" {
		t.Fatalf("error %+v", e.Error)
	}
	if got := b.metric(t, "pdplane_router_requests_total", map[string]string{"route": "completions", "outcome": "max_inflight"}); got != 1 {
		t.Fatalf("requests_total{outcome=max_inflight} = %v, want 1", got)
	}
	if n := p.Stats().Requests; n != 1 {
		t.Fatalf("the refused request reached the prefill: %d requests", n)
	}

	// The client leaves the held stream.
	cancel()
	b.waitMetric(t, "pdplane_router_inflight_requests", nil, 0)
	if resp, out := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":1}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the held stream ended: status %d: %s", resp.StatusCode, out)
	}
}

// TestMaxInflightMustBePositive pins the config check.
func TestMaxInflightMustBePositive(t *testing.T) {
	t.Parallel()
	_, err := router.New(router.Config{MaxInflight: -1}, newTestRegistry(t).mirror, nil, zerolog.Nop(), nil)
	if err == nil || !strings.Contains(err.Error(), "MaxInflight") {
		t.Fatalf("got %v, want an error naming MaxInflight", err)
	}
}
