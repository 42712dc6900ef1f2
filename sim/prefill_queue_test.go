package sim_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// postOK posts body to s's path and returns the 200 answer.
func postOK(t *testing.T, s *sim.Sim, path string, body any) simtest.Response {
	t.Helper()
	r, err := simtest.NewClient().Post(context.Background(), s.URL(), path, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, r.Status, r.Body)
	}
	return r
}

// words returns n one-token words, the first-th on: " xaa xba ...".
func words(first, n int) string {
	var sb strings.Builder
	for i := range n {
		sb.WriteString(" x")
		sb.WriteString(string(rune('a' + (first+i)%26)))
		sb.WriteString(string(rune('a' + (first+i)/26%26)))
	}
	return sb.String()
}

// probe posts body to s's /_sim/cache_probe.
func probe(t *testing.T, s *sim.Sim, body any) sim.CacheProbe {
	t.Helper()
	var p sim.CacheProbe
	if err := json.Unmarshal(postOK(t, s, "/_sim/cache_probe", body).Body, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrefillQueue: with one prefill slot, a prompt computes while the
// next waits its turn, counted as queued in the load the engine publishes
// (Load, which feeds vLLM's vllm:num_requests_waiting and SGLang's
// num_waiting_reqs); a waiting request whose client leaves leaves the
// queue; the probe reads the waiting prompts and the tokens left to
// compute, less what the cache holds of each.
func TestPrefillQueue(t *testing.T) {
	t.Parallel()
	cfg := simtest.Config("p0", registry.RolePrefill, registry.EngineVLLM)
	cfg.PrefillSlots = 1
	cfg.PrefillTimePerToken = 50 * time.Millisecond
	p := simtest.Start(t, cfg)
	complete := func(ctx context.Context, prompt string) <-chan int {
		done := make(chan int, 1)
		go func() {
			r, err := simtest.NewClient().Post(ctx, p.URL(), "/v1/completions",
				map[string]any{"model": "sim-model", "prompt": prompt, "max_tokens": 1}, nil)
			if err != nil {
				done <- 0
				return
			}
			done <- r.Status
		}()
		return done
	}
	warm := words(0, 12) // 13 tokens, 12 of them cached once computed
	if status := <-complete(context.Background(), warm); status != http.StatusOK {
		t.Fatalf("warming the cache: %d", status)
	}

	long, stopLong := context.WithCancel(context.Background())
	defer stopLong()
	longDone := complete(long, words(50, 199)) // 200 tokens: 10 s of compute
	simtest.WaitFor(t, "the long prompt computing", func() bool {
		pr := probe(t, p, map[string]any{"prompt": "x"})
		return pr.QueuedRequests == 0 && pr.QueuedComputeTokens == 200
	})
	leaving, leave := context.WithCancel(context.Background())
	leftDone := complete(leaving, words(300, 9)) // 10 tokens, none cached
	simtest.WaitFor(t, "a prompt waiting", func() bool { return p.Load().Queued == 1 })
	warmDone := complete(context.Background(), warm)
	simtest.WaitFor(t, "two prompts waiting", func() bool { return p.Load().Queued == 2 })
	if pr := probe(t, p, map[string]any{"prompt": warm}); pr.QueuedRequests != 2 || pr.QueuedComputeTokens != 200+10+1 ||
		pr.PromptTokens != 13 || pr.CachedTokens != 12 {
		t.Errorf("the probe with two prompts waiting behind one: %+v, want 2 waiting, 211 tokens to compute", pr)
	}
	if l := p.Load(); l.Running != 1 {
		t.Errorf("load %+v, want the computing request running", l)
	}

	leave()
	<-leftDone
	simtest.WaitFor(t, "the cancelled prompt out of the queue", func() bool {
		pr := probe(t, p, map[string]any{"prompt": "x"})
		return pr.QueuedRequests == 1 && pr.QueuedComputeTokens == 201 && p.Load().Queued == 1
	})
	stopLong()
	<-longDone
	if status := <-warmDone; status != http.StatusOK {
		t.Fatalf("the queued prompt after the long one left: %d", status)
	}
	if pr := probe(t, p, map[string]any{"prompt": "x"}); pr.QueuedRequests != 0 || pr.QueuedComputeTokens != 0 || p.Load().Queued != 0 {
		t.Errorf("an idle engine: %+v, load %+v", pr, p.Load())
	}
}

// metricsOf reads s's GET /metrics.
func metricsOf(t *testing.T, s *sim.Sim) string {
	t.Helper()
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// TestPrefixCacheMetrics: the cache's hits are counted in the engines'
// own metrics: vLLM's vllm:prefix_cache_queries and
// vllm:prefix_cache_hits counters in tokens, and the cached source of
// vllm:prompt_tokens_by_source (vllm/v1/metrics/loggers.py
// PrometheusStatLogger, prometheus_client adding _total); SGLang's
// sglang:cache_hit_rate gauge, the last prefill's share
// (managers/scheduler_metrics_mixin.py log_prefill_stats,
// metrics/collector.py), also in /v1/loads; and /_sim/stats.
func TestPrefixCacheMetrics(t *testing.T) {
	t.Parallel()
	prompt := words(0, 12) // 13 tokens
	body := map[string]any{"model": "sim-model", "prompt": prompt, "max_tokens": 1}

	p := simtest.Start(t, simtest.Config("p0", registry.RolePrefill, registry.EngineVLLM))
	postOK(t, p, "/v1/completions", body)
	postOK(t, p, "/v1/completions", body)
	m := metricsOf(t, p)
	for _, want := range []string{
		"# TYPE vllm:prefix_cache_queries_total counter\n",
		`vllm:prefix_cache_queries_total{engine="0",model_name="sim-model"} 26.0` + "\n",
		"# TYPE vllm:prefix_cache_hits_total counter\n",
		`vllm:prefix_cache_hits_total{engine="0",model_name="sim-model"} 12.0` + "\n",
		`vllm:prompt_tokens_by_source_total{engine="0",model_name="sim-model",source="local_compute"} 14.0` + "\n",
		`vllm:prompt_tokens_by_source_total{engine="0",model_name="sim-model",source="local_cache_hit"} 12.0` + "\n",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("vLLM's /metrics has no %q:\n%s", want, m)
		}
	}
	if st := p.Stats(); st.PromptTokens != 26 || st.CachedPromptTokens != 12 {
		t.Errorf("stats: %d prompt tokens, %d cached; want 26 and 12", st.PromptTokens, st.CachedPromptTokens)
	}
	var stats map[string]any
	if getJSON(t, p.URL()+"/_sim/stats", &stats) != http.StatusOK || stats["prompt_tokens"] != 26.0 || stats["cached_prompt_tokens"] != 12.0 {
		t.Errorf("/_sim/stats: %v", stats)
	}

	sp, sd := simtest.Pair(t, registry.EngineSGLang, nil)
	c := simtest.NewClient()
	for range 2 {
		pr, dr, err := c.SGLang(context.Background(), sp, sd, "/v1/completions", body, simtest.Room())
		if err != nil || pr.Status != http.StatusOK || dr.Status != http.StatusOK {
			t.Fatalf("SGLang PD completion: %v %d %d", err, pr.Status, dr.Status)
		}
	}
	want := `sglang:cache_hit_rate{model_name="sim-model",engine_type="prefill",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0.9230769230769231` + "\n"
	if m := metricsOf(t, sp); !strings.Contains(m, "# TYPE sglang:cache_hit_rate gauge\n") || !strings.Contains(m, want) {
		t.Errorf("SGLang's /metrics has no %q:\n%s", want, m)
	}
	var loads struct {
		Loads []struct {
			CacheHitRate float64 `json:"cache_hit_rate"`
		} `json:"loads"`
	}
	if getJSON(t, sp.URL()+"/v1/loads", &loads) != http.StatusOK || len(loads.Loads) != 1 || loads.Loads[0].CacheHitRate != 12.0/13 {
		t.Errorf("/v1/loads: %+v", loads)
	}
	if st := sd.Stats(); st.PromptTokens != 0 || st.CachedPromptTokens != 0 {
		t.Errorf("a decode keeps no prefix cache: %+v", st)
	}
}
