package sim_test

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

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

// BenchmarkPDRequestCheap is what `pdplane bench compare` asks of the
// sims: many P/D requests at once under --cheap-transfer. cpu-µs/req is
// the whole process's CPU (both sims and the client) per request, from
// getrusage: what the sims take from a router's share of a loaded
// machine.
func BenchmarkPDRequestCheap(b *testing.B) {
	body := chatBody("a prompt of a realistic few dozen tokens", 16, false)
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		b.Run(string(engine), func(b *testing.B) {
			p, d := simtest.Pair(b, engine, func(c *sim.Config) { c.Pages, c.CheapTransfer = 4096, true })
			c := simtest.NewClient()
			ctx := context.Background()
			b.SetParallelism(16)
			before := processCPU(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					var pr, dr simtest.Response
					var err error
					if engine == registry.EngineVLLM {
						pr, dr, err = c.VLLM(ctx, p, d, "/v1/chat/completions", body)
					} else {
						pr, dr, err = c.SGLang(ctx, p, d, "/v1/chat/completions", body, simtest.Room())
					}
					if err != nil || pr.Status != http.StatusOK || dr.Status != http.StatusOK {
						b.Errorf("%v: prefill %d %s decode %d %s", err, pr.Status, pr.Body, dr.Status, dr.Body)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((processCPU(b)-before).Microseconds())/float64(b.N), "cpu-µs/req")
		})
	}
}

// processCPU is the process's user and system time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
