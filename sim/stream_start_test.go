package sim_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestStreamedHeadersGoOutBeforeTheWork: where the real engine returns its
// StreamingResponse as soon as the request is accepted (SGLang's /generate,
// every vLLM route), the 200 and the SSE headers reach the client while the
// engine is still waiting for its KV or computing, not with the first token.
func TestStreamedHeadersGoOutBeforeTheWork(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		engine registry.Engine
		path   string
		body   func(p *sim.Sim) string
	}{
		{"sglang decode /generate waiting for its KV", registry.EngineSGLang, "/generate", func(p *sim.Sim) string {
			return fmt.Sprintf(`{"text":"hi","stream":true,"bootstrap_host":"127.0.0.1","bootstrap_port":%d,"bootstrap_room":%d}`, p.BootstrapPort(), simtest.Room())
		}},
		{"vllm computing the prompt", registry.EngineVLLM, "/v1/chat/completions", func(*sim.Sim) string {
			return `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"stream":true}`
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The prefill never gets its leg and the prompt takes a minute
			// a token: the request holds the decode until it is cancelled.
			p, d := simtest.Pair(t, tc.engine, func(c *sim.Config) {
				c.RoomTimeout = time.Minute
				c.PrefillTimePerToken = time.Minute
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.URL()+tc.path, strings.NewReader(tc.body(p)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			if l := d.Load(); l.Running+l.Queued == 0 {
				t.Fatalf("the headers came after the work: %+v", l)
			}
			cancel()
			simtest.WaitFor(t, "the request to end", func() bool { l := d.Load(); return l.Running+l.Queued == 0 })
		})
	}
}
