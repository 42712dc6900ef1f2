package router_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/router/routertest"
)

// TestMaxInflightRefusesWithRetryAfter holds one stream open at a cap of
// one: the next request is refused at once with 503, Retry-After and the
// OpenAI error code, counted under outcome max_inflight, and the slot comes
// back when the held stream ends.
func TestMaxInflightRefusesWithRetryAfter(t *testing.T) {
	t.Parallel()
	p, d := sglangPair(t)
	release := make(chan struct{})
	d.SetBehavior(routertest.Behavior{Chunks: 2, BeforeChunk: func(i int) {
		if i == 1 {
			<-release
		}
	}})
	b := setup(t, router.Config{MaxInflight: 1}, p.Peer(model), d.Peer(model))
	const body = `{"model":"test-model","messages":[{"role":"user","content":"hi"}],"stream":true}`

	held := b.send(t, context.Background(), "/v1/chat/completions", body)
	defer held.Body.Close()
	sr := &sseReader{bufio.NewReader(held.Body)}
	if c := sr.next(t); !strings.Contains(c, "d1-tok0") { // the held request is in flight
		t.Fatalf("first chunk %s", c)
	}

	resp, out := b.post(t, "/v1/completions", `{"model":"test-model","prompt":"x"}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("over the cap: status %d, Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), out)
	}
	if e := decodeError(t, out); e.Error.Code == nil || *e.Error.Code != "router_busy" || e.Error.Type != "server_error" {
		t.Fatalf("error %+v", e.Error)
	}
	if got := b.metric(t, "pdplane_router_requests_total", map[string]string{"route": "completions", "outcome": "max_inflight"}); got != 1 {
		t.Fatalf("requests_total{outcome=max_inflight} = %v, want 1", got)
	}
	if got := p.Requests(); len(got) != 1 {
		t.Fatalf("the refused request reached the prefill: %d requests", len(got))
	}

	close(release)
	for sr.next(t) != "[DONE]" {
	}
	b.waitMetric(t, "pdplane_router_inflight_requests", nil, 0)
	if resp, out := b.post(t, "/v1/completions", `{"model":"test-model","prompt":"x"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the held stream ended: status %d: %s", resp.StatusCode, out)
	}
}

// TestMaxInflightMustBePositive pins the config check.
func TestMaxInflightMustBePositive(t *testing.T) {
	t.Parallel()
	_, err := router.New(router.Config{MaxInflight: -1}, routertest.NewSnapshots(), nil, zerolog.Nop(), nil)
	if err == nil || !strings.Contains(err.Error(), "MaxInflight") {
		t.Fatalf("got %v, want an error naming MaxInflight", err)
	}
}
