package sim_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// BenchmarkPDRequest is one P/D request through two sims (TCP backend, no
// per-token pauses): for SGLang both legs at once with a fresh room, for
// vLLM the prefill then the decode. It bounds what the simulator itself
// costs when it stands in for engines in the router's benchmarks.
func BenchmarkPDRequest(b *testing.B) {
	body := chatBody("a prompt of a realistic few dozen tokens, so that the KV spans several pages of the pool and the transfer moves real bytes", 8, false)
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		b.Run(string(engine), func(b *testing.B) {
			p, d := simtest.Pair(b, engine, func(c *sim.Config) { c.Pages = 1024 })
			c := simtest.NewClient()
			ctx := context.Background()
			run := func() (simtest.Response, simtest.Response, error) {
				if engine == registry.EngineVLLM {
					return c.VLLM(ctx, p, d, "/v1/chat/completions", body)
				}
				return c.SGLang(ctx, p, d, "/v1/chat/completions", body, simtest.Room())
			}
			for b.Loop() {
				pr, dr, err := run()
				if err != nil || pr.Status != http.StatusOK || dr.Status != http.StatusOK {
					b.Fatalf("%v: prefill %d %s decode %d %s", err, pr.Status, pr.Body, dr.Status, dr.Body)
				}
			}
			b.ReportMetric(float64(d.Stats().BytesMoved)/float64(d.Stats().Transfers), "KVbytes/req")
		})
	}
}
